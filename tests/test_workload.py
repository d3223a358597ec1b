"""Workload model: distributions, spec validation and TOML, generator determinism, trace schema and Parquet I/O."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats

from kvhit.workload import (
    Constant,
    Deterministic,
    EmpiricalConversations,
    EmpiricalW,
    Exponential,
    FinitePMF,
    GammaW,
    Geometric,
    IIDIncrements,
    LogNormalW,
    PromptResponse,
    ScipyInt,
    ScipyW,
    SpecError,
    Trace,
    TraceError,
    TurnDependent,
    Window,
    WorkloadSpec,
    generate,
)
from kvhit.workload.generate import trace_from_conversations

INTERARRIVALS = [
    Exponential(30.0),
    Deterministic(12.5),
    GammaW(0.5, 40.0),
    GammaW(3.0, 40.0),
    LogNormalW.from_mean_cv(50.0, 1.5),
    ScipyW(stats.weibull_min(1.7, scale=25.0)),
    EmpiricalW([0.0, 1.0, 1.0, 4.0, 10.0]),
]


@pytest.mark.parametrize("F", INTERARRIVALS, ids=lambda f: f.name)
def test_int_sf_matches_quadrature(F):
    ts = np.array([0.0, 0.3, 1.0, 7.0, 25.0, 80.0, 400.0])
    got = F.int_sf(ts)
    for t, g in zip(ts, got, strict=True):
        # E[min(W, t)] by Monte-Carlo-free quadrature of the survival function, piecewise to catch atoms
        pts = np.unique(np.concatenate([[0.0, t], getattr(F, "samples", np.array([]))]))
        pts = pts[pts <= t]
        ref = (
            sum(
                integrate.quad(lambda u: 1 - float(F.cdf(u)), a, b, limit=200)[0]
                for a, b in zip(pts[:-1], pts[1:], strict=True)
            )
            if t > 0
            else 0.0
        )
        assert g == pytest.approx(ref, rel=1e-6, abs=1e-9)
    # E[min(W, ∞)] = E[W]
    assert float(F.int_sf(1e7)) == pytest.approx(F.mean, rel=1e-6)


@pytest.mark.parametrize("F", INTERARRIVALS, ids=lambda f: f.name)
def test_interarrival_sampling_mean(F):
    w = F.sample(np.random.default_rng(0), 200_000)
    assert (w >= 0).all()
    se = w.std() / np.sqrt(w.size)
    assert abs(w.mean() - F.mean) < 5 * se + 1e-12


def test_int_dists_moments_and_sf():
    rng = np.random.default_rng(1)
    for d in [
        Constant(3),
        Geometric(0.6),
        Geometric.from_mean(4.0),
        FinitePMF((1, 2, 5), (0.2, 0.5, 0.3)),
        ScipyInt(stats.poisson(2.5), shift=1),
    ]:
        x = d.sample(rng, 200_000)
        assert x.min() >= 1
        assert abs(x.mean() - d.mean) < 5 * x.std() / np.sqrt(x.size) + 1e-12
        ks = np.arange(1, 12)
        emp = np.array([(x >= k).mean() for k in ks])
        np.testing.assert_allclose(d.sf_ge(ks), emp, atol=0.01)
        assert d.var == pytest.approx(x.var(), rel=0.05, abs=1e-9)
    assert Geometric.from_mean(4.0).p == pytest.approx(0.75)


@pytest.mark.parametrize(
    "bad, field",
    [
        (
            {
                "lam0": 0,
                "turns": 2,
                "increments": {"kind": "iid", "z": 1},
                "interarrival": {"kind": "exponential", "mean": 1},
            },
            "lam0",
        ),
        (
            {
                "lam0": 1,
                "turns": {"kind": "geometric", "p": 1.2},
                "increments": {"kind": "iid", "z": 1},
                "interarrival": {"kind": "exponential", "mean": 1},
            },
            "turns",
        ),
        (
            {
                "lam0": 1,
                "turns": 2,
                "increments": {"kind": "iid", "z": 0},
                "interarrival": {"kind": "exponential", "mean": 1},
            },
            "increments.z",
        ),
        (
            {
                "lam0": 1,
                "turns": 2,
                "increments": {"kind": "iid", "z": 1},
                "interarrival": {"kind": "scipy", "name": "norm", "args": [5, 1]},
            },
            "interarrival",
        ),
        (
            {
                "lam0": 1,
                "turns": 2,
                "increments": {"kind": "iid", "z": 1},
                "interarrival": {"kind": "scipy", "name": "pareto", "args": [0.8]},
            },
            "interarrival",
        ),
        (
            {
                "lam0": 1,
                "turns": 2,
                "increments": {"kind": "iid", "z": 1},
                "interarrival": {"kind": "exponential"},
            },
            "mean",
        ),
        ({"lam0": 1, "turns": 2, "increments": {"kind": "iid", "z": 1}}, "interarrival"),
    ],
)
def test_spec_validation_names_field(bad, field):
    with pytest.raises(SpecError, match=field):
        WorkloadSpec.from_dict(bad)


def test_spec_toml_roundtrip(tmp_path):
    p = tmp_path / "w.toml"
    p.write_text(
        'lam0 = 1.5\nname = "x"\n[turns]\nkind = "geometric"\nmean = 4.0\n'
        '[increments]\nkind = "prompt_response"\nx = {kind = "geometric", mean = 3}\ny = 2\n'
        '[interarrival]\nkind = "gamma"\nshape = 2.0\nmean = 60\n'
    )
    spec = WorkloadSpec.from_toml(p)
    assert spec.lam0 == 1.5 and spec.M.mean == pytest.approx(4.0)
    again = WorkloadSpec.from_dict(spec.to_dict())
    assert again.to_dict() == spec.to_dict()
    (tmp_path / "bad.toml").write_text("lam0 = [")
    with pytest.raises(SpecError, match="bad.toml"):
        WorkloadSpec.from_toml(tmp_path / "bad.toml")


def scm(p=0.7, mean_w=20.0, lam0=2.0):
    return WorkloadSpec.scm(lam0, p, x=Geometric.from_mean(3.0), y=Geometric.from_mean(2.0), mean_w=mean_w)


def test_generator_is_deterministic_and_seed_sensitive():
    a = generate(scm(), 7, n_conversations=3000)
    b = generate(scm(), 7, n_conversations=3000)
    c = generate(scm(), 8, n_conversations=3000)
    for k in a.cols:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["time"], c["time"])


def test_generator_statistics_match_spec():
    spec = scm(p=0.6, mean_w=15.0, lam0=3.0)
    tr = generate(spec, 3, n_conversations=40_000)
    conv = tr.conversations()
    M = conv["M"]
    assert abs(M.mean() - spec.M.mean) < 5 * M.std() / np.sqrt(M.size)
    w = tr.interarrivals()
    assert abs(w.mean() - 15.0) < 5 * w.std() / np.sqrt(w.size)
    gaps = np.diff(np.sort(conv["arrival"]))
    assert abs(gaps.mean() - 1 / 3.0) < 5 * gaps.std() / np.sqrt(gaps.size)
    # prompt/response structure: E[Z_1] = E[X] = 3, E[Z_j] = 5 for j ≥ 2
    z1 = tr["Z"][tr["turn"] == 1]
    z2 = tr["Z"][tr["turn"] >= 2]
    assert abs(z1.mean() - 3.0) < 5 * z1.std() / np.sqrt(z1.size)
    assert abs(z2.mean() - 5.0) < 5 * z2.std() / np.sqrt(z2.size)


def test_generator_horizon_and_sorted():
    tr = generate(scm(), 1, horizon=500.0)
    assert (np.diff(tr["time"]) >= 0).all()
    assert tr["conv_arrival"].max() < 500.0
    assert tr.n_conversations == tr.conversations()["conv"].size


def test_turn_dependent_and_empirical_conversations():
    inc = TurnDependent((Constant(5), Constant(2)))
    spec = WorkloadSpec(1.0, Constant(3), inc, Exponential(1.0))
    tr = generate(spec, 0, n_conversations=10)
    np.testing.assert_array_equal(np.unique(tr["R"][tr["turn"] == 3]), [9])
    emp = EmpiricalConversations([[2, 4, 8], [1], [3, 3]])
    spec = WorkloadSpec(1.0, None, emp, Deterministic(2.0))
    tr = generate(spec, 0, n_conversations=500)
    conv = tr.conversations()
    assert set(np.unique(conv["B"])) <= {14, 1, 6}
    assert set(np.unique(conv["M"])) <= {1, 2, 3}
    # B determines M exactly: the joint draw keeps each conversation whole
    for b, m in [(14, 3), (1, 1), (6, 2)]:
        assert (conv["M"][conv["B"] == b] == m).all()


def test_trace_parquet_roundtrip_and_atomic(tmp_path):
    tr = generate(scm(), 2, n_conversations=200)
    out = tr.write(tmp_path / "t.parquet")
    back = Trace.read(out)
    for k in tr.cols:
        np.testing.assert_array_equal(tr[k], back[k])
        assert tr[k].dtype == back[k].dtype
    assert back.meta["seed"] == 2
    assert list(tmp_path.iterdir()) == [out]  # no temporary left behind


def test_trace_lists_roundtrip(tmp_path):
    tr = trace_from_conversations(
        [2, 1],
        [1, 2, 1],
        lam0=1.0,
        interarrival=Exponential(1.0),
        seed=0,
        lists={"new_tokens": [[1, 2], [3], [4, 5, 6]]},
    )
    back = Trace.read(tr.write(tmp_path / "x.parquet"))
    got = {
        (int(c), int(j)): list(x) for c, j, x in zip(back["conv"], back["turn"], back.lists["new_tokens"], strict=True)
    }
    assert got == {(0, 1): [1, 2], (0, 2): [3], (1, 1): [4, 5, 6]}


def _cols():
    return {
        "conv": [0, 0, 1],
        "conv_arrival": [0.0, 0.0, 1.0],
        "turn": [1, 2, 1],
        "time": [0.0, 2.0, 1.0],
        "M": [2, 2, 1],
        "Z": [3, 2, 4],
        "R": [3, 5, 4],
    }


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda c: c.update(R=[3, 6, 4]), "'R'"),
        (lambda c: c.update(Z=[3, 0, 4], R=[3, 3, 4]), "'Z'"),
        (lambda c: c.update(turn=[1, 1, 1]), "'turn'"),
        (lambda c: c.update(turn=[1, 3, 1]), "'M'"),
        (lambda c: c.update(time=[0.0, float("nan"), 1.0]), "'time'"),
        (lambda c: c.update(M=[2, 3, 1]), "'M'"),
        (lambda c: c.pop("R"), "missing"),
        (lambda c: c.update(time=[0.0, 2.0, 0.5]), "'time'"),
    ],
)
def test_trace_validation_errors(mutate, msg):
    c = _cols()
    mutate(c)
    with pytest.raises(TraceError, match=msg):
        Trace.from_columns(c)


def test_trace_read_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pytest.raises(TraceError, match="no such file"):
        Trace.read(tmp_path / "nope.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(TraceError, match="junk.parquet"):
        Trace.read(tmp_path / "junk.parquet")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "plain.parquet")
    with pytest.raises(TraceError, match="not a kvhit trace"):
        Trace.read(tmp_path / "plain.parquet")
    # a corrupted column value is reported with file, row and column
    tr = Trace.from_columns(_cols())
    tbl = pq.read_table(tr.write(tmp_path / "ok.parquet"))
    bad = tbl.set_column(tbl.schema.get_field_index("R"), "R", pa.array([3, 9, 4]))
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(TraceError, match=r"bad.parquet: row 2 .*'R'"):
        Trace.read(tmp_path / "bad.parquet")


def test_window_warmup_conversations():
    tr = generate(scm(), 4, n_conversations=100)
    w = Window.warmup_conversations(tr, 10)
    arr = np.sort(tr.conversations()["arrival"])
    assert w.start == arr[10] and w.end == arr[-1]
    m = w.mask(tr)
    assert (tr["time"][m] >= arr[10]).all() and (tr["time"][m] <= arr[-1]).all()
    with pytest.raises(TraceError):
        Window.warmup_conversations(tr, 100)


def test_iid_increments_sample_shape():
    inc = IIDIncrements(Constant(2))
    assert inc.sample(np.random.default_rng(0), np.array([2, 3])).tolist() == [2] * 5
    pr = PromptResponse(Constant(2), Constant(5))
    assert pr.z_from_xy(np.array([2, 2, 2]), np.array([5, 5, 5]), np.array([2, 1])).tolist() == [2, 7, 2]


def test_conv_index_is_recomputed_when_a_column_is_replaced():
    sp = WorkloadSpec.scm(1.0, 0.5, x=2, y=1, mean_w=10.0)
    tr = generate(sp, 1, n_conversations=30)
    ids, dense, order = tr.conv_index()
    assert (ids == np.unique(tr["conv"])).all()
    assert (order == np.lexsort((tr["turn"], tr["conv"]))).all()
    tr.cols["conv"] = tr["conv"] * 3 + 7  # new ids, same shape
    ids2, dense2, order2 = tr.conv_index()
    assert (ids2 == ids * 3 + 7).all() and (dense2 == dense).all()
    assert tr.n_conversations == ids.size
