"""Cold start of the front ends (issue 24): ``kvhit --version``, ``kvhit --help``, ``kvhit estimate`` (one
capacity) as fresh processes (median of 5), ``kvhit serve`` until it prints its URL and until it answers, and the
planner page's first chart (POST /api/curve of the bundled ShareGPT workload, polled to done) on a fresh server —
once with an empty answer cache (computed) and once after a restart (persisted). Targets: --help/--version
≤ 0.5 s, estimate ≤ 1.5 s, first chart ≤ 3 s. The machine is shared: the same run also times ``python -c pass``
(the interpreter's own start) as the baseline.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

KVHIT = str(Path(sys.executable).parent / "kvhit")
FIRST = {"n_min": 100, "n_max": 100000, "points": 200, "policies": ["vllm"], "sharegpt": True}


def _median_wall(cmd: list[str], n: int = 5) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def _serve(cache: str) -> tuple[float, float, float]:
    """(s to the printed URL, s to the first answer, s to the first chart) of a fresh ``kvhit serve``."""
    port = _port()
    env = {**os.environ, "KVHIT_CACHE_DIR": cache}
    t0 = time.perf_counter()
    proc = subprocess.Popen([KVHIT, "serve", "--port", str(port)], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = proc.stdout.readline()
        t_url = time.perf_counter() - t0
        assert f":{port}/" in line, line
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/presets", timeout=2).read()
                break
            except OSError:
                time.sleep(0.05)
        t_up = time.perf_counter() - t0
        t1 = time.perf_counter()
        job = _post(f"http://127.0.0.1:{port}/api/curve", FIRST)
        while job["status"] in ("queued", "running"):
            time.sleep(0.1)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/jobs/{job['id']}") as r:
                job = json.loads(r.read())
        assert job["status"] == "done", job
        return t_url, t_up, time.perf_counter() - t1
    finally:
        proc.terminate()
        proc.wait(30)


def run() -> dict:
    est = [KVHIT, "estimate", "--N", "1000", "--lam0", "1", "--mean-turns", "5", "--x-mean", "4", "--y-mean", "3",
           "--w-mean", "135"]  # fmt: skip
    out = {
        "python -c pass s (baseline)": _median_wall([sys.executable, "-c", "pass"]),
        "kvhit --version s (target 0.5)": _median_wall([KVHIT, "--version"]),
        "kvhit --help s (target 0.5)": _median_wall([KVHIT, "--help"]),
        "kvhit estimate s (target 1.5)": _median_wall(est),
    }
    with tempfile.TemporaryDirectory() as cache:
        url, up, cold = _serve(cache)
        _, _, warm = _serve(cache)
    out |= {
        "kvhit serve: URL printed after s": url,
        "kvhit serve: answering after s": up,
        "first chart, empty answer cache s (target 3)": cold,
        "first chart after a restart s (target 3)": warm,
    }
    return out


def main() -> None:
    for k, v in run().items():
        print(f"{k:<48} {v:,.3g}")


if __name__ == "__main__":
    main()
