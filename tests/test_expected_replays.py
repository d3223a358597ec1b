"""The exchangeable law's expected value by exact replays (issue 23 §2 (b), ``kvhit.estimate.band.expected_replays``).

Pinned against independent computations: (1) the replays by hand — i.i.d. starts uniform on the widened span from
``default_rng([seed, 1])``, *not* sorted into the observed order — through the slow exact simulator; (2) a closed
form: two conversations whose hit ratio depends only on the gap Δ between their starts (piecewise constant, the
pieces' values from the slow simulator), Δ the difference of two i.i.d. uniforms on the widened span (triangular law),
so E[h] = Σ P(piece)·h(piece) — the Monte Carlo mean must agree within its stated standard error; a law on the
unwidened span or one that keeps the order gives another value and fails it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvhit.estimate.agentic import AgenticError
from kvhit.estimate.band import estimate_trace_band, expected_replays, restart_sessions
from kvhit.sim.vllm.block import simulate_block, token_hit_ratio
from kvhit.workload.production import read_weka
from kvhit.workload.production_trace import ProductionTrace

D = "tests/data/production"
FILES = [f"{D}/weka_0014_cut.json", f"{D}/weka_0022.json", f"{D}/weka_0026.json"]


@pytest.fixture(scope="module")
def pt():
    return read_weka(FILES, arrival="uniform", span=600.0, seed=0, strict=False)


def _first(p):
    f = np.full(int(p.session.max()) + 1, np.inf)
    np.minimum.at(f, p.session, p.time)
    return f


def _exact(p, N):
    rq = p.to_block_requests()
    res = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=int(N), block_size=rq.block_size)
    return token_hit_ratio(res)


def test_expected_replays_by_hand(pt):
    N_min = int(pt.prompt_blocks.max())
    Ns = np.array([N_min - 1, N_min, 3 * N_min])
    ev = expected_replays(pt, Ns, se=0.5, seed=4, min_replays=4, max_replays=4, batch=2)
    assert ev.replays == 4 and ev.reached and ev.law == "random-span"
    first = _first(pt)
    C = first.shape[0]
    lo, hi = first.min(), first.max()
    d = (hi - lo) / (C - 1)
    rng = np.random.default_rng([4, 1])
    H = np.array([[_exact(restart_sessions(pt, rng.uniform(lo - d, hi + d, C)), N) for N in Ns[1:]] for _ in range(4)])
    assert np.isnan(ev.h[0]) and np.isnan(ev.se[0])
    assert ev.h[1:] == pytest.approx(H.mean(axis=0), abs=1e-12)
    assert ev.se[1:] == pytest.approx(H.std(axis=0, ddof=1) / 2.0, abs=1e-12)
    again = expected_replays(pt, Ns, se=0.5, seed=4, min_replays=4, max_replays=4, batch=2)
    assert np.array_equal(ev.h, again.h, equal_nan=True) and np.array_equal(ev.se, again.se, equal_nan=True)


def test_stopping_rule(pt):
    N_min = int(pt.prompt_blocks.max())
    Ns = np.array([N_min, 2 * N_min])
    loose = expected_replays(pt, Ns, se=0.9, seed=1, min_replays=6, max_replays=40, batch=4)
    assert loose.replays == 6 and loose.reached  # the fewest, already below the target
    tight = expected_replays(pt, Ns, se=1e-9, seed=1, min_replays=6, max_replays=14, batch=4)
    assert tight.replays == 14 and not tight.reached  # 6, 10, 14: capped, and says so
    assert tight.info()["reached"] is False and tight.info()["se_max"] > 1e-9
    # the first replays of the longer run are the shorter run's: one stream per seed
    part = expected_replays(pt, Ns, se=1e-9, seed=1, min_replays=6, max_replays=6, batch=4)
    assert part.replays == 6 and np.array_equal(part.h, loose.h)


def _two_conversations(gap: float, start_b: float) -> ProductionTrace:
    """Two conversations of two requests each (blocks of 16 tokens): A = [1, 2] then [1, 2, 3], B = [11, 12] then
    [11, 12, 13], each second request ``gap`` s after the first; A starts at 0, B at ``start_b``."""
    t = np.array([0.0, gap, start_b, start_b + gap])
    order = np.argsort(t, kind="stable")
    blocks = [[1, 2], [1, 2, 3], [11, 12], [11, 12, 13]]
    sess = np.array([0, 0, 1, 1])
    ids = [blocks[i] for i in order]
    off = np.zeros(5, np.int64)
    np.cumsum([len(b) for b in ids], out=off[1:])
    n = 4
    return ProductionTrace(
        time=t[order],
        prompt_tokens=np.array([16 * len(b) for b in ids], np.int64),
        output_tokens=np.ones(n, np.int64),
        hash_offsets=off,
        hashes=np.array([x for b in ids for x in b], np.int64),
        block_size=16,
        session=sess[order],
        agent=np.zeros(n, np.int64),
        model=None,
        models=(),
        file_index=np.zeros(n, np.int64),
        record=np.arange(n, dtype=np.int64),
        sub_record=np.full(n, -1, np.int64),
        files=("two",),
        format="weka",
        session_source="file",
        rechained=False,
        n_partial_dropped=0,
    )


def test_two_conversations_closed_form():
    """Observed starts 0 and 100, C = 2: the law is i.i.d. uniform on [−100, 200] (width w = 300); Δ = S_B − S_A is
    triangular on [−w, w]; with second requests 150 s after the first, h depends only on which of the four
    pieces (−∞, −150), (−150, 0), (0, 150), (150, ∞) holds Δ; P(Δ > 150) = (w − 150)² / (2w²) = 1/8."""
    g, w = 150.0, 300.0
    p = _two_conversations(g, 100.0)
    N = 3  # the largest prompt: one conversation's blocks evict the other's when they interleave
    pieces = {-225.0: None, -75.0: None, 75.0: None, 225.0: None}
    for delta in pieces:
        pieces[delta] = _exact(restart_sessions(p, np.array([0.0, delta]) + 500.0), N)
    assert len(set(pieces.values())) > 1  # the pieces differ: the law matters
    tail = (w - g) ** 2 / (2 * w * w)
    prob = {-225.0: tail, -75.0: 0.5 - tail, 75.0: 0.5 - tail, 225.0: tail}
    E = sum(prob[k] * v for k, v in pieces.items())
    ev = expected_replays(p, [N], se=0.004, seed=11, max_replays=4096, batch=256)
    assert ev.reached
    assert abs(ev.h[0] - E) <= 4.0 * ev.se[0]
    # a law on the unwidened span [0, 100] would give h(|Δ| < 150) only: far outside the same tolerance
    E_narrow = 0.5 * pieces[-75.0] + 0.5 * pieces[75.0]
    assert abs(E_narrow - E) > 8.0 * ev.se[0]


def test_band_carries_the_expected_value(pt):
    N_min = int(pt.prompt_blocks.max())
    Ns = np.array([N_min // 2, N_min, 4 * N_min])
    e, _ = estimate_trace_band(pt, Ns, replays=4, seed=2, expected_se=0.5)
    ev = expected_replays(pt, Ns, se=0.5, seed=2)
    assert np.array_equal(e.h_exp, ev.h, equal_nan=True) and np.array_equal(e.h_exp_se, ev.se, equal_nan=True)
    assert e.band["expected"] == ev.info() and e.band["expected"]["replays"] == 32
    d = e.to_dict()
    assert d["h_exp"][0] is None and math.isfinite(d["h_exp"][1]) and len(d["h_exp_se"]) == 3
    plain, _ = estimate_trace_band(pt, Ns, replays=4, seed=2)
    assert plain.h_exp is None and "h_exp" not in plain.to_dict()
    assert np.array_equal(plain.h_mc, e.h_mc, equal_nan=True)  # the band's replays are untouched


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"se": 0.0}, "expected_se"),
        ({"se": 1.5}, "expected_se"),
        ({"se": "0.01"}, "expected_se"),
        ({"min_replays": 1}, "min_replays"),
        ({"batch": 2.0}, "batch"),
        ({"min_replays": 40, "max_replays": 20}, "max_replays"),
    ],
)
def test_refusals(pt, kw, needle):
    with pytest.raises(AgenticError, match=needle):
        expected_replays(pt, [5000], **kw)


def test_cli_estimate_expected_se(tmp_path, pt):
    import json

    from typer.testing import CliRunner

    from kvhit.cli import app

    for f in FILES:
        (tmp_path / f.split("/")[-1]).write_bytes(open(f, "rb").read())
    runner = CliRunner()
    N_min = int(pt.prompt_blocks.max())
    base = ["estimate", "--blocks-trace", str(tmp_path), "--arrival", "uniform", "--span", "600"]
    r = runner.invoke(app, [*base, "--N", f"{N_min - 1},{3 * N_min}", "--engine", "vllm", "--expected-se", "0.05",
                            "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["rows"][1]
    ev = expected_replays(pt, [N_min - 1, 3 * N_min], se=0.05, seed=0)
    assert row["h_exp"]["vllm"] == pytest.approx(float(ev.h[1]), abs=1e-15)
    assert row["h_exp_se"]["vllm"] == pytest.approx(float(ev.se[1]), abs=1e-15)
    assert json.loads(r.stdout)["rows"][0]["h_exp"] == {"vllm": None}
    t = runner.invoke(app, [*base, "--N", f"{3 * N_min}", "--engine", "vllm", "--expected-se", "0.05"])
    assert t.exit_code == 0, t.output
    assert f"{ev.h[1]:.4f} ± {ev.se[1]:.4f}" in t.stdout  # the table's expected-value column
    for extra, needle in (
        (["--expected-se", "0"], "--expected-se"),
        (["--expected-se", "0.05", "--lam0", "0.01"], "--expected-se"),
        (["--expected-se", "0.05", "--engine", "sglang"], "--expected-se"),
    ):
        bad = runner.invoke(app, [*base, "--N", f"{3 * N_min}", *extra])
        assert bad.exit_code == 2, bad.output
        assert needle in bad.output and "Traceback" not in bad.output and len(bad.output.strip().splitlines()) == 1
