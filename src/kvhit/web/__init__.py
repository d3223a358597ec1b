"""kvhit's web front end (issue 14): ``kvhit serve`` — a JSON API over :mod:`kvhit.service` and an interactive
planner page, one FastAPI app (:func:`create_app`).

Invariant: no domain logic or validation lives here — requests are the service layer's request models, answers
its response objects; this package adds transport (HTTP, uploads, size limits), jobs (worker processes with
progress and cancellation, :mod:`kvhit.web.jobs`) and the page (``static/``: hand-written HTML/JS with Plotly.js
served from the ``plotly`` package, no CDN). NOT modelled: authentication, persistence (jobs and caches live in
the server's memory, bounded).
"""

from kvhit.web.app import create_app

__all__ = ["create_app"]
