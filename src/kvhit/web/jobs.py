"""Long requests (simulations, curves, trace statistics, tier sweeps) as jobs: each runs in its own worker
process, at most ``workers`` at a time, with a job id, progress, cancellation and a result cache keyed by the
hash of its inputs.

Invariant: the server's event loop never runs a job — a job is a separate (spawned) process that the server
only watches through a pipe, so a job can be cancelled at any time (the process is terminated) and its memory is
returned when it ends; uploaded input files of a job are deleted when the job ends, however it ends; finished
jobs and cached results are bounded in number (oldest dropped). NOT modelled here: what a command computes
(``kvhit.service``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import multiprocessing as mp
import shutil
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Job", "JobManager", "QueueFull"]


class QueueFull(RuntimeError):
    """Too many jobs queued or running."""


@dataclass
class Job:
    id: str
    command: str
    key: str
    status: str = "queued"  # queued | running | done | error | cancelled
    done: float = 0.0
    total: float = 0.0
    what: str | None = None
    result: Any = None
    error: str | None = None
    cached: bool = False
    created: float = field(default_factory=time.time)
    finished: float | None = None
    tmpdir: Path | None = None
    persist: bool = False
    cancel_event: threading.Event = field(default_factory=threading.Event)
    proc: Any = None

    def view(self) -> dict[str, Any]:
        d = {
            "id": self.id,
            "command": self.command,
            "status": self.status,
            "progress": {"done": self.done, "total": self.total, "what": self.what},
            "cached": self.cached,
            "error": self.error,
        }
        if self.status == "done":
            d["result"] = self.result
        return d


def _child(conn, command: str, fields: dict[str, Any], rename: dict[str, str]) -> None:
    """Worker process: answer one request through the service layer; send progress, then the outcome. Not a daemon
    (the ShareGPT tokenizer and the simulators may start processes of their own); it dies with the server."""
    from kvhit.service.io import die_with_parent

    die_with_parent()
    from kvhit.service.errors import InputError, one_line
    from kvhit.service.registry import run

    def clean(msg: str) -> str:
        for tmp, name in rename.items():
            msg = msg.replace(tmp, name)
        return msg

    last = [0.0]

    def progress(done, total, what=None):
        now = time.monotonic()
        if now - last[0] >= 0.1:
            last[0] = now
            conn.send(("progress", float(done), float(total), None if what is None else clean(str(what))))

    try:
        res = run(command, fields, progress=progress)
        out = res.to_jsonable()
        if rename:  # the client's file names, never the server's temporary paths
            import json

            out = json.loads(clean(json.dumps(out)))
        conn.send(("done", out))
    except InputError as e:
        conn.send(("error", clean(str(e))))
    except Exception as e:  # a bug: one line to the client, the traceback to the server's log
        traceback.print_exc()
        conn.send(("fail", f"internal error ({type(e).__name__}): {one_line(clean(str(e)))}"))
    finally:
        conn.close()


class JobManager:
    """Runs jobs in worker processes (``spawn``), at most ``workers`` at once, at most ``max_queued`` waiting."""

    def __init__(
        self, workers: int = 2, max_queued: int = 32, keep: int = 256, cache_size: int = 64, persist: Path | None = None
    ) -> None:
        self.persist = persist  # answers on the bundled workload (no upload) kept across restarts, by input hash
        self.workers = workers
        self.max_queued = max_queued
        self.keep = keep
        self.cache_size = cache_size
        self._slots = threading.Semaphore(workers)
        self._lock = threading.Lock()
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        self._cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._ctx = mp.get_context("spawn")

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def active(self) -> int:
        with self._lock:
            return sum(j.status in ("queued", "running") for j in self._jobs.values())

    def _add(self, job: Job) -> None:
        with self._lock:
            self._jobs[job.id] = job
            finished = [k for k, j in self._jobs.items() if j.status not in ("queued", "running")]
            for k in finished[: max(0, len(self._jobs) - self.keep)]:
                del self._jobs[k]

    def _persisted(self, key: str) -> Any:
        if self.persist is None:
            return None
        f = self.persist / f"{key}.json"
        try:
            return json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _remember(self, key: str, result: Any, persist: bool = False) -> None:
        if persist and self.persist is not None:
            from kvhit.service.io import atomic_write_text

            with contextlib.suppress(OSError):
                atomic_write_text(self.persist / f"{key}.json", json.dumps(result, allow_nan=False))
        with self._lock:
            self._cache[key] = result
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    # -- submit / cancel --------------------------------------------------------------------------------------
    def submit(
        self,
        command: str,
        fields: dict[str, Any],
        key: str,
        tmpdir: Path | None = None,
        rename: dict[str, str] | None = None,
    ) -> Job:
        job = Job(id=uuid.uuid4().hex[:16], command=command, key=key, tmpdir=tmpdir)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
        persist = tmpdir is None and bool(fields.get("sharegpt"))  # the bundled workload: same bytes everywhere
        if hit is None and persist:
            hit = self._persisted(key)
            if hit is not None:
                self._remember(key, hit)
        if hit is not None:
            _rmtree(tmpdir)
            job.status, job.result, job.cached, job.finished = "done", hit, True, time.time()
            job.done = job.total = 1.0
            self._add(job)
            return job
        if self.active() >= self.workers + self.max_queued:
            _rmtree(tmpdir)
            raise QueueFull(f"{self.active()} jobs queued or running; try again later")
        self._add(job)
        job.persist = persist
        threading.Thread(target=self._run, args=(job, fields, rename or {}), daemon=True).start()
        return job

    def cancel(self, job_id: str) -> Job | None:
        job = self.get(job_id)
        if job is None:
            return None
        job.cancel_event.set()
        proc = job.proc
        if proc is not None and proc.is_alive():
            proc.terminate()
        return job

    def shutdown(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for j in jobs:
            if j.status in ("queued", "running"):
                self.cancel(j.id)
        for j in jobs:  # the watcher threads are daemons: uploads must not outlive the server
            proc = j.proc
            if proc is not None and proc.pid is not None:  # published just before start(): join only started ones
                proc.join(5)
            _rmtree(j.tmpdir)

    # -- the watcher thread of one job ------------------------------------------------------------------------
    def _run(self, job: Job, fields: dict[str, Any], rename: dict[str, str]) -> None:
        try:
            while not self._slots.acquire(timeout=0.2):
                if job.cancel_event.is_set():
                    job.status = "cancelled"
                    return
            try:
                if job.cancel_event.is_set():
                    job.status = "cancelled"
                    return
                self._watch(job, fields, rename)
            finally:
                self._slots.release()
        finally:
            job.finished = time.time()
            job.proc = None
            _rmtree(job.tmpdir)

    def _watch(self, job: Job, fields: dict[str, Any], rename: dict[str, str]) -> None:
        parent, child = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=_child, args=(child, job.command, fields, rename), daemon=False)
        job.status = "running"
        job.proc = proc
        proc.start()
        child.close()
        outcome = None
        try:
            while outcome is None:
                if job.cancel_event.is_set():
                    break
                try:
                    ready = parent.poll(0.1)
                except (EOFError, OSError):
                    break
                if not ready:
                    if not proc.is_alive() and not parent.poll(0):
                        break
                    continue
                try:
                    msg = parent.recv()
                except (EOFError, OSError):
                    break
                if msg[0] == "progress":
                    _, job.done, job.total, job.what = msg
                else:
                    outcome = msg
        finally:
            if proc.is_alive():
                proc.terminate()
            proc.join(5)
            parent.close()
        if job.cancel_event.is_set() and outcome is None:
            job.status = "cancelled"
        elif outcome is None:
            job.status, job.error = "error", f"internal error: the worker process exited (code {proc.exitcode})"
        elif outcome[0] == "done":
            job.result, job.status = outcome[1], "done"
            job.done = job.total = max(job.total, 1.0)
            self._remember(job.key, job.result, persist=job.persist)
        else:
            job.status, job.error = "error", outcome[1]


def _rmtree(p: Path | None) -> None:
    if p is not None:
        shutil.rmtree(p, ignore_errors=True)
