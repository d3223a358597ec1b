"""Latency of the planner page's synchronous API under load (issue 24): the slider's request (POST /api/estimate,
200 capacities, the page's ``grid(200)``; each request a new λ0, so no answer is served from the cache) against a
fresh ``kvhit serve`` — one client sending one request at a time (slider → chart: the page coalesces a slider
move into this one request), and 8 concurrent clients. Targets: slider p95 ≤ 150 ms, 8 clients p95 ≤ 200 ms.
Measured with ``--api-workers 0`` (answers in the server's own threads, one interpreter) and with the default
``--api-workers`` (min(4, cores): a warmed process pool) in the same run; the machine's cores bound what 8
clients can get; the server's CPU per request (its process and workers, from ``/proc``) is what a request costs
when the cores are free. Timing starts after the server's start-up work (``/api/health``: ``warm``, and the pool
warmed); the health endpoint's per-process answer counts show which processes answered.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

KVHIT = str(Path(sys.executable).parent / "kvhit")
SPEC = {"mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}
GRID = sorted({int(100 * (100_000 / 100) ** (i / 199)) for i in range(200)})  # app.js grid(200), n 100..100,000


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> float:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - t0


class _Server:
    def __init__(self, api_workers: int) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [KVHIT, "serve", "--port", str(self.port), "--api-workers", str(api_workers)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                h = _get(self.url + "/api/health")  # start-up work done (warm-up answers, the first chart's job)
                if h["warm"] and (api_workers == 0 or h["api_workers_ready"]):  # and the pool warmed
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError("kvhit serve did not become ready in 600 s")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def _tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its live descendants (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)  # ppid, utime + stime
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo += [c for c, (pp, _) in stats.items() if pp == p and c not in tree]
    return sum(stats[p][1] for p in tree if p in stats)


def _lam(k: int) -> float:
    return round(0.5 + 0.01 * k, 4)  # a slider position per request


def _measure(api_workers: int, n_seq: int, clients: int, per_client: int) -> dict:
    srv = _Server(api_workers)
    try:
        url = srv.url + "/api/estimate"
        for k in range(5):  # first answers: imports and compilations in whichever worker answers
            _post(url, {"N": GRID, "lam0": _lam(10_000 + k), **SPEC})
        c0 = _tree_cpu(srv.proc.pid)
        seq = [_post(url, {"N": GRID, "lam0": _lam(k), **SPEC}) for k in range(n_seq)]
        cpu = (_tree_cpu(srv.proc.pid) - c0) / n_seq
        lat: list[float] = []
        lock = threading.Lock()

        def client(c: int) -> None:
            for j in range(per_client):
                t = _post(url, {"N": GRID, "lam0": _lam(1000 + c * per_client + j), **SPEC})
                with lock:
                    lat.append(t)

        ths = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        t0 = time.perf_counter()
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        wall = time.perf_counter() - t0
        h = _get(srv.url + "/api/health")
    finally:
        srv.close()
    by = {int(p): n for p, n in h["answered_by"].items()}
    ms = 1000.0
    return {
        "slider p50 ms": float(np.percentile(seq, 50)) * ms,
        "slider p95 ms": float(np.percentile(seq, 95)) * ms,
        "server CPU ms per slider request": cpu * ms,
        f"{clients} clients p50 ms": float(np.percentile(lat, 50)) * ms,
        f"{clients} clients p95 ms": float(np.percentile(lat, 95)) * ms,
        f"{clients} clients requests/s": len(lat) / wall,
        "answers by the server's own interpreter": by.get(h["server_pid"], 0),
        "answers by pool workers": sum(n for p, n in by.items() if p != h["server_pid"]),
    }


def run(n_seq: int = 40, clients: int = 8, per_client: int = 10) -> dict:
    out: dict = {"cores": os.cpu_count()}
    workers = min(4, os.cpu_count() or 1)  # kvhit serve's default
    for w in (0, workers):
        out |= {f"api-workers {w}: {k}": v for k, v in _measure(w, n_seq, clients, per_client).items()}
    s95 = out[f"api-workers {workers}: slider p95 ms"]
    c95 = out[f"api-workers {workers}: {clients} clients p95 ms"]
    out[f"slider p95 ≤ 150 ms (api-workers {workers})"] = f"{'met' if s95 <= 150 else 'MISSED'} ({s95:.0f} ms)"
    out[f"{clients} clients p95 ≤ 200 ms (api-workers {workers})"] = (
        f"{'met' if c95 <= 200 else 'MISSED'} ({c95:.0f} ms)"
    )
    return out


def main() -> None:
    for k, v in run().items():
        print(f"{k:<44} {v if isinstance(v, str) else f'{v:,.4g}'}")


if __name__ == "__main__":
    main()
