"""``POST /api/planner`` (issue 24 item 3: one request per slider move): its three parts equal, value for value,
the answers of the three endpoints the page asked before (``/api/kv``, ``/api/estimate``, ``/api/plan`` with the
paper's estimator) for the same inputs — over HTTP, on the SCM, on the bundled ShareGPT trace and with an uploaded
config.json — and bad input is a one-line 422/413 naming the field, uploads deleted."""

from __future__ import annotations

import json
import tempfile
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit import service as svc
from kvhit.web import create_app

SCM = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}
GRID = np.unique(np.geomspace(100, 100_000, 200).astype(int)).tolist()  # the page's grid(200)
CFG = json.dumps(
    {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
).encode()


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(workers=1)) as c:
        yield c


def wait(client, job, timeout=240):
    t0 = time.time()
    while job["status"] in ("queued", "running"):
        assert time.time() - t0 < timeout, f"job did not end: {job}"
        time.sleep(0.1)
        job = client.get(f"/api/jobs/{job['id']}").json()
    assert job["status"] == "done", job
    return job["result"]


def post(client, path, body, files=None):
    if files:
        r = client.post(path, data={"request": json.dumps(body)}, files=files)
    else:
        r = client.post(path, json=body)
    if r.status_code == 202:
        return wait(client, r.json())
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(
    "hw",
    [
        {"accelerator": "H100"},
        {"model": "llama-3.1-8b", "kv_gb": 12.5, "tp": 2},
        {"accelerator": "H200", "gpu_memory_utilization": 0.8, "block_size": 16, "dtype": "fp8"},
    ],
)
@pytest.mark.parametrize("lam0", [0.5, 3.7])
def test_planner_equals_the_three_endpoints_on_the_scm(client, hw, lam0):
    spec = {**SCM, "lam0": lam0}
    got = post(client, "/api/planner", {"N": GRID, "target": 0.3, **spec, **hw})
    assert got["kv"] == post(client, "/api/kv", hw)
    assert got["estimate"] == post(client, "/api/estimate", {"N": GRID, **spec})
    assert got["plan"] == post(client, "/api/plan", {"engine": "paper", "target": 0.3, **spec, **hw})
    # and the numbers are the library's, not echoes of each other: h at the budget from the closed form
    assert got["plan"]["h_at_capacity"] == pytest.approx(
        svc.estimate(svc.build(svc.EstimateRequest, N=[got["kv"]["N"]], **spec)).estimates[0].h, rel=1e-12
    )


def test_planner_equals_the_endpoints_on_sharegpt(client):
    got = post(client, "/api/planner", {"sharegpt": True, "kv_gb": 40, "target": 0.3})
    assert got["estimate"] is None
    assert got["kv"] == post(client, "/api/kv", {"kv_gb": 40})
    assert got["plan"] == post(client, "/api/plan", {"engine": "paper", "sharegpt": True, "kv_gb": 40, "target": 0.3})


def test_planner_with_an_uploaded_config_equals_the_endpoints(client, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    files = {"model_config": ("mine.json", CFG)}
    got = post(client, "/api/planner", {"kv_gb": 10, "target": 0.2, **SCM}, files)
    assert got["kv"]["model"] == "mine" and got["estimate"] is None
    assert got["kv"] == post(client, "/api/kv", {"kv_gb": 10}, files)
    assert got["plan"] == post(client, "/api/plan", {"engine": "paper", "kv_gb": 10, "target": 0.2, **SCM}, files)
    assert list(tmp_path.glob("kvhit-upload-*")) == []  # the sync answer's upload is deleted


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lam0=st.floats(0.01, 50),
    mean_turns=st.floats(1, 20),
    x_mean=st.floats(1, 50),
    y_mean=st.floats(1, 50),
    w_mean=st.floats(1, 1000),
    kv_gb=st.floats(0.5, 200),
    target=st.floats(0.01, 0.99),
    N=st.lists(st.integers(1, 10**7), min_size=1, max_size=20),
)
def test_planner_parts_are_the_service_answers(lam0, mean_turns, x_mean, y_mean, w_mean, kv_gb, target, N):
    """Each part is its command's answer, or the planner refuses with the first part's own refusal (kv, estimate,
    plan in that order)."""
    spec = {"lam0": lam0, "mean_turns": mean_turns, "x_mean": x_mean, "y_mean": y_mean, "w_mean": w_mean}
    parts = [
        lambda: svc.kv(svc.build(svc.KvRequest, kv_gb=kv_gb)),
        lambda: svc.estimate(svc.build(svc.EstimateRequest, N=N, **spec)),
        lambda: svc.plan(svc.build(svc.PlanRequest, engine="paper", kv_gb=kv_gb, target=target, **spec)),
    ]
    want = []
    for part in parts:
        try:
            want.append(part().to_jsonable())
        except svc.InputError as e:
            with pytest.raises(svc.InputError) as got:
                svc.planner(svc.build(svc.PlannerRequest, N=N, kv_gb=kv_gb, target=target, **spec))
            assert str(got.value) == str(e)
            return
    got = svc.planner(svc.build(svc.PlannerRequest, N=N, kv_gb=kv_gb, target=target, **spec)).to_jsonable()
    assert [got["kv"], got["estimate"], got["plan"]] == want


BAD = [
    ({"N": GRID, "target": 0.3, **SCM, "lam0": -1, "accelerator": "H100"}, 422, "lam0", "--lam0"),
    ({"N": [0], "accelerator": "H100", **SCM}, 422, "N", "--N[0]"),
    ({"N": [100], "sharegpt": True, "kv_gb": 10}, 422, "N", "not of ShareGPT"),
    ({"sharegpt": True, "kv_gb": 10, **SCM}, 422, "mean_turns", "--mean-turns: applies to a spec, not to --sharegpt"),
    ({"N": [100], "accelerator": "H100", "kv_gb": 3, **SCM}, 422, "accelerator", "--gpu and --kv-gb"),
    ({"N": [100], "model": "no-such-model", "kv_gb": 3, **SCM}, 422, "model", "--model"),
    ({"N": [100], "tp": 3, "kv_gb": 3, **SCM}, 422, "tp", "--tp"),
    ({"N": [100], "kv_gb": 3, "target": 1.5, **SCM}, 422, "target", "--target"),
    ({"N": [100], "kv_gb": 3, **SCM, "x_mean": True}, 422, "x_mean", "x_mean: expected"),
    ({"N": [100], "kv_gb": 3, **SCM, "engine": "vllm"}, 422, "engine", "unknown field"),
    ({"N": [100], "lam0": 1.0}, 422, None, "missing flag(s)"),
    ({"N": [100], "kv_gb": 3, **SCM, "spec": "/etc/passwd"}, 422, "spec", "over HTTP"),
    ({"N": list(range(1, 10_002)), "kv_gb": 3, **SCM}, 413, "N", "10,000"),
]


@pytest.mark.parametrize(("body", "status", "field", "says"), BAD)
def test_bad_input_is_refused_in_one_line_naming_the_field(client, body, status, field, says):
    r = client.post("/api/planner", json=body)
    assert r.status_code == status, r.text
    d = r.json()
    assert says in d["detail"] and "\n" not in d["detail"], d
    assert d["field"] == field


def test_a_trace_upload_is_not_a_planner_part(client, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = client.post("/api/planner", data={"request": json.dumps({"kv_gb": 3})}, files={"trace": ("t.parquet", b"x")})
    assert r.status_code == 422 and r.json()["field"] == "trace" and "model_config" in r.json()["detail"]
    bad = {"request": json.dumps({"kv_gb": -1})}
    r = client.post("/api/planner", data=bad, files={"model_config": ("c.json", CFG)})
    assert r.status_code == 422 and r.json()["field"] == "kv_gb"
    assert list(tmp_path.glob("kvhit-upload-*")) == []
