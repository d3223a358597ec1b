"""Robustness of the JSON API (issue 24): strict JSON types, content types, nesting, size limits quoted as a
person reads them, uploads deleted on every path, and no request answered with a 500 (hypothesis)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.web import create_app

SCM = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(workers=1, max_upload=200_000), raise_server_exceptions=False) as c:
        yield c


def uploads() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("kvhit-upload-*")}


def test_deeply_nested_json_is_422(client):
    r = client.post("/api/estimate", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "nested too deeply" in r.json()["detail"]


@pytest.mark.parametrize(
    "body, field, says",
    [
        ({"N": [100], **SCM, "x_mean": True}, "x_mean", "got true"),
        ({"N": [True], **SCM}, "N", "got true"),
        ({"N": [100], **SCM, "lam0": "2"}, "lam0", 'the string "2"'),
        ({"N": ["100"], **SCM}, "N", 'the string "100"'),
    ],
)
def test_json_types_are_strict(client, body, field, says):
    r = client.post("/api/estimate", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and says in r.json()["detail"]


def test_booleans_where_booleans_belong_still_work(client):
    r = client.post("/api/curve", json={"estimates": False, "conversations": 200, "n_max": 500, **SCM})
    assert r.status_code == 202


def test_text_plain_body_is_refused(client):
    r = client.post("/api/estimate", content=json.dumps({"N": [100], **SCM}), headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in r.json()["detail"]


def test_multipart_field_over_1_mib_is_413(client):
    r = client.post("/api/estimate", data={"request": "x" * (1 << 20 + 1)}, files={"none": ("a", b"")})
    assert r.status_code == 413 and "1 MiB" in r.json()["detail"]


def test_413_texts_quote_mib():
    with TestClient(create_app(max_upload=512 << 20)) as c:
        big = 3 * (512 << 20) + (1 << 20) + 1
        r = c.post("/api/trace/stats", content=b"", headers={"content-type": "multipart/form-data; boundary=x",
                                                             "content-length": str(big)})  # fmt: skip
        assert r.status_code == 413
        assert "512 MiB per file" in r.json()["detail"] and "1,611,661,312" not in r.json()["detail"]
        r = c.post("/api/estimate", content=b"{}", headers={"content-type": "application/json",
                                                            "content-length": str(2 << 20)})  # fmt: skip
        assert r.status_code == 413 and "1 MiB" in r.json()["detail"]


def test_oversized_estimate_is_capped(client):
    r = client.post("/api/estimate", json={"N": list(range(1, 10_002)), **SCM})
    assert r.status_code == 413 and r.json()["field"] == "N" and "10,000" in r.json()["detail"]
    r = client.post("/api/estimate", json={"N": list(range(1, 10_001)), **SCM})
    assert r.status_code == 200


def test_config_upload_to_sync_kv_is_deleted(client, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's uploads only (tests run in parallel)
    cfg = json.dumps(
        {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    ).encode()
    before = uploads()
    r = client.post("/api/kv", data={"request": json.dumps({"kv_gb": 10})}, files={"model_config": ("c.json", cfg)})
    assert r.status_code == 200, r.text
    r = client.post("/api/kv", data={"request": json.dumps({"kv_gb": 10})}, files={"model_config": ("c.json", cfg)})
    assert r.status_code == 200  # the cached answer: its upload is deleted too
    r = client.post("/api/kv", data={"request": json.dumps({"kv_gb": -1})}, files={"model_config": ("c.json", cfg)})
    assert r.status_code == 422
    assert uploads() <= before


def test_job_uploads_are_deleted_at_shutdown(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's uploads only (tests run in parallel)
    before = uploads()
    with TestClient(create_app(workers=1)) as c:
        body = {"conversations": 100_000, "n_max": 500_000, "policies": ["content"], **SCM}
        r = c.post("/api/curve", json=body)  # keeps the one worker busy
        assert r.status_code == 202
        blob = b"PAR1" + os.urandom(100)
        r = c.post("/api/curve", data={"request": json.dumps({"n_max": 500})}, files={"trace": ("t.parquet", blob)})
        assert r.status_code in (202, 422)
    assert uploads() <= before


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_FIELDS = ["N", "lam0", "mean_turns", "p", "x_mean", "y_mean", "w_mean", "w_dist", "model", "tp", "kv_gb",
           "accelerator", "engine", "target", "spec", "trace"]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from(["/api/estimate", "/api/kv", "/api/plan", "/api/planner"]),
    body=st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6) | _json,
)
def test_no_request_is_a_500(client, path, body):
    r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert isinstance(r.json()["detail"], str) and "\n" not in r.json()["detail"]


def test_first_chart_is_persisted_across_restarts(tmp_path):
    """The page's first question (bundled ShareGPT, vLLM ≥ 0.24) is answered once per kvhit version and block size:
    a restarted server serves it from the persisted answer at once, equal to the computed one."""
    from kvhit.web.app import FIRST_CHART

    with TestClient(create_app(workers=1, persist=tmp_path)) as c:
        job = c.post("/api/curve", json=FIRST_CHART).json()
        while job["status"] in ("queued", "running"):
            time.sleep(0.3)
            job = c.get(f"/api/jobs/{job['id']}").json()
        assert job["status"] == "done" and not job["cached"]
    assert len(list(tmp_path.glob("*.json"))) == 1
    with TestClient(create_app(workers=1, persist=tmp_path)) as c:
        again = c.post("/api/curve", json=FIRST_CHART).json()
        assert again["status"] == "done" and again["cached"] is True
        assert again["result"] == job["result"]
        other = {**FIRST_CHART, "model": "llama-3.1-8b"}  # the page no longer sends a model: nothing else is reused
        assert c.post("/api/curve", json=other).json()["status"] in ("queued", "running")
