"""Every refused input the issue (#10) lists, by hand: exit 2, one stderr line naming the flag/file/field, no
traceback, no output and no temporary left behind. Each case failed (traceback, exit 0/1, or a silently
different answer) before the service layer; run with ``KVHIT_CLI_SUBPROCESS=1 PYTHONPATH=<old>/src`` to see."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from clihelp import assert_refused, kvhit

SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]
ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = str(ROOT / "tests" / "data" / "production" / "mooncake_small.jsonl")
SCM_TOML = str(ROOT / "examples" / "scm.toml")


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tr") / "t.parquet"
    r = kvhit("trace", "generate", *SCM, "-n", "300", "--seed", "1", "-o", out)
    assert r.code == 0, r.err
    return out


def no_leftovers(d: Path) -> None:
    left = [p.name for p in d.rglob("*") if p.suffix == ".tmp" or p.name.endswith(".tmp")]
    assert not left, left


# -- tracebacks before -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, needles",
    [
        (["estimate", *SCM, "--N", "inf"], ["--N"]),
        (["estimate", "--lam0", "inf", *SCM[2:], "--N", "100"], ["--lam0"]),
        (["simulate", *SCM, "--N", "nan", "-n", "100"], ["--N"]),
        (["estimate", *SCM, "--w-dist", "gamma", "--w-cv", "0", "--N", "100"], ["--w-cv"]),
    ],
)
def test_non_finite_and_zero_cv(args, needles):
    assert_refused(kvhit(*args), *needles)


def test_warmup_longer_than_trace(small_trace):
    assert_refused(kvhit("simulate", "--trace", small_trace, "--N", "100", "--warmup-time", "1e9"), "--warmup-time")
    assert_refused(kvhit("trace", "stats", small_trace, "--warmup", "100000"), "--warmup")
    assert_refused(kvhit("simulate", "--trace", small_trace, "--N", "100", "--warmup", "300"), "--warmup")


def test_output_path_is_a_directory_or_a_file(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    assert_refused(kvhit("trace", "generate", *SCM, "-n", "10", "-o", d), "--out", "directory")
    f = tmp_path / "afile"
    f.write_text("x")
    assert_refused(kvhit("reproduce", "--quick", "-o", f), "--out", "afile")
    assert_refused(kvhit("trace", "generate", *SCM, "-n", "10", "-o", f / "t.parquet"), "--out")
    assert f.read_text() == "x"
    no_leftovers(tmp_path)


def test_reproduce_out_checked_before_computing(tmp_path):
    import time

    f = tmp_path / "f"
    f.write_text("")
    t0 = time.perf_counter()
    assert_refused(kvhit("reproduce", "-o", f), "--out")
    assert time.perf_counter() - t0 < 5  # refused before the minutes of computing


def test_memory_a_request_needs_is_refused_before_allocating(small_trace):
    assert_refused(kvhit("curve", "--trace", small_trace, "--n-max", str(10**12), "--points", "5"), "--n-max")
    assert_refused(kvhit("plan", *SCM, "--kv-gb", "1e12"), "--kv-gb")
    assert_refused(kvhit("kv", "--kv-gb", "1e12"), "--kv-gb")
    assert_refused(kvhit("simulate", "--trace", small_trace, "--policy", "block", "--N", str(10**12)), "--N")


# -- silently accepted before ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, needles",
    [
        (["simulate", *SCM, "--N", "100", "-n", "100", "-r", "0"], ["--replications"]),
        (["simulate", *SCM, "--N", "100", "-n", "100", "--warmup", "-5"], ["--warmup"]),
        (["simulate", *SCM, "--N", "100", "-n", "100", "--block-size", "0", "--policy", "block"], ["--block-size"]),
        (["simulate", *SCM, "--N", "2275.5", "-n", "100"], ["--N", "2275.5"]),
        (["estimate", *SCM, "--N", "100.5"], ["--N"]),
        (["estimate", *SCM], ["--N", "required"]),
        (["simulate", *SCM, "-n", "100"], ["--N", "required"]),
        (["kv", "--block-size", "0"], ["--block-size"]),
        (["kv", "--model", "llama-3.1-70b", "--tp", "3"], ["--tp", "8 KV heads"]),
        (["plan", *SCM, "--kv-gb", "40", "--tp", "3", "--model", "llama-3.1-70b"], ["--tp"]),
        (["plan", *SCM, "--kv-gb", "40", "--engine", "paper", "--metric", "tokens"], ["--metric"]),
    ],
)
def test_silent_coercions_are_refused(args, needles):
    assert_refused(kvhit(*args), *needles)


def test_trace_with_spec_is_refused(small_trace):
    r = kvhit("simulate", "--trace", small_trace, "--spec", SCM_TOML, "--N", "100")
    assert_refused(r, "--trace", "--spec")
    assert_refused(kvhit("curve", "--trace", small_trace, "--spec", SCM_TOML), "--spec")
    assert_refused(kvhit("plan", "--trace", small_trace, "--spec", SCM_TOML, "--kv-gb", "1"), "--spec")
    assert_refused(kvhit("simulate", "--trace", small_trace, "--p", "0.5", "--N", "100"), "--p")
    assert_refused(kvhit("simulate", "--trace", small_trace, "-r", "3", "--N", "100"), "--replications")


def _toml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "w.toml"
    p.write_text(text)
    return p


BASE = (
    'lam0 = 1.0\n[turns]\nkind = "geometric"\np = 0.5\n[increments]\nkind = "iid"\nz = 3\n'
    '[interarrival]\nkind = "exponential"\nmean = 30\n'
)


@pytest.mark.parametrize(
    "text, needles",
    [
        (BASE.replace("p = 0.5", "p = 0.5\nmena = 3"), ["w.toml", "turns", "mena"]),
        (BASE.replace("mean = 30", "mean = 30\nscale = 2"), ["w.toml", "interarrival", "scale"]),
        (BASE.replace("z = 3", "z = 3\nzz = 1"), ["w.toml", "increments", "zz"]),
        (BASE.replace("lam0 = 1.0", "lam0 = true"), ["w.toml", "lam0"]),
        (BASE.replace("p = 0.5", "p = true"), ["w.toml", "turns", "p"]),
        (BASE.replace("mean = 30", 'mean = "30"'), ["w.toml", "interarrival", "mean"]),
        (BASE.replace("lam0 = 1.0", "lam0 = 1.0\nlamda = 2"), ["w.toml", "lamda"]),
    ],
)
def test_spec_toml_is_strict(tmp_path, text, needles):
    p = _toml(tmp_path, text)
    assert_refused(kvhit("estimate", "--spec", p, "--N", "100"), *needles)


def test_spec_toml_non_utf8_names_the_file(tmp_path):
    p = tmp_path / "w.toml"
    p.write_bytes(BASE.encode().replace(b"geometric", b"geom\xe9tric"))
    assert_refused(kvhit("estimate", "--spec", p, "--N", "100"), "w.toml", "UTF-8")


def test_empty_production_trace_is_refused(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    assert_refused(kvhit("simulate", "--blocks-trace", p, "--N", "100"), "empty.jsonl")
    assert_refused(kvhit("curve", "--blocks-trace", p), "empty.jsonl")


def test_unsorted_mooncake_timestamps_are_noted(tmp_path):
    lines = Path(MOONCAKE).read_text().splitlines()
    p = tmp_path / "unsorted.jsonl"
    p.write_text("\n".join([*lines[1:], lines[0]]) + "\n")  # the first request (t = 0) moved to the end
    r = kvhit("simulate", "--blocks-trace", p, "--N", "1000", "--json")
    assert r.code == 0, r.err
    notes = json.loads(r.out)["notes"]
    assert any("out of time order" in n for n in notes), notes


# -- errors that did not name the file or field -------------------------------------------------------------------


def test_non_utf8_jsonl_names_the_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(Path(MOONCAKE).read_bytes().replace(b'"timestamp"', b'"timest\xffamp"', 1))
    assert_refused(kvhit("simulate", "--blocks-trace", p, "--N", "100"), "bad.jsonl")
    s = tmp_path / "sg.jsonl"
    s.write_bytes(b'{"id": "a", "conversations": [{"from": "human", "value": "h\xffi"}]}\n')
    assert_refused(
        kvhit("trace", "sharegpt", "--source", s, "-o", tmp_path / "o.parquet", "--cache-dir", tmp_path / "c"),
        "sg.jsonl",
    )
    assert not (tmp_path / "o.parquet").exists()


def test_parquet_metadata_not_json_names_the_file(tmp_path, small_trace):
    import pyarrow.parquet as pq

    t = pq.read_table(small_trace)
    meta = dict(t.schema.metadata)
    key = next(k for k in meta if b"kvhit" in k)
    meta[key] = b"{not json"
    p = tmp_path / "badmeta.parquet"
    pq.write_table(t.replace_schema_metadata(meta), p)
    assert_refused(kvhit("trace", "stats", p), "badmeta.parquet")
    assert_refused(kvhit("simulate", "--trace", p, "--N", "10"), "badmeta.parquet")


def test_zero_row_trace_names_the_file(tmp_path, small_trace):
    import pyarrow.parquet as pq

    t = pq.read_table(small_trace)
    p = tmp_path / "zero.parquet"
    pq.write_table(t.slice(0, 0), p)
    assert_refused(kvhit("trace", "stats", p), "zero.parquet")
    assert_refused(kvhit("simulate", "--trace", p, "--N", "10"), "zero.parquet")
    assert_refused(kvhit("curve", "--trace", p), "zero.parquet")


def test_all_malformed_sharegpt_says_why(tmp_path):
    s = tmp_path / "allbad.jsonl"
    s.write_text(
        "\n".join(json.dumps({"id": str(i), "conversations": [{"from": "gpt", "value": "x"}]}) for i in range(5))
    )
    r = kvhit("trace", "sharegpt", "--source", s, "-o", tmp_path / "o.parquet", "--cache-dir", tmp_path / "c")
    assert_refused(r, "allbad.jsonl", "skipped")
    assert not (tmp_path / "o.parquet").exists()


# -- files -------------------------------------------------------------------------------------------------------


def test_sigterm_during_a_write_leaves_no_temporary(tmp_path):
    from kvhit.service.io import atomic_write, install_signal_handlers

    old = signal.getsignal(signal.SIGTERM)
    install_signal_handlers()
    try:

        def w(tmp: str) -> None:
            Path(tmp).write_text("partial")
            os.kill(os.getpid(), signal.SIGTERM)

        with pytest.raises(SystemExit) as e:
            atomic_write(tmp_path / "out.txt", w)
        assert e.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, old)
    assert list(tmp_path.iterdir()) == []


def test_outputs_respect_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "t.parquet"
        assert kvhit("trace", "generate", *SCM, "-n", "20", "-o", out).code == 0
        assert out.stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_missing_parent_directories_are_created_by_every_writer(tmp_path, small_trace):
    r = kvhit("curve", "--trace", small_trace, "--points", "3", "--plot", tmp_path / "new" / "dir" / "c")
    assert r.code == 0, r.err
    assert (tmp_path / "new" / "dir" / "c.png").exists()
    r = kvhit("trace", "generate", *SCM, "-n", "10", "-o", tmp_path / "n2" / "t.parquet")
    assert r.code == 0 and (tmp_path / "n2" / "t.parquet").exists()


def test_refused_request_writes_nothing(tmp_path):
    out = tmp_path / "t.parquet"
    assert_refused(kvhit("trace", "generate", *SCM[:2], "-n", "10", "-o", out), "--p")
    assert not out.exists()
    no_leftovers(tmp_path)


# -- strict JSON --------------------------------------------------------------------------------------------------


def test_json_is_strict_null_for_undefined(small_trace):
    r = kvhit("simulate", "--trace", small_trace, "--N", "1,100", "--json")
    assert r.code == 0, r.err
    assert "NaN" not in r.out and "Infinity" not in r.out
    json.loads(r.out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    r = kvhit("simulate", *SCM, "--N", "100", "-n", "200", "-r", "1", "--json")  # one replication: no CI
    row = json.loads(r.out, parse_constant=lambda c: pytest.fail(c))["rows"][0]
    assert row["h_ci95"] is None and 0 <= row["h"] <= 1
    r = kvhit("curve", "--blocks-trace", MOONCAKE, "--n-min", "300", "--n-max", "3000", "--points", "2", "--json")
    d = json.loads(r.out, parse_constant=lambda c: pytest.fail(c))
    assert d["lam0"] is None
    assert np.isfinite(d["h_max"])


def test_flags_that_would_be_ignored_are_refused():
    assert_refused(kvhit("kv", "--kv-gb", "40", "--gpu-memory-utilization", "0.5"), "--gpu-memory-utilization")
    assert_refused(kvhit("simulate", *SCM, "--N", "10", "--policy", "block", "--weighting", "base"), "--weighting")
    assert_refused(kvhit("simulate", *SCM, "--N", "10", "--colocated"), "--colocated")
    assert_refused(kvhit("estimate", *SCM, "--N", "10", "--w-cv", "0.5"), "--w-cv")
    assert_refused(kvhit("plan", *SCM, "--kv-gb", "1", "--scale", "2"), "--scale")
    assert_refused(kvhit("plan", "--spec", SCM_TOML, "--kv-gb", "40", "--engine", "paper", "--verify"), "--verify")
