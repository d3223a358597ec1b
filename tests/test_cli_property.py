"""Property-based: every command and every reader, driven with generated bad values and mutated files.

For a bad flag value: exit status 2, exactly one stderr line that names the flag, no traceback, no output file
and no temporary left behind. For a mutated input file (truncated, bytes flipped, non-UTF-8, fields deleted,
retyped or renamed): the command either still succeeds (the mutation was harmless) or refuses the same way,
naming the file — never a traceback or exit 1. Examples are derandomized (reproducible) and bounded so the test
takes a minute or two.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clihelp import kvhit

SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]
DATA = Path(__file__).parent / "data"
SETTINGS = dict(
    deadline=None,
    derandomize=not os.environ.get("KVHIT_HYPOTHESIS_RANDOM"),
    suppress_health_check=list(HealthCheck),
    database=None,
    print_blob=False,
)

# -- bad values by kind ------------------------------------------------------------------------------------------

_text = st.text(alphabet="abcxyz_-.", min_size=1, max_size=6)
_nonfinite = st.sampled_from(["inf", "-inf", "nan", "1e400", "abc", ""])


def bad_pos_float(hi: float | None = None, lo_inclusive: bool = False):
    """Not a finite number > 0 (≥ 0 when ``lo_inclusive``), or above ``hi``."""
    lo = (
        st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False)
        if lo_inclusive
        else st.floats(max_value=0, allow_nan=False, allow_infinity=False)
    )
    opts = [_nonfinite, lo.map(repr)]
    if hi is not None:
        opts.append(st.floats(min_value=hi * 1.001 + 1e-9, max_value=1e300, allow_infinity=False).map(repr))
    return st.one_of(*opts)


def bad_int(lo: int, hi: int | None = None):
    """Not an integer in [lo, hi]: too small, too large, fractional, non-numeric."""
    opts = [
        st.integers(max_value=lo - 1).map(str),
        st.sampled_from(["2.5", "1e3", "inf", "nan", "x", ""]),
        st.floats(min_value=lo + 0.01, max_value=1e6).filter(lambda x: not float(x).is_integer()).map(repr),
    ]
    if hi is not None:
        opts.append(st.integers(min_value=hi + 1, max_value=hi * 10 + 10).map(str))
    return st.one_of(*opts)


def bad_count(lo: int, hi: int | None = None):
    """Not a whole number in [lo, hi] for a count flag that also takes ``1e8``: too small, too large, fractional,
    non-numeric."""
    opts = [
        st.integers(max_value=lo - 1).map(str),
        st.sampled_from(["2.5", "1.5e0", "1e-3", "inf", "nan", "x", "", "1e", "e5"]),
        st.floats(min_value=lo + 0.01, max_value=1e6).filter(lambda x: not float(x).is_integer()).map(repr),
    ]
    if hi is not None:
        opts.append(st.integers(min_value=hi + 1, max_value=hi * 10 + 10).map(str))
    return st.one_of(*opts)


def bad_choice(choices: tuple[str, ...]):
    return _text.filter(lambda s: s not in choices)


def bad_capacities():
    return st.one_of(
        st.sampled_from(["0", "-5", "2.5", "inf", "nan", "1e3", "x", "100,abc", "100,0", str(2**41)]),
        st.integers(max_value=0).map(str),
    )


# -- commands: (argv of a cheap valid call, {flag: strategy of bad values}) -----------------------------------------

SMALL_SHAREGPT = str(DATA / "sharegpt_small.jsonl")
MOONCAKE = str(DATA / "production" / "mooncake_small.jsonl")


def commands(tmp: Path, trace: Path) -> dict[str, tuple[list[str], dict]]:
    out = str(tmp / "out.parquet")
    return {
        "estimate": (
            ["estimate", *SCM, "--N", "100"],
            {
                "--N": bad_capacities(),
                "--lam0": bad_pos_float(),
                "--p": st.one_of(bad_pos_float(hi=0.999999, lo_inclusive=True), st.just("1")),
                "--x-mean": st.one_of(_nonfinite, st.sampled_from(["0.5", "-2", "0"])),
                "--w-mean": bad_pos_float(),
                "--w-dist": bad_choice(("exponential", "deterministic", "gamma", "lognormal")),
                "--engine": bad_choice(("vllm", "vllm-0.23", "content", "sglang")),
                "--sample": bad_int(100, 10**7),
                "--seed": bad_int(0),
            },
        ),
        "simulate": (
            ["simulate", *SCM, "--N", "50", "-n", "50", "-r", "2"],
            {
                "--N": bad_capacities(),
                "--policy": bad_choice(("content", "block")),
                "--engine": bad_choice(("vllm", "vllm-0.23")),
                "--weighting": bad_choice(("base", "practical")),
                "--block-size": bad_int(1, 2**16),
                "--conversations": bad_int(1, 10**8),
                "--warmup": bad_int(0),
                "--replications": bad_int(1, 10_000),
                "--lam0": bad_pos_float(),
            },
        ),
        "stream": (
            ["stream", *SCM, "--N", "50", "--events", "500", "--chunk", "64"],
            {
                "--N": bad_capacities(),
                "--events": bad_count(1, 10**11),
                "--chunk": bad_count(1, 10**7),
                "--warmup": st.one_of(bad_count(0), st.integers(min_value=500, max_value=10**9).map(str)),
                "--policy": bad_choice(("content", "block")),
                "--engine": bad_choice(("vllm", "vllm-0.23")),
                "--block-size": bad_int(1, 2**16),
                "--seed": bad_int(0),
                "--lam0": bad_pos_float(),
            },
        ),
        "stream --trace": (
            ["stream", "--trace", str(trace), "--N", "50", "--chunk", "7"],
            {"--events": st.one_of(bad_count(1), st.integers(min_value=10**6, max_value=10**9).map(str))},
        ),
        "trace generate": (
            ["trace", "generate", *SCM, "-n", "20", "-o", out],
            {"--conversations": bad_int(1, 10**9), "--seed": bad_int(0), "--w-mean": bad_pos_float()},
        ),
        "trace stats": (
            ["trace", "stats", str(trace)],
            {
                "--warmup": st.one_of(bad_int(0), st.integers(min_value=300, max_value=10**9).map(str)),
                "--block": bad_choice(("paper", "phys", "full")),
            },
        ),
        "curve": (
            ["curve", "--trace", str(trace), "--points", "3", "--policies", "content"],
            {
                "--n-min": bad_int(1, 2**40),
                "--n-max": st.one_of(bad_int(2, 2**40), st.just("64")),
                "--points": bad_int(2, 100_000),
                "--policies": bad_choice(("content", "vllm", "vllm-0.23")),
                "--block-size": bad_int(1, 2**16),
                "--warmup": bad_int(0),
            },
        ),
        "plan": (
            ["plan", *SCM, "--kv-gb", "1", "--engine", "paper"],
            {
                "--kv-gb": bad_pos_float(hi=2**20),
                "--target": st.one_of(bad_pos_float(hi=0.999999), st.sampled_from(["1", "1.5"])),
                "--block-size": bad_int(1, 2**16),
                "--engine": bad_choice(("vllm", "vllm-0.23", "content", "paper")),
                "--metric": bad_choice(("tokens", "blocks")),
                "--kv-dtype": bad_choice(("bf16", "fp16", "fp8", "fp32", "auto", "half", "float16", "float32")),
            },
        ),
        "kv": (
            ["kv", "--kv-gb", "40"],
            {
                "--kv-gb": bad_pos_float(hi=2**20),
                "--block-size": bad_int(1, 2**16),
                "--tp": st.one_of(bad_int(1, 4096), st.sampled_from(["3", "5", "7", "6"])),
                "--model": bad_choice(()),
            },
        ),
        "trace sharegpt": (
            [
                "trace",
                "sharegpt",
                "--source",
                SMALL_SHAREGPT,
                "--warmup",
                "1",
                "--measured",
                "1",
                "-o",
                out,
                "--cache-dir",
                str(tmp / "cache"),
            ],
            {
                "--measured": bad_int(1, 10**7),
                "--lam0": bad_pos_float(),
                "--w-mean": bad_pos_float(),
                "--block-size": bad_int(1, 2**16),
            },
        ),
        "simulate --blocks-trace": (
            ["simulate", "--blocks-trace", MOONCAKE, "--N", "500"],
            {
                "--warmup-time": st.one_of(_nonfinite, st.floats(max_value=-1e-6, allow_infinity=False).map(repr)),
                "--arrival": bad_choice(("sequential", "poisson", "uniform")),
                "--N": bad_capacities(),
            },
        ),
        "plan --blocks-trace": (
            ["plan", "--blocks-trace", MOONCAKE, "--kv-gb", "1"],
            {
                "--scale": bad_pos_float(hi=1e6),
                "--replications": bad_int(1, 10_000),
                "--conversations": bad_int(1, 10**7),
                "--engine": bad_choice(("vllm", "vllm-0.23")),
            },
        ),
        "curve --blocks-trace": (
            ["curve", "--blocks-trace", MOONCAKE, "--points", "3"],
            {"--n-min": bad_int(1, 2**40), "--kv-gb": bad_pos_float(hi=2**20), "--points": bad_int(2, 100_000)},
        ),
        "tiers": (
            ["tiers", "--blocks-trace", MOONCAKE, "--hbm-blocks", "4", "--host-units", "0,6"],
            {
                "--hbm-blocks": st.one_of(bad_capacities(), st.just(str(2**31 + 1))),
                "--tier": bad_choice(("native", "lmcache", "simple", "simple-lazy", "hicache")),
                "--tp": bad_int(1, 4096),
                "--blocks-per-chunk": bad_int(1, 4096),
                "--policy": bad_choice(("lru", "arc")),
                "--store-threshold": bad_int(0, 1000),
            },
        ),
        "tiers --tier simple-lazy": (
            ["tiers", "--blocks-trace", MOONCAKE, "--tier", "simple-lazy", "--hbm-blocks", "4", "--host-units", "1,6"],
            {"--max-num-batched-tokens": bad_int(1, 2**24), "--host-units": bad_int(1, 2**31)},
        ),
        "simulate --engine sglang": (
            ["simulate", "--trace", str(trace), "--engine", "sglang", "--N", "20000", "--prefill-tokens-per-s", "1e6"],
            {
                "--N": bad_capacities(),
                "--page-size": bad_int(1, 2**16),
                "--evict-policy": bad_choice(("lru", "fifo", "mru", "filo", "lfu", "slru", "priority", "tlru")),
                "--sglang-cache": bad_choice(("unified", "radix")),
                "--tlru-threshold": bad_int(0, 2**40),
                "--prefill-tokens-per-s": bad_pos_float(hi=1e12),
                "--decode-tokens-per-s": bad_pos_float(hi=1e12),
            },
        ),
        "curve --policies sglang": (
            ["curve", "--trace", str(trace), "--points", "3", "--policies", "vllm,sglang", "--sglang-points", "2"],
            {
                "--sglang-points": bad_int(2, 100_000),
                "--page-size": bad_int(1, 2**16),
                "--evict-policy": bad_choice(("lru", "fifo", "mru", "filo", "lfu", "slru", "priority", "tlru")),
            },
        ),
        "plan --compare sglang": (
            ["plan", "--trace", str(trace), "--kv-gb", "1", "--compare", "sglang"],
            {
                "--compare": bad_choice(("vllm", "vllm-0.23", "content", "paper", "sglang")),
                "--page-size": bad_int(1, 2**16),
                "--evict-policy": bad_choice(("lru", "fifo", "mru", "filo", "lfu", "slru", "priority", "tlru")),
            },
        ),
        "tiers --tier hicache": (
            ["tiers", "--blocks-trace", MOONCAKE, "--tier", "hicache", "--hbm-blocks", "4", "--hicache-ratio", "1,2"],
            {
                "--hicache-ratio": bad_pos_float(hi=1000),
                "--hicache-write-policy": bad_choice(("write_through", "write_through_selective", "write_back")),
                "--page-size": bad_int(1, 4096),
            },
        ),
        "demo": (["demo"], {"--N": bad_int(2, 2**40), "--lam0": bad_pos_float(), "--w-mean": bad_pos_float()}),
        "reproduce": (
            ["reproduce", "--quick", "-o", str(tmp / "rep")],
            {"--seeds": bad_int(1, 1000), "--jobs": bad_int(1, 1024), "--tpot": bad_pos_float(hi=60)},
        ),
    }


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prop") / "t.parquet"
    r = kvhit("trace", "generate", *SCM, "-n", "300", "--seed", "2", "-o", p)
    assert r.code == 0, r.err
    return p


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and "cache" not in p.parts}


@st.composite
def bad_flag(draw):
    name = draw(st.sampled_from(list(commands(Path("/x"), Path("/y")))))
    flags = commands(Path("/x"), Path("/y"))[name][1]
    flag = draw(st.sampled_from(sorted(flags)))
    return name, flag, draw(flags[flag])


@settings(max_examples=300, **SETTINGS)
@given(case=bad_flag())
def test_bad_flag_values_are_refused_in_one_line(trace_file, case):
    name, flag, value = case
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        argv, _ = commands(tmp, trace_file)[name]
        r = kvhit(*argv, flag, value)
        assert not r.exc, f"{name} {flag}={value!r}: traceback\n{r.exc}"
        assert r.code == 2, f"{name} {flag}={value!r}: exit {r.code}, expected 2\n{r.err}{r.out[-500:]}"
        assert len(r.err_lines) == 1, f"{name} {flag}={value!r}: stderr not one line:\n{r.err}"
        assert flag in r.err_lines[0], f"{name} {flag}={value!r}: the error does not name {flag}: {r.err}"
        assert _files(tmp) == set(), f"{name} {flag}={value!r}: left {_files(tmp)}"


# -- mutated files -----------------------------------------------------------------------------------------------


def _mutate_bytes(data: bytes, how: str, pos: float, junk: bytes) -> bytes:
    k = min(int(pos * len(data)), max(len(data) - 1, 0))
    if how == "truncate":
        return data[:k]
    if how == "flip":
        return data[:k] + b"\xff" + data[k + 1 :]
    if how == "insert":
        return data[:k] + junk + data[k:]
    return data[:k] + data[k + len(junk) :]  # delete


def _mutate_json_value(obj, path_pick: float, new):
    """Replace one scalar (chosen by ``path_pick``) somewhere in a JSON document with ``new``."""
    leaves = []

    def walk(o, parent, key):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, o, k)
        elif isinstance(o, list):
            for i, v in enumerate(o[:50]):
                walk(v, o, i)
        else:
            leaves.append((parent, key))

    walk(obj, None, None)
    if not leaves:
        return obj
    parent, key = leaves[min(int(path_pick * len(leaves)), len(leaves) - 1)]
    if parent is not None:
        parent[key] = new
    return obj


_json_junk = st.sampled_from([None, -1, 0, 1.5, "x", True, [], {}, 2**70, -(2**70), float("nan")])
_byte_mut = st.tuples(
    st.sampled_from(["truncate", "flip", "insert", "delete"]),
    st.floats(0, 1),
    st.binary(min_size=1, max_size=8),
)

TOML_SPEC = (
    'lam0 = 1.0\nname = "t"\n[turns]\nkind = "geometric"\np = 0.5\n[increments]\nkind = "prompt_response"\n'
    'x = {kind = "geometric", mean = 3}\ny = 2\n[interarrival]\nkind = "gamma"\nshape = 2.0\nmean = 30\n'
)


def _json_records(path: Path) -> list:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # the fixture has a malformed line on purpose
            pass
    return out


def _readers(tmp: Path, trace: Path):
    """(name, file written into tmp, argv using it) for every reader."""
    return {
        "spec toml": ("w.toml", TOML_SPEC.encode(), lambda p: ["estimate", "--spec", p, "--N", "100"]),
        "parquet trace": ("t.parquet", trace.read_bytes(), lambda p: ["trace", "stats", p]),
        "parquet trace (stream)": ("t.parquet", trace.read_bytes(), lambda p: ["stream", "--trace", p, "--N", "100"]),
        "sharegpt jsonl": (
            "s.jsonl",
            (DATA / "sharegpt_small.jsonl").read_bytes(),
            lambda p: [
                "trace",
                "sharegpt",
                "--source",
                p,
                "--warmup",
                "0",
                "--measured",
                "1",
                "-o",
                tmp / "o.parquet",
                "--cache-dir",
                tmp / "cache",
            ],
        ),
        "sharegpt json": (
            "s.json",
            json.dumps(_json_records(DATA / "sharegpt_small.jsonl")).encode(),
            lambda p: [
                "trace",
                "sharegpt",
                "--source",
                p,
                "--warmup",
                "0",
                "--measured",
                "1",
                "-o",
                tmp / "o.parquet",
                "--cache-dir",
                tmp / "cache",
            ],
        ),
        "mooncake jsonl": (
            "m.jsonl",
            (DATA / "production" / "mooncake_small.jsonl").read_bytes(),
            lambda p: ["simulate", "--blocks-trace", p, "--N", "500"],
        ),
        "weka json": (
            "w.json",
            (DATA / "production" / "weka_0022.json").read_bytes(),
            lambda p: ["simulate", "--blocks-trace", p, "--N", "500"],
        ),
        "model config.json": (
            "config.json",
            json.dumps(
                {
                    "num_hidden_layers": 36,
                    "num_attention_heads": 32,
                    "num_key_value_heads": 8,
                    "head_dim": 128,
                    "hidden_size": 4096,
                    "torch_dtype": "bfloat16",
                }
            ).encode(),
            lambda p: ["kv", "--model", p, "--kv-gb", "1"],
        ),
    }


def _check_mutated(r, fname: str, tmp: Path, what: str) -> None:
    assert not r.exc, f"{what}: traceback\n{r.exc}"
    assert r.code in (0, 2), f"{what}: exit {r.code}\n{r.err}"
    if r.code == 2:
        assert len(r.err_lines) == 1, f"{what}: stderr not one line:\n{r.err}"
        stem = fname.split(".")[0]
        assert stem in r.err_lines[0] or "--model" in r.err_lines[0], f"{what}: error does not name the file: {r.err}"
        assert not (tmp / "o.parquet").exists(), f"{what}: output written despite exit 2"
    left = [p.name for p in tmp.rglob("*.tmp")]
    assert not left, f"{what}: temporaries left: {left}"


READERS = [
    "spec toml",
    "parquet trace",
    "parquet trace (stream)",
    "sharegpt jsonl",
    "sharegpt json",
    "mooncake jsonl",
    "weka json",
    "model config.json",
]


@settings(max_examples=200, **SETTINGS)
@given(reader=st.sampled_from(READERS), mut=_byte_mut)
def test_byte_mutated_files_never_traceback(trace_file, reader, mut):
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fname, data, argv = _readers(tmp, trace_file)[reader]
        p = tmp / fname
        p.write_bytes(_mutate_bytes(data, *mut))
        _check_mutated(kvhit(*argv(p)), fname, tmp, f"{reader} {mut}")


@settings(max_examples=200, **SETTINGS)
@given(
    reader=st.sampled_from(["spec toml", "sharegpt json", "mooncake jsonl", "weka json", "model config.json"]),
    pick=st.floats(0, 1),
    new=_json_junk,
)
def test_value_mutated_files_never_traceback(trace_file, reader, pick, new):
    import tomllib

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        fname, data, argv = _readers(tmp, trace_file)[reader]
        p = tmp / fname
        if reader == "spec toml":
            doc = tomllib.loads(data.decode())
            if new is None or (isinstance(new, float) and math.isnan(new)):
                new = "?"
            doc = _mutate_json_value(doc, pick, new)
            p.write_text(_to_toml(doc))
        elif reader == "mooncake jsonl":
            lines = data.decode().splitlines()
            i = min(int(pick * len(lines)), len(lines) - 1)
            rec = _mutate_json_value(json.loads(lines[i]), (pick * 7919) % 1, new)
            lines[i] = json.dumps(rec)
            p.write_text("\n".join(lines) + "\n")
        else:
            p.write_text(json.dumps(_mutate_json_value(json.loads(data), pick, new)))
        _check_mutated(kvhit(*argv(p)), fname, tmp, f"{reader} pick={pick} new={new!r}")


def _to_toml(doc: dict) -> str:
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, int | float):
            return repr(v) if not isinstance(v, float) or math.isfinite(v) else "nan"
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + "}"
        raise TypeError(v)

    top = [f"{k} = {val(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    secs = [
        f"[{k}]\n" + "\n".join(f"{kk} = {val(vv)}" for kk, vv in v.items())
        for k, v in doc.items()
        if isinstance(v, dict)
    ]
    return "\n".join(top + secs) + "\n"


@settings(max_examples=80, **SETTINGS)
@given(
    column=st.sampled_from(["conv", "time", "R", "Z", "M", "turn", "arrival"]),
    how=st.sampled_from(["negate", "nan", "shuffle", "zero", "drop"]),
    row=st.floats(0, 1),
)
def test_semantically_mutated_parquet_traces_are_refused_or_fine(trace_file, column, how, row):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(trace_file)
    if column not in t.column_names:
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        a = t.column(column).to_numpy().copy()
        i = min(int(row * a.size), a.size - 1)
        if how == "drop":
            t2 = t.drop([column])
        else:
            if how == "negate":
                a[i] = -abs(a[i]) - 1
            elif how == "nan":
                a = a.astype(float)
                a[i] = np.nan
            elif how == "shuffle":
                a = a[::-1].copy()
            else:
                a[i] = 0
            t2 = t.set_column(t.column_names.index(column), column, pa.array(a))
        p = tmp / "mut.parquet"
        pq.write_table(t2.replace_schema_metadata(t.schema.metadata), p)
        for argv in (
            ["trace", "stats", p],
            ["simulate", "--trace", p, "--N", "100"],
            ["stream", "--trace", p, "--N", "100", "--chunk", "37"],
            ["stream", "--trace", p, "--N", "100", "--chunk", "37", "--policy", "block"],
        ):
            _check_mutated(kvhit(*argv), "mut.parquet", tmp, f"{column} {how} row {i}: {argv[0]}")


def test_reader_fixtures_are_valid(trace_file, tmp_path):
    """The unmutated inputs succeed, so a refusal above is caused by the mutation."""
    for name, (fname, data, argv) in _readers(tmp_path, trace_file).items():
        p = tmp_path / fname
        p.write_bytes(data)
        r = kvhit(*argv(p))
        assert r.code == 0 and not r.exc, (name, r.err, r.exc)
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        (tmp_path / "o.parquet").unlink(missing_ok=True)
