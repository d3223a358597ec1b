"""The engine's own clock from a vLLM server's log: when each request was handed to the engine core.

vLLM 0.32.0's front end (``vllm/v1/engine/async_llm.py`` ``AsyncLLM._add_request``), started with
``--enable-log-requests``, logs ``Added request <id>.`` right after it has sent the request to the engine core
(``engine_core.add_request_async``): past the HTTP server, the request parsing and the input processing, i.e.
without the HTTP way in that a client's send time includes. With a logging configuration that stamps each line
with its Unix time (``VLLM_LOGGING_CONFIG_PATH`` = ``live/vllm_logging.json``, format ``%(created).6f …``), that
line is a wall-clock anchor per request on the server's side; the server's per-request durations
(``--enable-per-request-metrics``: queue, first token, generation) then place each request's arrival, first
token and last token on one server clock (:func:`kvhit.replay.check.simulate_recorded_scheduler`,
``server_added``).

Ids: the completions server names a request ``cmpl-<X-Request-Id>`` (its response ``id``; a random id without
the header), the prompt's index ``-0`` is appended, and the input processor appends ``-`` and 8 random hex digits
(``input_processor.py``: ``f"{external_req_id}-{random_uuid():.8}"``): ``Added request cmpl-kvhit-…-17-0-1a2b3c4d.``
belongs to the response whose ``id`` is ``cmpl-kvhit-…-17``.

Invariant: a line that contains ``Added request`` either parses (a Unix time at the start of the line, an id at
the end) or is refused with its file and line number; every id asked for is found exactly once, or refused with
the file and the request. Lines without ``Added request`` are ignored (a server log holds much else).

Not modelled: the time between this log line and the engine core queueing the request (``queued_ts``: the engine
core drains its input queue between steps, so up to one step later; plus the front end's own event-loop delay
before the line is written). The engine core's ``queued_ts``/``scheduled_ts`` are monotonic-clock values the server
does not return, so this line is the closest wall-clock anchor the server exposes without a patch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["ServerLogError", "added_times", "anchor_times", "external_id", "iteration_times"]

_MARK = "Added request "
_LINE = re.compile(r"^\s*(\d+\.\d+)\s.*?Added request (\S+?)\.\s*$")
_SUFFIX = re.compile(r"^(.+)-\d+-[0-9a-f]{8}$")


class ServerLogError(ValueError):
    """A server log that cannot give the anchors asked for (the message names the file and the line)."""


def external_id(internal: str) -> str:
    """The response ``id`` of an engine request id: ``cmpl-X-0-1a2b3c4d`` → ``cmpl-X`` (unchanged if it has no
    ``-<index>-<8 hex>`` suffix)."""
    m = _SUFFIX.match(internal)
    return m.group(1) if m else internal


def added_times(path) -> dict[str, float]:
    """``{response id: Unix time of its "Added request" line}`` over the whole log ``path``."""
    p = Path(path)
    try:
        fh = p.open(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ServerLogError(f"--server-log {p}: cannot be read ({e.strerror or e})") from None
    out: dict[str, float] = {}
    where: dict[str, int] = {}
    with fh:
        for i, line in enumerate(fh, 1):
            if _MARK not in line:
                continue
            m = _LINE.match(line)
            if m is None:
                raise ServerLogError(
                    f"--server-log {p}, line {i}: an 'Added request' line without a Unix time at its start "
                    f"({line.strip()[:100]!r}); start the server with VLLM_LOGGING_CONFIG_PATH=live/vllm_logging.json"
                )
            t = float(m.group(1))
            if not math.isfinite(t):
                raise ServerLogError(f"--server-log {p}, line {i}: the time {m.group(1)!r} is not finite")
            rid = external_id(m.group(2))
            if rid in out:
                raise ServerLogError(
                    f"--server-log {p}, line {i}: request {rid} was already added at line {where[rid]} "
                    "(one server log per server, ids unique per replay)"
                )
            out[rid] = t
            where[rid] = i
    return out


def anchor_times(path, response_ids: Sequence[str | None]) -> np.ndarray:
    """Per request, the Unix time of its ``Added request`` line in ``path`` (NaN where ``response_ids[r]`` is None:
    a request that was not answered). A response id missing from the log is refused, naming the file and the
    request."""
    table = added_times(path)
    out = np.full(len(response_ids), np.nan)
    for r, rid in enumerate(response_ids):
        if rid is None:
            continue
        t = table.get(str(rid))
        if t is None:
            hint = (
                "no 'Added request' line at all: start the server with --enable-log-requests"
                if not table
                else "is it the log of the server this replay ran against?"
            )
            raise ServerLogError(f"--server-log {path}: no 'Added request' line for request {r} (id {rid}); {hint}")
        out[r] = t
    return out


_ITER = re.compile(r"^\s*(\d+\.\d+)\s.*?Iteration\((\d+)\): ")


def iteration_times(path) -> np.ndarray:
    """Unix times of the ``Iteration(i): …`` lines of ``path`` in log order — one per engine step that scheduled
    tokens, logged by the front end as the step's output reaches it (vLLM 0.32.0 with
    ``--enable-logging-iteration-details``: ``v1/engine/core.py`` ``capture_iteration_details``,
    ``v1/metrics/loggers.py`` ``_log_iteration_details``). A line with the marker but no Unix time, or an index
    that does not follow the previous one, is refused with the file and line; a log with none is refused."""
    p = Path(path)
    try:
        fh = p.open(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ServerLogError(f"--server-log {p}: cannot be read ({e.strerror or e})") from None
    out: list[float] = []
    last = -1
    with fh:
        for i, line in enumerate(fh, 1):
            if "Iteration(" not in line:
                continue
            m = _ITER.match(line)
            if m is None:
                raise ServerLogError(
                    f"--server-log {p}, line {i}: an 'Iteration(…)' line without a Unix time at its start; start the "
                    "server with VLLM_LOGGING_CONFIG_PATH=live/vllm_logging.json"
                )
            k = int(m.group(2))
            if k != last + 1 and not (k == 0 and last >= 0):
                raise ServerLogError(f"--server-log {p}, line {i}: Iteration({k}) after Iteration({last})")
            last = k
            out.append(float(m.group(1)))
    if not out:
        raise ServerLogError(
            f"--server-log {p}: no 'Iteration(…)' line: start the server with --enable-logging-iteration-details"
        )
    return np.asarray(out, np.float64)
