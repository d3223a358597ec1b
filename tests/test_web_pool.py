"""``kvhit serve --api-workers N`` (kvhit.web.pool): the synchronous answers really come from N live worker
processes, concurrently; a dead worker is replaced by a fresh warmed pool; the workers go with the server; and the
JSON bytes a worker sends are the service's answer (``Response.to_json_bytes`` equals the strict-JSON reference).

The pool of the code before this file started its workers from a short-lived thread: ``PR_SET_PDEATHSIG`` (which
every worker sets, to die with the server) fires when the *thread* that started the process ends, so the workers
were killed right after warming and every answer came from the server's own interpreter — the first test fails
there (the answers are counted under the server's pid, and the workers' pids are dead).
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from kvhit import service as svc
from kvhit.service.base import Response, strict_json
from kvhit.web import create_app

SCM = {"mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}
N = np.unique(np.geomspace(100, 100_000, 5000).astype(int)).tolist()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _ready(client, generation: int = 1, timeout: float = 300) -> dict:
    t0 = time.time()
    while True:
        h = client.get("/api/health").json()
        if h["api_workers_ready"] and h["api_pool_generation"] >= generation:
            return h
        assert time.time() - t0 < timeout, f"API worker pool not ready after {timeout} s: {h}"
        time.sleep(0.2)


def _concurrent(client, n: int, offset: int) -> list[dict]:
    out: list[Any] = [None] * n

    def go(k: int) -> None:
        r = client.post("/api/estimate", json={"N": N, "lam0": round(0.5 + 0.01 * (offset + k), 4), **SCM})
        out[k] = r

    ths = [threading.Thread(target=go, args=(k,)) for k in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert all(r.status_code == 200 for r in out), [r.text for r in out if r.status_code != 200]
    return [r.json() for r in out]


def test_concurrent_answers_come_from_live_workers_which_end_with_the_server():
    with TestClient(create_app(api_workers=2)) as client:
        h = _ready(client)
        pids = h["api_worker_pids"]
        assert len(set(pids)) == 2 and h["server_pid"] not in pids
        time.sleep(1.0)  # the old pool's workers were dead by now (their starting thread had returned)
        assert all(_alive(p) for p in pids), pids
        answers = _concurrent(client, 16, 0)
        h = client.get("/api/health").json()
        by = {int(p): n for p, n in h["answered_by"].items()}
        assert str(h["server_pid"]) not in h["answered_by"], by  # none answered in the server's interpreter
        assert sum(by.values()) == 16
        assert set(by) == set(pids), by  # both workers answered (16 queued requests: neither sat idle)
        assert all(_alive(p) for p in pids)
        # the workers' answers are the service's
        want = svc.estimate(svc.build(svc.EstimateRequest, N=N, lam0=0.5, **SCM)).to_jsonable()
        assert answers[0] == json.loads(strict_json(want))
    t0 = time.time()  # the server is gone: so are its workers
    while any(_alive(p) for p in pids) and time.time() - t0 < 30:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), pids


def test_a_killed_worker_is_replaced_and_no_request_fails():
    with TestClient(create_app(api_workers=2)) as client:
        h = _ready(client)
        old = h["api_worker_pids"]
        os.kill(old[0], signal.SIGKILL)  # e.g. the OOM killer
        t0 = time.time()
        while _alive(old[0]) and time.time() - t0 < 10:
            time.sleep(0.05)
        _concurrent(client, 4, 100)  # answered (here or by the pool) while the pool breaks
        h = _ready(client, generation=2)
        new = h["api_worker_pids"]
        assert len(set(new)) == 2 and not set(new) & set(old), (old, new)
        before = {int(p): n for p, n in h["answered_by"].items()}
        _concurrent(client, 8, 200)
        after = {int(p): n for p, n in client.get("/api/health").json()["answered_by"].items()}
        grew = {p for p in after if after[p] > before.get(p, 0)}
        assert grew and grew <= set(new), (grew, new)


def test_refusals_from_a_worker_are_422_naming_the_client_file_and_uploads_are_deleted(tmp_path, monkeypatch):
    import glob
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's uploads only (tests run in parallel)

    def uploads() -> set[str]:
        return set(glob.glob(os.path.join(tempfile.gettempdir(), "kvhit-upload-*")))

    with TestClient(create_app(api_workers=2)) as client:
        h = _ready(client)
        before = uploads()
        # refused by the service's answer (in a worker), not by the request model (checked in the server first)
        r = client.post("/api/kv", json={"model": "qwen3-8b", "tp": 1024})
        assert r.status_code == 422 and r.json()["detail"].startswith("--tp: 1024 does not divide"), r.text
        cfg = json.dumps({"num_hidden_layers": 32}).encode()  # a config.json without the attention shape
        r = client.post(
            "/api/kv", data={"request": json.dumps({"kv_gb": 10})}, files={"model_config": ("mine.json", cfg)}
        )
        assert r.status_code == 422, r.text
        assert "mine.json" in r.json()["detail"] and "kvhit-upload-" not in r.text, r.text
        good = json.dumps(
            {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
        ).encode()
        r = client.post(
            "/api/kv", data={"request": json.dumps({"kv_gb": 10})}, files={"model_config": ("mine.json", good)}
        )
        assert r.status_code == 200, r.text
        assert uploads() <= before
        by = client.get("/api/health").json()["answered_by"]
        assert str(h["server_pid"]) not in by and sum(by.values()) >= 1, by  # the worker answered (and refused)


def test_api_workers_0_answers_in_the_server_and_health_says_so():
    with TestClient(create_app(api_workers=0)) as client:
        h = client.get("/api/health").json()
        assert h["api_workers"] == 0 and not h["api_workers_ready"] and h["warm"]
        r = client.post("/api/estimate", json={"N": [100, 1000], "lam0": 1.0, **SCM})
        assert r.status_code == 200
        assert client.get("/api/health").json()["answered_by"] == {str(h["server_pid"]): 1}


@pytest.mark.parametrize(
    ("command", "fields"),
    [
        ("estimate", {"N": N, "lam0": 0.7, **SCM}),
        ("estimate", {"N": [1, 10, 10**7], "lam0": 1e-9, **SCM}),  # extremes: T_C undefined or huge
        ("kv", {"model": "qwen3-8b", "accelerator": "H100"}),
        ("plan", {"engine": "paper", "kv_gb": 40, "target": 0.3, "lam0": 1.0, **SCM}),
    ],
)
def test_json_bytes_are_the_strict_json_reference(command, fields):
    from kvhit.service.registry import run

    res = run(command, fields)
    assert json.loads(res.to_json_bytes()) == json.loads(res.to_json())


class _Odd(Response):
    x: float
    xs: list[float]
    extra: dict[str, Any]


def test_json_bytes_non_finite_null_and_numpy_fall_back():
    r = _Odd(x=math.nan, xs=[1.5, math.inf, -math.inf], extra={"a": np.float64(2.5), "b": float("nan")})
    assert json.loads(r.to_json_bytes()) == {"x": None, "xs": [1.5, None, None], "extra": {"a": 2.5, "b": None}}
    # a numpy integer / array in an Any field: pydantic cannot write it; the strict_json path does
    r = _Odd(x=1.0, xs=[], extra={"n": np.int64(3), "v": np.array([1.0, np.nan]), "ok": np.bool_(True)})
    assert json.loads(r.to_json_bytes()) == {"x": 1.0, "xs": [], "extra": {"n": 3, "v": [1.0, None], "ok": True}}
    assert b"NaN" not in r.to_json_bytes()


def test_json_bytes_keep_a_reshaped_answer():
    class Flat(Response):
        curves: dict[str, list[float]]

        def to_jsonable(self) -> Any:
            return {"flat": True, **super().to_jsonable()["curves"]}

    assert json.loads(Flat(curves={"a": [1.0]}).to_json_bytes()) == {"flat": True, "a": [1.0]}
