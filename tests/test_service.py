"""The service layer used directly (as the web API of issue 14 will): requests validate at construction and
round-trip through JSON, responses are strict JSON, the memory rule sits exactly where it says."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings

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


def _jsonable_reference(o):
    """The isinstance-chain form of kvhit.service.base.jsonable before its exact-type fast path (a slow reference)."""
    import math
    import os

    import numpy as np
    from pydantic import BaseModel

    if isinstance(o, BaseModel):
        return _jsonable_reference(o.model_dump(mode="python"))
    if isinstance(o, dict):
        return {str(k): _jsonable_reference(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_jsonable_reference(v) for v in o]
    if isinstance(o, np.ndarray):
        return [_jsonable_reference(v) for v in o.tolist()]
    if isinstance(o, bool | np.bool_):
        return bool(o)
    if isinstance(o, int | np.integer):
        return int(o)
    if isinstance(o, float | np.floating):
        x = float(o)
        return x if math.isfinite(x) else None
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    if o is None or isinstance(o, str):
        return o
    if hasattr(o, "to_dict"):
        return _jsonable_reference(o.to_dict())
    raise TypeError(type(o).__name__)


def _json_values():
    import numpy as np
    from hypothesis import strategies as st

    leaf = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=5), st.floats(allow_nan=True).map(np.float64), st.integers(-100, 100).map(np.int64),
        st.booleans().map(np.bool_), st.lists(st.floats(allow_nan=True), max_size=4).map(np.array),
    )  # fmt: skip
    return st.recursive(
        leaf,
        lambda ch: st.one_of(
            st.lists(ch, max_size=4),
            st.lists(ch, max_size=4).map(tuple),
            st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 9)), ch, max_size=4),
        ),
        max_leaves=20,
    )


@settings(max_examples=300, deadline=None)
@given(_json_values())
def test_jsonable_fast_path_equals_the_isinstance_chain(o):
    from kvhit.service.base import jsonable

    a, b = jsonable(o), _jsonable_reference(o)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert [type(x) for x in _leaves(a)] == [type(x) for x in _leaves(b)]


def _leaves(o):
    if isinstance(o, dict):
        return [x for k in sorted(o) for x in _leaves(o[k])]
    if isinstance(o, list):
        return [x for v in o for x in _leaves(v)]
    return [o]
