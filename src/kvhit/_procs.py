"""Process hygiene for the worker pools kvhit forks (``kvhit sweep -j``, ``kvhit reproduce -j``, ShareGPT
tokenisation).

Invariant: a worker forked from a kvhit process takes SIGTERM's *default* action (death), whatever handler the parent
installed. The command line installs one (:func:`kvhit.service.io.install_signal_handlers`: SIGTERM raises
``SystemExit`` so temporaries are removed), and a forked worker inherits it; ``multiprocessing`` stops a pool's
workers with SIGTERM (``Pool.terminate``, which ``with Pool(...)`` calls on exit, and ``ProcessPoolExecutor`` on a
broken pool) and expects them to die at once. With the inherited handler a worker instead raises inside the pool's
shared queue locks, and the pool can hang for good: reproduced with a fork ``Pool`` of 2 used in a loop under that
handler (stuck after 78–88 pools, the parent in ``join``, a worker blocked on the queue's lock — what a ``make test``
run showed, 2026-12-03), and 300 pools in 2.8 s once the workers reset SIGTERM (``tests/test_procs.py``).

Not covered: spawned workers (the web planner's pools, Ray) start a fresh interpreter with default handlers.
"""

from __future__ import annotations

import signal

__all__ = ["default_sigterm"]


def default_sigterm() -> None:
    """SIGTERM back to its default action in this (forked worker) process; call first thing in a pool initializer,
    never in the process that owns the command line's handler."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # pragma: no cover - not the main thread (a worker's initializer runs in its main thread)
        pass
