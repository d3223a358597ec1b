"""Cold start of the front ends (issue 24): ``kvhit --version``, ``kvhit --help``, ``kvhit estimate`` (one
capacity) as fresh processes (median of 5), ``kvhit serve`` until it prints its URL and until it answers, the
planner page's first chart (POST /api/curve of the bundled ShareGPT workload, polled to done) on a fresh server
with an empty kvhit cache: ``python -m kvhit.web.prepare`` (what ``make venv`` runs: tokenizes ShareGPT once and
answers the first chart), then the first chart on a fresh server, and again after a restart; and reading the
Mooncake trace (fresh parse, and through the columnar cache). Targets: --help/--version ≤ 0.5 s, estimate
≤ 1.5 s, first chart ≤ 3 s, Mooncake read ≤ 1 s — each reported met or MISSED with its number. The machine is
shared: the same run also times ``python -c pass`` (the interpreter's own start) as the baseline.
"""

from __future__ import annotations

import json
import os
import resource
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


def _median_cpu(cmd: list[str], n: int = 5) -> float:
    """Median CPU seconds (user + system) of the command: on a loaded shared machine the wall time measures the
    queue for the cores, the CPU time what the command itself costs (≈ its wall time on an idle machine)."""
    ts = []
    for _ in range(n):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        ts.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
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
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


MOONCAKE = Path("/work/shared/data/traces/mooncake_fast25/conversation_trace.jsonl")


def _mooncake(cache: str) -> dict:
    """Seconds to read the Mooncake trace: a fresh parse, and through the columnar cache (median of 3 after the
    first read filled it)."""
    if not MOONCAKE.exists():
        return {}
    from kvhit.workload.production import read_mooncake
    from kvhit.workload.production_cache import read_mooncake_cached

    t0 = time.perf_counter()
    read_mooncake(MOONCAKE)
    fresh = time.perf_counter() - t0
    read_mooncake_cached(MOONCAKE, cache_dir=cache)
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        read_mooncake_cached(MOONCAKE, cache_dir=cache)
        ts.append(time.perf_counter() - t0)
    return {"Mooncake read, fresh parse s": fresh, "Mooncake read, cached s (target 1)": float(np.median(ts))}


def _verdicts(out: dict) -> dict:
    targets = {
        "kvhit --version s (target 0.5)": 0.5,
        "kvhit --help s (target 0.5)": 0.5,
        "kvhit estimate s (target 1.5)": 1.5,
        "first chart after make venv (prepare) s (target 3)": 3.0,
        "first chart after a restart s (target 3)": 3.0,
        "Mooncake read, cached s (target 1)": 1.0,
        "kvhit --version CPU s": 0.5,
        "kvhit --help CPU s": 0.5,
        "kvhit estimate CPU s": 1.5,
    }
    return {
        f"→ {k.split(' s (')[0].replace(' CPU s', ' (CPU)')}": (
            f"{'met' if out[k] <= t else 'MISSED'} ({out[k]:.3g} s ≤ {t:g} s)"
        )
        for k, t in targets.items()
        if k in out
    }


def run(serve: bool = True) -> dict:
    """Every measurement; ``serve=False`` leaves out the server, the first chart and the prepare step."""
    est = [KVHIT, "estimate", "--N", "1000", "--lam0", "1", "--mean-turns", "5", "--x-mean", "4", "--y-mean", "3",
           "--w-mean", "135"]  # fmt: skip
    out = {
        "python -c pass s (baseline)": _median_wall([sys.executable, "-c", "pass"]),
        "kvhit --version s (target 0.5)": _median_wall([KVHIT, "--version"]),
        "kvhit --help s (target 0.5)": _median_wall([KVHIT, "--help"]),
        "kvhit estimate s (target 1.5)": _median_wall(est),
        "python -c pass CPU s": _median_cpu([sys.executable, "-c", "pass"]),
        "kvhit --version CPU s": _median_cpu([KVHIT, "--version"]),
        "kvhit --help CPU s": _median_cpu([KVHIT, "--help"]),
        "kvhit estimate CPU s": _median_cpu(est),
        "1-minute load average at the start": os.getloadavg()[0],
    }
    if not serve:
        with tempfile.TemporaryDirectory() as cache:
            out |= _mooncake(cache)
        return out | _verdicts(out)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "KVHIT_CACHE_DIR": cache}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "kvhit.web.prepare"], env=env, stdout=subprocess.DEVNULL, check=True)
        prep = time.perf_counter() - t0
        url, up, first = _serve(cache)
        _, _, warm = _serve(cache)
        out |= _mooncake(cache)
    out |= {
        "kvhit serve: URL printed after s": url,
        "kvhit serve: answering after s": up,
        "make venv's prepare step (empty kvhit cache) s": prep,
        "first chart after make venv (prepare) s (target 3)": first,
        "first chart after a restart s (target 3)": warm,
    }
    return out | _verdicts(out)


def main() -> None:
    for k, v in run().items():
        print(f"{k:<52} {v if isinstance(v, str) else f'{v:,.3g}'}")


if __name__ == "__main__":
    main()
