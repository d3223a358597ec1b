"""The first chart answered ahead of time (``make venv`` → ``python -m kvhit.web.prepare``): it is stored under
the very key ``kvhit serve`` looks up, so the page's first request is a cache hit computing nothing; an answer
already there is kept; the key carries a hash of kvhit's source (an answer of other code is never served)."""

from __future__ import annotations

import importlib

from fastapi.testclient import TestClient

from kvhit.web.app import FIRST_CHART, _digest, create_app
from kvhit.web.prepare import main, prepare


class _Fake:
    def to_jsonable(self):
        return {"fake": True}


def test_prepared_first_chart_is_served_without_computing(tmp_path, monkeypatch):
    reg = importlib.import_module("kvhit.service.registry")
    calls = []
    monkeypatch.setattr(reg, "run", lambda c, f, progress=None: calls.append((c, dict(f))) or _Fake())
    files = prepare(tmp_path)
    assert calls == [("curve", FIRST_CHART)]
    assert [f.name for f in files] == [f"{_digest('curve', FIRST_CHART).hexdigest()}.json"]
    assert prepare(tmp_path) == files and len(calls) == 1  # kept, not recomputed
    sized = prepare(tmp_path, block_sizes=(64,))
    assert calls[-1] == ("curve", {**FIRST_CHART, "block_size": 64}) and sized[0] != files[0]
    with TestClient(create_app(workers=1, persist=tmp_path)) as c:
        r = c.post("/api/curve", json=FIRST_CHART)
        assert r.status_code == 202
        job = r.json()
        assert job["status"] == "done" and job["cached"] is True and job["result"] == {"fake": True}


def test_key_follows_the_source(monkeypatch):
    app = importlib.import_module("kvhit.web.app")
    k0 = _digest("curve", FIRST_CHART).hexdigest()
    monkeypatch.setattr(app, "_code_fingerprint", lambda: "other code")
    assert app._digest("curve", FIRST_CHART).hexdigest() != k0


def test_bad_block_size_is_one_line_exit_2(capsys):
    assert main(["--block-size", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --block-size:") and "'0'" in err
    assert main(["--nope"]) == 2
