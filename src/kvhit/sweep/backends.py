"""Running a sweep's tasks: a local process pool (default) or Ray tasks, with retries, batch writes and resume.

* **local** (``-j J``): ``J = 1`` runs in this process; otherwise a ``ProcessPoolExecutor`` whose workers are forked
  after the payload (the shipped workloads, :func:`.compute.build_payload`) is built, so each worker has it from
  its initializer without any copy per point. A worker that dies (``BrokenProcessPool``) fails the tasks it held
  (they are retried, an attempt counted); the pool's other tasks (queued, or running on a worker the broken pool
  stopped) are resubmitted without counting an attempt, and the pool is rebuilt. Workers die with the driver
  (``PR_SET_PDEATHSIG`` on Linux): a killed sweep leaves no worker running.
* **ray** (``--backend ray [--address auto|ray://…]``): the payload is ``ray.put`` once; each task receives the
  object reference and a worker process fetches it the first time only. Without an address a local Ray instance
  with ``J`` CPUs is started (and stopped at the end). Ray's own retries are off: failures are retried here,
  the same way as on the local backend, so both backends produce the same rows.

Invariant: the sweep never dies of a failed point — a task that raises is recorded (``status = error`` with its
error line) and retried up to ``retries`` more times; rows are flushed to the store at least every
``flush_s`` seconds and at the end (also on Ctrl-C), each flush one atomic part file.

NOT done here: what a task computes (:mod:`.compute`), the file format (:mod:`.store`).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from kvhit import __version__
from kvhit.sweep.compute import build_payload, execute_batch, install
from kvhit.sweep.grid import AXES, Grid, Task
from kvhit.sweep.store import ResultStore

__all__ = ["SweepSummary", "run_sweep", "BackendError"]

Progress = Callable[[int, int, int, str], None]


class BackendError(ValueError):
    """A backend that cannot start (Ray missing, unreachable address); one line."""


@dataclass
class SweepSummary:
    """What a finished sweep reports: output directory, backend, workers, points and their outcomes."""

    out: str
    backend: str
    workers: int
    points: int  #: points × replications in the grid
    skipped: int  #: already finished (``--resume``)
    ok: int = 0
    refused: int = 0
    failed: int = 0
    retries: int = 0
    seconds: float = 0.0
    parts: list[str] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        done = self.ok + self.refused + self.failed
        return done / self.seconds if self.seconds > 0 else math.nan


class _Inline:
    """A batch queued for ``-j 1`` (run in this process when waited on)."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks = tasks


def _worker_init(payload_id: str, payload: dict) -> None:
    from kvhit.service.io import die_with_parent

    die_with_parent()
    install(payload_id, payload)


def _marked_batch(markers: str, payload_id: str, tasks: list[Task]) -> list[tuple]:
    """``execute_batch`` in a pool worker, leaving ``markers/TASK_ID`` = this worker's pid while the batch runs: when a
    worker dies, the driver retries (and counts an attempt for) only the tasks the dead worker held."""
    files = [Path(markers) / t.task_id for t in tasks]
    for f in files:
        f.write_text(str(os.getpid()))
    try:
        return execute_batch(payload_id, None, tasks)
    finally:
        for f in files:
            f.unlink(missing_ok=True)


class Interrupted(Exception):
    """A batch lost with a broken pool; ``victims``: the task ids the dead worker was running (the others were
    only queued or running on a worker the pool then stopped, and are resubmitted without counting an attempt)."""

    def __init__(self, cause: BaseException, victims: set[str]) -> None:
        super().__init__(str(cause))
        self.cause, self.victims = cause, victims


class _Local:
    def __init__(self, jobs: int, payload_id: str, payload: dict, markers: Path | None = None) -> None:
        self.jobs, self.pid, self.payload = jobs, payload_id, payload
        self.markers = markers
        self.pool: ProcessPoolExecutor | None = None
        if jobs == 1:
            install(payload_id, payload)

    def _pool(self) -> ProcessPoolExecutor:
        import multiprocessing as mp

        if self.pool is None:
            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
            self.pool = ProcessPoolExecutor(
                self.jobs, mp_context=ctx, initializer=_worker_init, initargs=(self.pid, self.payload)
            )
        return self.pool

    def submit(self, tasks: list[Task]):
        if self.jobs == 1:
            return _Inline(tasks)
        if self.markers is not None:
            return self._pool().submit(_marked_batch, str(self.markers), self.pid, tasks)
        return self._pool().submit(execute_batch, self.pid, None, tasks)

    def _dead_workers(self) -> set[int]:
        """Pids of the broken pool's workers that died on their own (not stopped by the pool with SIGTERM)."""
        import signal

        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        # the pool fails the futures before it terminates the survivors, and a worker that just died may not be
        # reaped yet (exitcode None for a moment): wait until every worker has an exit code (bounded)
        deadline = time.monotonic() + 10.0
        for p in procs:
            while p.exitcode is None and time.monotonic() < deadline:
                p.join(0.05)
        return {p.pid for p in procs if p.exitcode not in (None, 0, -signal.SIGTERM)}

    def _victims(self, dead: set[int]) -> set[str]:
        out = set()
        if self.markers is None:
            return out
        for f in self.markers.iterdir():
            try:
                if int(f.read_text() or 0) in dead:
                    out.add(f.name)
            except (OSError, ValueError):
                continue
            f.unlink(missing_ok=True)
        return out

    def wait(self, handles: dict) -> list[tuple[object, list[tuple] | BaseException]]:
        inline = [h for h in handles if isinstance(h, _Inline)]
        if inline:  # -j 1: run the first queued batch now
            h = inline[0]
            return [(h, execute_batch(self.pid, None, h.tasks))]
        from concurrent.futures.process import BrokenProcessPool

        done, _ = wait(list(handles), return_when=FIRST_COMPLETED)
        if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
            # every future of the dead pool fails: collect them all now, and tell the killed worker's tasks apart
            wait([f for f in handles if not isinstance(f, _Inline)])
            done = {f for f in handles if not isinstance(f, _Inline)}
            victims = self._victims(self._dead_workers())
            self.pool = None  # a new pool for the retries
            out = []
            for f in done:
                e = f.exception()
                if isinstance(e, BrokenProcessPool):
                    out.append((f, Interrupted(e, victims)))
                else:
                    out.append((f, e if e is not None else f.result()))
            return out
        out = []
        for f in done:
            e = f.exception()
            out.append((f, e if e is not None else f.result()))
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _Ray:
    def __init__(self, jobs: int, address: str | None, payload_id: str, payload: dict) -> None:
        try:
            import ray
        except ImportError:
            raise BackendError("--backend ray: Ray is not installed (pip install 'kvhit[ray]')") from None
        self.ray, self.pid, self.owns = ray, payload_id, False
        if not ray.is_initialized():
            try:
                quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
                if address:
                    ray.init(address=address, **quiet)
                else:
                    ray.init(num_cpus=jobs, include_dashboard=False, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise BackendError(f"--address {address}: cannot connect to Ray ({str(e).splitlines()[0]})") from None
            self.owns = True
        self.ref = ray.put(payload)
        self.fn = ray.remote(num_cpus=1, max_retries=0)(execute_batch)

    def submit(self, tasks: list[Task]):
        return self.fn.remote(self.pid, [self.ref], tasks)

    def wait(self, handles: dict):
        ready, _ = self.ray.wait(list(handles), num_returns=1)
        out = []
        for h in ready:
            try:
                out.append((h, self.ray.get(h)))
            except Exception as e:  # a task or worker failure: the batch's tasks are retried
                out.append((h, e))
        return out

    def close(self) -> None:
        if self.owns:
            self.ray.shutdown()


def _chunks(tasks: list[Task], jobs: int) -> list[list[Task]]:
    """Batches of tasks per submission: few large ones for many tiny tasks, one task each for few."""
    size = max(1, min(64, len(tasks) // (8 * max(jobs, 1))))
    return [tasks[i : i + size] for i in range(0, len(tasks), size)]


def _rows(grid: Grid, task: Task, out: list[dict], status: str, err, secs: float, worker: str, attempts: int, be, fp):
    wl = grid.workloads[task.workload]
    now = time.time()
    rows = []
    for p, o in zip(task.points, out, strict=True):
        r = {a: p.get(a) for a in AXES}
        r.update(
            point_id=p["point_id"],
            replication=task.replication,
            seed=task.seed,
            workload=task.workload,
            workload_kind=wl.kind,
            compute=task.compute,
            **o,
            status=status,
            error=err,
            attempts=attempts,
            wall_s=secs / len(task.points),
            task_id=task.task_id,
            task_points=len(task.points),
            worker=worker,
            backend=be,
            finished_at=now,
            kvhit_version=__version__,
            grid_fingerprint=fp,
        )
        rows.append(r)
    return rows


def run_sweep(
    grid: Grid,
    out: Path,
    *,
    jobs: int = 1,
    backend: str = "local",
    address: str | None = None,
    resume: bool = False,
    progress: Progress | None = None,
    flush_s: float = 10.0,
    flush_rows: int = 5000,
) -> SweepSummary:
    """Run every unfinished point of ``grid`` into the result directory ``out``."""
    cb = progress or (lambda done, total, failed, what: None)
    fingerprint = grid.fingerprint()
    store = ResultStore(out, grid.path, fingerprint, resume)
    tasks = grid.tasks()
    total = sum(len(t.points) for t in tasks)
    finished = store.finished() if resume else set()
    pending = [t for t in tasks if not all((p["point_id"], t.replication) in finished for p in t.points)]
    skipped = total - sum(len(t.points) for t in pending)
    summary = SweepSummary(str(out), backend, jobs, total, skipped)
    t0 = time.perf_counter()
    if not pending:
        return summary
    cb(skipped, total, 0, "building workloads")
    scratch = tempfile.mkdtemp(prefix="kvhit-sweep-")
    try:
        payload = build_payload(grid, pending, scratch, progress=lambda k, n, what: cb(skipped, total, 0, what))
        pid = uuid.uuid4().hex
        if backend == "ray":
            be = _Ray(jobs, address, pid, payload)
        else:
            markers = Path(scratch) / "running"
            markers.mkdir()
            be = _Local(jobs, pid, payload, markers)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    attempts: dict[str, int] = {}
    handles: dict = {}
    buffer: list[dict] = []
    last_flush = time.perf_counter()
    done = skipped
    failed = 0

    def flush() -> None:
        nonlocal buffer, last_flush
        part = store.write(buffer)
        if part is not None:
            summary.parts.append(str(part))
        buffer, last_flush = [], time.perf_counter()

    try:
        for chunk in _chunks(pending, jobs):
            handles[be.submit(chunk)] = chunk
        cb(done, total, failed, "running")
        while handles:
            for h, res in be.wait(handles):
                chunk = handles.pop(h)
                if isinstance(res, Interrupted):  # a pool worker died: only its own tasks count an attempt
                    lost = [t for t in chunk if t.task_id not in res.victims]
                    if lost:
                        handles[be.submit(lost)] = lost
                    chunk = [t for t in chunk if t.task_id in res.victims]
                    res = res.cause
                    if not chunk:
                        continue
                if isinstance(res, BaseException):  # the worker died or Ray failed the batch
                    from kvhit.sweep.compute import _one_line, _row

                    res = [(t, [_row() for _ in t.points], "error", _one_line(res), 0.0, "?") for t in chunk]
                for task, out_rows, status, err, secs, worker in res:
                    n = attempts[task.task_id] = attempts.get(task.task_id, 0) + 1
                    if status == "error" and n <= grid.retries:
                        summary.retries += 1
                        handles[be.submit([task])] = [task]
                        continue
                    buffer += _rows(grid, task, out_rows, status, err, secs, worker, n, backend, fingerprint)
                    k = len(task.points)
                    done += k
                    if status == "ok":
                        summary.ok += k
                    elif status == "refused":
                        summary.refused += k
                    else:
                        summary.failed += k
                    failed = summary.refused + summary.failed
                cb(done, total, failed, "running")
                if len(buffer) >= flush_rows or time.perf_counter() - last_flush >= flush_s:
                    flush()
    finally:
        flush()
        be.close()
        shutil.rmtree(scratch, ignore_errors=True)
        summary.seconds = time.perf_counter() - t0
    return summary
