"""`kvhit serve`: estimator-curve request latency (1,000-point curve, POST /api/estimate) over HTTP.

Starts ``kvhit serve`` on a free 127.0.0.1 port; every request has a distinct λ0, so none is answered from the
server's input-hash cache. Measures: 100 sequential requests (p50/p95), 16 concurrent clients × 10 requests each
(p50/p95 overall, and each client's median — a starved client would stand out), the same estimate called
in-process (the baseline, same run), and the server's resident memory before and after.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

SCM = {"mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}
N = np.unique(np.geomspace(1_000, 1_000_000, 1000).astype(int)).tolist()  # 1,000 distinct capacities


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _one(conn: http.client.HTTPConnection, lam0: float) -> float:
    body = json.dumps({"N": N, "lam0": lam0, **SCM})
    t0 = time.perf_counter()
    conn.request("POST", "/api/estimate", body, {"content-type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    dt = time.perf_counter() - t0
    if r.status != 200 or len(json.loads(data)["estimates"]) != len(N):
        raise RuntimeError(f"bad answer {r.status}: {data[:200]!r}")
    return dt


def _pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs) * 1e3, q))


def run() -> dict:
    from kvhit import service as svc

    port = _port()
    kvhit = Path(sys.executable).parent / "kvhit"
    proc = subprocess.Popen([str(kvhit), "serve", "--port", str(port)], stdout=subprocess.DEVNULL)
    try:
        t0 = time.time()
        while True:
            try:  # timed once the start-up work is done and the API worker pool is warm (GET /api/health)
                h = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2).read())
                if h["warm"] and (h["api_workers"] == 0 or h["api_workers_ready"]):
                    break
            except OSError:
                pass
            if time.time() - t0 > 600:
                raise RuntimeError("kvhit serve did not become ready in 600 s")
            time.sleep(0.3)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(3):  # warm-up: imports, first compilation
            _one(conn, 0.5 + i * 1e-3)
        rss0 = _rss_mib(proc.pid)
        seq = [_one(conn, 1.0 + i * 1e-3) for i in range(100)]

        per_client: list[list[float]] = [[] for _ in range(16)]

        def client(k: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            for j in range(10):
                per_client[k].append(_one(c, 2.0 + k * 1e-2 + j * 1e-4))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
        tc = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall_conc = time.perf_counter() - tc
        conc = [x for xs in per_client for x in xs]
        medians = [float(np.median(xs)) * 1e3 for xs in per_client]
        rss1 = _rss_mib(proc.pid)

        base = []
        for i in range(20):
            req = svc.build(svc.EstimateRequest, N=N, lam0=3.0 + i * 1e-3, **SCM)
            t = time.perf_counter()
            svc.estimate(req).to_jsonable()
            base.append(time.perf_counter() - t)
    finally:
        proc.terminate()
        proc.wait(10)
    return {
        "curve points": len(N),
        "sequential p50 ms (100 requests)": _pct(seq, 50),
        "sequential p95 ms": _pct(seq, 95),
        "16 clients p50 ms (160 requests)": _pct(conc, 50),
        "16 clients p95 ms": _pct(conc, 95),
        "16 clients: slowest / fastest client median": max(medians) / min(medians),
        "16 clients: requests/s": len(conc) / wall_conc,
        "in-process service.estimate p50 ms (baseline)": _pct(base, 50),
        "HTTP / in-process (p50 ratio)": _pct(seq, 50) / _pct(base, 50),
        "server RSS MiB before / after": f"{rss0:.0f} / {rss1:.0f}",
    }


def main() -> None:
    for k, v in run().items():
        print(f"{k:<48} {v:,.4g}" if isinstance(v, float) else f"{k:<48} {v}")


if __name__ == "__main__":
    main()
