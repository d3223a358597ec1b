"""The JSON API of ``kvhit serve`` (kvhit.web) with FastAPI's TestClient: answers equal the service layer's,
every endpoint refuses bad input with 422 naming the field, size limits, jobs (progress, cache, cancel), uploads
(parsed by the CLI's readers, deleted after the job)."""

from __future__ import annotations

import json
import tempfile
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from kvhit import service as svc
from kvhit.web import create_app

SCM = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(workers=2, max_upload=200_000)) as c:
        yield c


def wait(client, job, timeout=240):
    t0 = time.time()
    while job["status"] in ("queued", "running"):
        assert time.time() - t0 < timeout, f"job did not end: {job}"
        time.sleep(0.2)
        job = client.get(f"/api/jobs/{job['id']}").json()
    return job


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("web") / "small.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, out=out, conversations=300, seed=3, **SCM))
    return out


def test_estimate_equals_service(client):
    N = np.unique(np.geomspace(100, 100_000, 1000).astype(int)).tolist()
    r = client.post("/api/estimate", json={"N": N, **SCM})
    assert r.status_code == 200
    want = svc.estimate(svc.build(svc.EstimateRequest, N=N, **SCM)).to_jsonable()
    assert r.json() == want
    assert len(r.json()["estimates"]) == len(N)


def test_kv_and_plan_equal_service(client):
    r = client.post("/api/kv", json={"model": "qwen3-8b", "accelerator": "H100"})
    assert r.status_code == 200
    assert r.json() == svc.kv(svc.build(svc.KvRequest, model="qwen3-8b", accelerator="H100")).to_jsonable()
    body = {"engine": "paper", "kv_gb": 40, "target": 0.3, **SCM}
    r = client.post("/api/plan", json=body)
    assert r.status_code == 200
    assert r.json() == svc.plan(svc.build(svc.PlanRequest, **body)).to_jsonable()


BAD = [
    ("/api/estimate", {"N": [0], **SCM}, "N", "--N[0]"),
    ("/api/estimate", {"N": [10], "lam0": -1}, "lam0", "--lam0"),
    ("/api/estimate", {"N": [10], "lam0": 1.0}, None, "missing flag(s)"),
    ("/api/kv", {"model": "qwen3-8b", "tp": 0}, "tp", "--tp"),
    ("/api/kv", {"model": "no-such-model"}, "model", "--model"),
    ("/api/kv", {"accelerator": "H100", "kv_gb": 3}, "accelerator", "--gpu and --kv-gb"),
    ("/api/plan", {"engine": "paper", "target": 1.5, **SCM}, "target", "--target"),
    ("/api/plan", {"engine": "paper", **SCM}, None, "nothing to plan"),
    ("/api/simulate", {"N": [], **SCM}, "N", "--N: required"),
    ("/api/simulate", {"N": [100], "policy": "fifo", **SCM}, "policy", "--policy"),
    ("/api/curve", {"points": 1, **SCM}, "points", "--points"),
    ("/api/curve", {"n_min": 10.5, **SCM}, "n_min", "--n-min"),
    ("/api/trace/stats", {}, "path", "PATH: required"),
    ("/api/tiers", {"tier": "native"}, "hbm_blocks", "--hbm-blocks: required"),
    ("/api/tiers", {"hbm_blocks": [0]}, "hbm_blocks", "--hbm-blocks[0]"),
    ("/api/trace/block-stats", {}, "path", "PATH: required"),
    ("/api/trace/block-stats", {"rate": 0}, "path", "PATH: required"),
    ("/api/trace/estimate", {"N": [0]}, "N", "--N[0]"),
    ("/api/fleet", {"replicas": [2], "N": [100]}, "trace", "--trace: required"),
    ("/api/stream", {"N": [100], "events": 1000, "chunk": 0, **SCM}, "chunk", "--chunk"),
    ("/api/trace/estimate", {"N": [10], "metric": "bytes"}, "metric", "--metric"),
]


@pytest.mark.parametrize(("path", "body", "field", "says"), BAD)
def test_bad_input_is_422_naming_the_field(client, path, body, field, says):
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    d = r.json()
    assert says in d["detail"] and "\n" not in d["detail"]
    assert d["field"] == field


def test_bad_field_beside_an_upload_is_422_before_any_job(client, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = client.post("/api/trace/stats", data={"request": '{"block": "odd"}'}, files={"path": ("t.parquet", b"x")})
    assert r.status_code == 422 and r.json()["field"] == "block" and "--block" in r.json()["detail"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/simulate", {"N": [10], "trace": "/etc/passwd"}, "trace"),
        ("/api/curve", {"plot": "/tmp/x", **SCM}, "plot"),
        ("/api/trace/stats", {"path": "/etc/passwd"}, "path"),
        ("/api/kv", {"model": "/etc/passwd"}, "model"),
        ("/api/kv", {"model": "config.json"}, "model"),
    ],
)
def test_server_paths_are_refused(client, path, body, field):
    r = client.post(path, json=body)
    assert r.status_code == 422 and r.json()["field"] == field
    assert "over HTTP" in r.json()["detail"] or "not accepted" in r.json()["detail"]


def test_not_json_and_unknown_file_part(client):
    r = client.post("/api/estimate", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("request body: not JSON")
    r = client.post("/api/estimate", data={"request": "{}"}, files={"trace": ("t.parquet", b"x")})
    assert r.status_code == 422 and r.json()["field"] == "trace"


def test_size_limits():
    with TestClient(create_app(max_body=1000, max_upload=100)) as c:
        r = c.post("/api/estimate", json={"N": list(range(1, 1000)), **SCM})
        assert r.status_code == 413 and "1,000 bytes" in r.json()["detail"]
        r = c.post("/api/trace/stats", data={"request": "{}"}, files={"path": ("t.parquet", b"x" * 1000)})
        assert r.status_code == 413 and r.json()["field"] == "path"


def test_curve_job_equals_service_and_is_cached(client):
    body = {"conversations": 300, "n_min": 50, "n_max": 5000, "points": 20, "policies": ["content"], **SCM}
    r = client.post("/api/curve", json=body)
    assert r.status_code == 202 and r.headers["location"] == f"/api/jobs/{r.json()['id']}"
    job = wait(client, r.json())
    assert job["status"] == "done", job
    want = svc.curve(svc.build(svc.CurveRequest, **body)).to_jsonable()
    assert job["result"] == want
    again = client.post("/api/curve", json=body).json()
    assert again["status"] == "done" and again["cached"] and again["result"] == want


def test_uploaded_trace_good_and_bad(client, trace_file, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with open(trace_file, "rb") as f:
        r = client.post("/api/trace/stats", data={"request": "{}"}, files={"path": ("mine.parquet", f)})
    assert r.status_code == 202
    job = wait(client, r.json())
    assert job["status"] == "done", job
    want = svc.trace_stats(svc.build(svc.StatsRequest, path=trace_file)).to_jsonable()
    got = job["result"]
    assert {k: got[k] for k in ("L", "n_turns", "A_R", "A_H_hash", "E_B")} == {
        k: want[k] for k in ("L", "n_turns", "A_R", "A_H_hash", "E_B")
    }
    r = client.post("/api/trace/stats", data={"request": "{}"}, files={"path": ("broken.parquet", b"not parquet")})
    job = wait(client, r.json())
    assert job["status"] == "error"
    assert job["error"].startswith("PATH broken.parquet:") and "\n" not in job["error"]
    assert "kvhit-upload" not in job["error"]
    time.sleep(0.5)
    assert list(tmp_path.iterdir()) == []  # nothing of the uploads kept on disk


def test_cancel_a_running_job(client):
    body = {"N": [2000], "conversations": 10**7, "replications": 50, **SCM}
    job = client.post("/api/simulate", json=body).json()
    assert job["status"] in ("queued", "running")
    r = client.delete(f"/api/jobs/{job['id']}")
    assert r.status_code == 200
    job = wait(client, r.json(), timeout=30)
    assert job["status"] == "cancelled"
    assert client.get("/api/jobs/nope").status_code == 404


def test_docs_page_and_local_plotly(client):
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for p in (
        "/api/estimate",
        "/api/kv",
        "/api/plan",
        "/api/simulate",
        "/api/curve",
        "/api/trace/stats",
        "/api/tiers",
        "/api/trace/block-stats",
        "/api/trace/estimate",
        "/api/fleet",
    ):
        assert p in paths
    page = client.get("/").text
    assert '<script src="/static/plotly.min.js">' in page and "cdn" not in page.lower()
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and len(js.content) > 1_000_000
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/..%2Fapp.py").status_code == 404


def test_serve_refuses_a_bad_port(capsys):
    from kvhit.cli import main

    assert main(["serve", "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err


def test_serve_binds_localhost_and_warns_on_all_interfaces(monkeypatch, capsys):
    import uvicorn

    from kvhit.cli import main

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append(kw))
    assert main(["serve"]) == 0
    assert calls[-1]["host"] == "127.0.0.1" and calls[-1]["port"] == 8765
    assert "warning" not in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--port", "9000"]) == 0
    assert calls[-1]["host"] == "0.0.0.0" and calls[-1]["port"] == 9000
    err = capsys.readouterr().err
    assert "warning" in err and "--host 0.0.0.0" in err


def test_uploaded_production_trace_block_stats(client, tmp_path):
    from pathlib import Path

    src = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces" / "mooncake_fast25"
    src = src / "conversation_trace.jsonl"
    if not src.exists():
        pytest.skip(f"{src}: not here")
    small = tmp_path / "mooncake.jsonl"
    small.write_text("".join(src.read_text().splitlines(keepends=True)[:300]))
    with open(small, "rb") as f:
        r = client.post("/api/trace/block-stats", data={"request": "{}"}, files={"path": ("mooncake.jsonl", f)})
    job = wait(client, r.json())
    assert job["status"] == "done", job
    want = svc.block_stats(svc.build(svc.BlockStatsRequest, path=small)).to_json()
    assert job["result"] == __import__("json").loads(want.replace(str(small), "mooncake.jsonl"))


def test_sharegpt_workload_equals_service(client):
    body = {"engine": "paper", "kv_gb": 40, "target": 0.3, "sharegpt": True}
    r = client.post("/api/plan", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == svc.plan(svc.build(svc.PlanRequest, **body)).to_jsonable()
    assert r.json()["lam0"] == 1.0  # the bundled trace's λ0 (kvhit trace sharegpt's default)
    body = {"sharegpt": True, "n_min": 100, "n_max": 100_000, "points": 50, "policies": ["content"]}
    r = client.post("/api/curve", json=body)
    assert r.status_code == 202, r.text
    job = wait(client, r.json())
    assert job["status"] == "done", job
    assert job["result"] == svc.curve(svc.build(svc.CurveRequest, **body)).to_jsonable()


@pytest.mark.parametrize(
    "path,body,says",
    [
        (
            "/api/plan",
            {"sharegpt": True, "engine": "paper", "kv_gb": 40, "mean_turns": 5},
            "--mean-turns: applies to a spec, not to --sharegpt",
        ),
        ("/api/curve", {"sharegpt": True, "lam0": 2.0}, "--lam0: applies to a spec, not to --sharegpt"),
    ],
)
def test_sharegpt_with_spec_inputs_is_refused(client, path, body, says):
    r = client.post(path, json=body)
    if r.status_code == 202:  # curve is always a job: the refusal is the job's one-line error
        job = wait(client, r.json())
        assert job["status"] == "error", job
        assert job["error"].startswith(says), job
    else:
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith(says)


def test_sharegpt_with_a_trace_is_refused_by_the_service(trace_file):
    with pytest.raises(svc.InputError, match=r"^--sharegpt and --trace: give one workload source, not both$"):
        svc.plan(svc.build(svc.PlanRequest, sharegpt=True, trace=trace_file, engine="paper", kv_gb=40))
    with pytest.raises(svc.InputError, match=r"^--sharegpt and --trace: give one workload source"):
        svc.curve(svc.build(svc.CurveRequest, sharegpt=True, trace=trace_file))


def test_uploaded_trace_fleet_equals_service(client, trace_file):
    fields = {"replicas": [1, 2], "N": [300], "router": ["round-robin", "session"], "block_size": 16}
    with open(trace_file, "rb") as f:
        r = client.post("/api/fleet", data={"request": json.dumps(fields)}, files={"trace": ("small.parquet", f)})
    assert r.status_code == 202, r.text
    job = wait(client, r.json())
    assert job["status"] == "done", job["error"]
    want = svc.fleet_simulate(svc.build(svc.FleetRequest, trace=trace_file, **fields)).to_jsonable()
    got = job["result"]
    assert got["rows"] == want["rows"]


def test_uploaded_trace_stream_equals_service(client, trace_file):
    fields = {"N": [100, 1000], "chunk": 97}
    with open(trace_file, "rb") as f:
        r = client.post("/api/stream", data={"request": json.dumps(fields)}, files={"trace": ("small.parquet", f)})
    assert r.status_code == 202, r.text
    job = wait(client, r.json())
    assert job["status"] == "done", job["error"]
    want = svc.stream(svc.build(svc.StreamRequest, trace=trace_file, **fields)).to_jsonable()
    assert job["result"]["rows"] == want["rows"] and job["result"]["events"] == want["events"]


def test_plan_compare_sglang_job_equals_service(client):
    body = {"engine": "vllm", "kv_gb": 2, "compare": "sglang", "page_size": 4, **SCM}
    r = client.post("/api/plan", json=body)
    assert r.status_code == 202, r.text  # an engine-aware plan runs as a job
    job = wait(client, r.json())
    assert job["status"] == "done", job
    assert job["result"] == svc.plan(svc.build(svc.PlanRequest, **body)).to_jsonable()
    c = job["result"]["compare"]
    assert c["engine"] == "sglang" and c["page_size"] == 4 and "difference" in c
    assert 'value="sglang"' in client.get("/").text  # the page offers it


def test_uploaded_trace_fleet_plan_equals_service(client, trace_file):
    fields = {"target": 0.3, "N": 300, "router": ["round-robin", "session"], "block_size": 16, "max_replicas": 4}
    with open(trace_file, "rb") as f:
        r = client.post("/api/fleet/plan", data={"request": json.dumps(fields)}, files={"trace": ("small.parquet", f)})
    assert r.status_code == 202, r.text
    job = wait(client, r.json())
    assert job["status"] == "done", job["error"]
    want = svc.fleet_plan(svc.build(svc.FleetPlanRequest, trace=trace_file, **fields)).to_jsonable()
    assert job["result"]["answers"] == want["answers"] and job["result"]["rows"] == want["rows"]
    with open(trace_file, "rb") as f:
        bad = {"request": json.dumps({**fields, "target": 2})}
        r = client.post("/api/fleet/plan", data=bad, files={"trace": ("small.parquet", f)})
    assert r.status_code == 422 and r.json()["field"] == "target"
