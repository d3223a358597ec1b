"""One child-process timer for the benchmarks that time whole ``kvhit`` commands.

:func:`run_child` starts the command, reaps it with ``os.wait4`` (so the rusage is that child's — and the
workers it reaped — alone), kills it past ``timeout_s``, and returns wall seconds, CPU seconds (user + system),
peak RSS in bytes (``ru_maxrss`` is KiB on Linux), the 1-minute load average at the start (this machine is
shared: a timing is only comparable with its load), the exit code (−1 when killed) and the captured output.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ChildRun:
    wall_s: float
    cpu_s: float
    max_rss_bytes: int
    load: float
    rc: int
    stdout: str
    stderr: str


def run_child(argv: list[str], timeout_s: float, *, capture: bool = False) -> ChildRun:
    """Run ``argv`` to completion (or ``timeout_s``) and measure it; ``capture`` keeps stdout and stderr."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        sink = {"stdout": so, "stderr": se} if capture else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, **sink)
        killed = False
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout_s:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                killed = True
                break
            time.sleep(0.05)
        p.returncode = 0  # reaped above: keep Popen from waiting again
        wall = time.perf_counter() - t0
        out = err = ""
        if capture:
            so.seek(0)
            se.seek(0)
            out, err = so.read().decode(), se.read().decode()
    rc = -1 if killed else os.waitstatus_to_exitcode(status)
    return ChildRun(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, load, rc, out, err)
