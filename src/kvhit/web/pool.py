"""The API worker pool of ``kvhit serve --api-workers N``: processes answering the synchronous commands (estimate,
kv, plan's closed form) in parallel, so that concurrent clients are not queued on one interpreter's lock.

Invariant: every worker process is started by the pool's own *owner thread*, which lives as long as the pool. A
worker asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``, :func:`kvhit.service.io.die_with_parent`),
and Linux delivers that signal when the **thread** that started the worker ends, not the process: workers started
from a short-lived thread (the warm-up thread of the code before) were SIGKILLed the moment that thread returned,
the pool broke, and every request fell back to the server's own interpreter while ``/api/health`` said the pool
was ready. The owner thread starts and warms all ``N`` workers (one warm-up answer each), marks the pool ready, and
watches; when a worker dies (OOM killer, a crash: seen within a second, or by a request that finds the pool broken)
it replaces the pool with a new warmed one. Until the pool is ready the server answers in its own threads, so no
request waits for a start-up.

NOT modelled here: the answers themselves (the service layer's); a worker's memory (the service's memory rule).
"""

from __future__ import annotations

import collections
import os
import threading
from concurrent.futures import Future
from typing import Any

__all__ = ["ApiPool", "answer"]

#: The warm-up answer each worker gives before the pool takes requests (imports and first compilations).
WARM = ("kv", {"model": "qwen3-8b", "kv_gb": 1.0})


def answer(command: str, fields: dict) -> tuple[int, bytes]:
    """One synchronous answer as compact strict JSON bytes, and the process that computed it (a worker's pid)."""
    from kvhit.service.registry import run

    return os.getpid(), run(command, fields).to_json_bytes()


#: Answered once by every worker as it starts (its initializer), before the pool takes requests: the page's slider
#: request — kv, the estimate and the closed-form plan — whose first answer in a fresh interpreter takes ~0.5 s
#: (imports, first compilations); without it each worker's first slider move paid that (measured 470–500 ms).
WARM_SLIDER = {
    "N": [100, 1000, 10000],
    "kv_gb": 40.0,
    "target": 0.3,
    **{"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0},
}


def _init() -> None:
    import contextlib

    from kvhit.service.io import die_with_parent

    die_with_parent()
    from kvhit.service.registry import run

    with contextlib.suppress(Exception):  # a warm-up that fails leaves a cold worker, never a broken pool
        run("planner", WARM_SLIDER).to_json_bytes()


class ApiPool:
    """``workers`` spawned processes behind one owner thread (see the module docstring); :meth:`submit` is called
    from the server's event loop, never starts a process, and raises ``BrokenProcessPool`` when the pool is not
    usable (the caller answers in-process)."""

    def __init__(self, workers: int, retry_s: float = 5.0) -> None:
        self.workers = workers
        self.retry_s = retry_s
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a request saw the pool broken, or close()
        self._lock = threading.Lock()
        self._pool = None
        self.generation = 0  # pools started so far (1 after the first start; more after replacements)
        self.pids: list[int] = []  # the current pool's workers
        self.answered: collections.Counter[int] = collections.Counter()  # answers per process id (server's too)
        self._thread: threading.Thread | None = None

    # -- owner thread -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._own, name="kvhit-api-pool", daemon=True)
        self._thread.start()

    def _own(self) -> None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        while not self._stop.is_set():
            pool = ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"), initializer=_init)
            try:
                # N submissions before any can finish (a spawned interpreter takes > 0.1 s to start): each starts
                # one worker, here, in the owner thread; the pool never starts another.
                futs = [pool.submit(answer, *WARM) for _ in range(self.workers)]
                pids = sorted({f.result()[0] for f in futs})
                procs = getattr(pool, "_processes", None) or {}
                pids = sorted(procs) or pids
            except Exception:  # a worker died while warming: try again (a fresh pool) after a pause
                pool.shutdown(wait=False, cancel_futures=True)
                self._stop.wait(self.retry_s)
                continue
            with self._lock:
                self._pool, self.pids = pool, pids
                self.generation += 1
                self._wake.clear()
                self.ready.set()
            while not self._wake.wait(1.0):  # until close(), a request finds the pool broken, or a worker died
                alive = {p.pid for p in mp.active_children()}
                if not set(pids) <= alive:
                    break
            with self._lock:
                self.ready.clear()
                self._pool, self.pids = None, []
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- requests ---------------------------------------------------------------------------------------------
    def submit(self, command: str, fields: dict) -> Future:
        from concurrent.futures.process import BrokenProcessPool

        with self._lock:
            pool = self._pool if self.ready.is_set() else None
        if pool is None:
            raise BrokenProcessPool("the API worker pool is not ready")
        try:
            return pool.submit(answer, command, fields)
        except BrokenProcessPool:
            self.broken(pool)
            raise

    def broken(self, pool: Any = None) -> None:
        """A request found the pool broken (a worker died): the owner thread replaces it."""
        with self._lock:
            if pool is not None and pool is not self._pool:
                return  # already replaced
            self.ready.clear()
        self._wake.set()

    def current(self) -> Any:
        with self._lock:
            return self._pool

    def count(self, pid: int) -> None:
        with self._lock:
            self.answered[pid] += 1

    def view(self) -> dict[str, Any]:
        with self._lock:
            return {
                "api_workers": self.workers,
                "api_workers_ready": self.ready.is_set(),
                "api_worker_pids": list(self.pids),
                "api_pool_generation": self.generation,
                "answered_by": {str(p): n for p, n in sorted(self.answered.items())},
            }
