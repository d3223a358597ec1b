"""Tables never truncate a number in an 80-column terminal or a pipe: no ellipsis, no line past the width, and
every number of the JSON answer appears whole in the table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from clihelp import kvhit

ROOT = Path(__file__).resolve().parents[1]
SCM = str(ROOT / "examples" / "scm.toml")
MOONCAKE = str(ROOT / "tests" / "data" / "production" / "mooncake_small.jsonl")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("out") / "t.parquet"
    assert kvhit("trace", "generate", "--spec", SCM, "-n", "1000", "-o", p).code == 0
    return p


def _commands(trace):
    return [
        ["estimate", "--spec", SCM, "--N", "1000,2275,10000", "--engine", "vllm"],
        ["simulate", "--trace", trace, "--N", "100,1000,123456", "--policy", "block"],
        ["simulate", "--blocks-trace", MOONCAKE, "--N", "300,3000"],
        ["plan", "--trace", trace, "--kv-gb", "40", "--target", "0.3", "--compare", "vllm-0.23"],
        ["curve", "--trace", trace, "--points", "12"],
        ["trace", "stats", trace],
        ["kv", "--model", "llama-3.1-70b", "--gpu", "H200", "--tp", "4"],
    ]


@pytest.mark.parametrize("k", range(7))
def test_tables_fit_80_columns_and_never_truncate(trace, k):
    args = _commands(trace)[k]
    r = kvhit(*args)
    assert r.code == 0, r.err
    assert "…" not in r.out
    assert max(len(line) for line in r.out.splitlines()) <= 80
    j = kvhit(*args, "--json")
    data = json.loads(j.out)

    def numbers(o):
        if isinstance(o, dict):
            for v in o.values():
                yield from numbers(v)
        elif isinstance(o, list):
            for v in o:
                yield from numbers(v)
        elif isinstance(o, float) and 0 < abs(o) < 1:
            yield o

    text = re.sub(r"\s+", " ", r.out)
    values = list(numbers(data))
    if values:  # (kv prints integers only)
        assert any(f"{x:.4f}" in text for x in values), "the table shows the answer's numbers with 4 decimals"
