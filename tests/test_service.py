"""The service layer used directly (as the web API of issue 14 will): requests validate at construction and
round-trip through JSON, responses are strict JSON, the memory rule sits exactly where it says."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvhit import service as svc
from kvhit.service import base

ROOT = Path(__file__).resolve().parents[1]


def test_memory_rule_boundary(monkeypatch):
    monkeypatch.setattr(base, "available_memory_bytes", lambda: 64 * 2**30)
    half_blocks = 32 * 2**30 // base.BLOCK_SIM_BYTES_PER_BLOCK
    base.check_capacity_memory(half_blocks, "--N")  # exactly half of memory: allowed
    with pytest.raises(svc.InputError, match=r"^--N: a capacity of 1,073,741,825 blocks needs 32\.0 GiB"):
        base.check_capacity_memory(half_blocks + 1, "--N")


def test_requests_validate_and_round_trip_json():
    req = svc.build(svc.EstimateRequest, spec=ROOT / "examples" / "scm.toml", N=["1000", 2275])
    assert req.N == [1000, 2275]
    again = svc.EstimateRequest.model_validate_json(req.model_dump_json())
    assert again == req
    with pytest.raises(svc.InputError, match=r"^--N\[0\]: .*integer.*2275\.5"):
        svc.build(svc.EstimateRequest, N=[2275.5])
    with pytest.raises(svc.InputError, match=r"^--lam0: .*finite"):
        svc.build(svc.EstimateRequest, N=[1], lam0=math.inf)
    with pytest.raises(svc.InputError, match=r"^--bogus: unknown field"):
        svc.build(svc.EstimateRequest, N=[1], bogus=1)


def test_every_request_field_documents_itself():
    for name in dir(svc):
        model = getattr(svc, name)
        if isinstance(model, type) and issubclass(model, svc.Request) and model is not svc.Request:
            for field, info in model.model_fields.items():
                assert info.description, f"{name}.{field} has no description"


def test_responses_are_strict_json():
    res = svc.estimate(svc.build(svc.EstimateRequest, spec=ROOT / "examples" / "scm.toml", N=[1000]))
    d = json.loads(res.to_json(), parse_constant=lambda c: pytest.fail(c))
    assert d["moments"]["h_max"] == pytest.approx(0.75)
    assert (
        base.strict_json({"x": float("nan"), "y": [float("inf"), 1.5]})
        == '{\n  "x": null,\n  "y": [\n    null,\n    1.5\n  ]\n}'
    )


def test_errors_are_one_line():
    assert svc.InputError("a\n\n  b \n").args[0] == "a; b"
    assert str(svc.InputError("")) == "invalid input"


def test_translating_names_where():
    with pytest.raises(svc.InputError, match=r"^--spec x\.toml: boom$"):
        with svc.translating("--spec x.toml"):
            raise ValueError("boom")
    with pytest.raises(svc.InputError, match=r"^f\.json: no such file$"):
        with svc.translating("--model"):
            raise FileNotFoundError(2, "No such file", "f.json")
    with pytest.raises(svc.InputError, match=r"^--model: a value is too large"):
        with svc.translating("--model"):
            raise OverflowError("int too large")
    with pytest.raises(TypeError):  # a bug stays a traceback
        with svc.translating("--model"):
            raise TypeError("bug")


def test_atomic_write_respects_the_umask_and_replaces(tmp_path):
    import os

    from kvhit.service.io import atomic_write_text

    old = os.umask(0o027)
    try:
        p = atomic_write_text(tmp_path / "a" / "b.txt", "x")
        assert p.read_text() == "x" and p.stat().st_mode & 0o777 == 0o640
        atomic_write_text(p, "y")
        assert p.read_text() == "y" and sorted(x.name for x in p.parent.iterdir()) == ["b.txt"]
    finally:
        os.umask(old)
