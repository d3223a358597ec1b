"""`kvhit fleet plan|curve` (service.fleet_plan, kvhit.fleet.plan, kvhit.plan.compute): answers checked against direct
fleet simulation, JSON equal to the library, bad input one line and exit 2, FLOPs model identities."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from kvhit.cli import app
from kvhit.fleet.plan import FleetStream, evaluate
from kvhit.fleet.simulate import simulate_fleet
from kvhit.plan.compute import PEAK_BF16_TFLOPS, prefill_flops
from kvhit.service.inputs import window_for
from kvhit.sim.runner import block_requests
from kvhit.workload import Trace

runner = CliRunner()
SCM = ["--lam0", "0.5", "--p", "0.75", "--x-mean", "4", "--y-mean", "3", "--w-mean", "60"]
B = 16


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("fleetplan") / "t.parquet"
    r = runner.invoke(app, ["trace", "generate", *SCM, "-n", "400", "--seed", "3", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def direct(trace):
    """h(R, N) for a router by direct simulation (simulate_fleet, not kvhit.fleet.plan)."""
    tr = Trace.read(trace)
    rq = block_requests(tr, block_size=B)
    mask = window_for(tr, None, None).mask(tr)
    conv = tr.dense_conv()

    def h(R, N, router="session", hold=None):
        res = simulate_fleet(
            rq.prompt_tokens, rq.hash_offsets, rq.hashes, conv, Ns=[N] * R, block_size=B, router=router,
            times=tr["time"], hold=hold,
        )  # fmt: skip
        return res.token_hit_ratio(mask)

    return h


def _plan(trace, *args):
    r = runner.invoke(app, ["fleet", "plan", "--trace", str(trace), "--block-size", str(B), "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_plan_replicas_is_the_smallest_R_by_direct_simulation(trace, direct):
    N = 150
    hs = [direct(R, N) for R in range(1, 9)]
    # a target between h(R=4) and h(R=5) when affinity gains from R (checked, not assumed)
    assert hs[4] > hs[3], hs
    target = (hs[3] + hs[4]) / 2
    out = _plan(trace, "--target", repr(target), "--N", str(N), "--router", "session", "--max-replicas", "8")
    a = out["answers"][0]
    assert a["found"]
    R = a["replicas"]
    assert direct(R, N) >= target
    assert direct(R - 1, N) < target
    assert a["token_hit_ratio"] == direct(R, N)


def test_plan_hbm_is_the_smallest_N_by_direct_simulation(trace, direct):
    h_big = direct(3, 10_000, "round-robin")
    target = 0.8 * h_big
    out = _plan(trace, "--target", repr(target), "--vary", "hbm", "--replicas", "3", "--rtol", "0",
                "--router", "round-robin")  # fmt: skip
    a = out["answers"][0]
    N = a["N"]
    assert a["found"] and direct(3, N, "round-robin") >= target
    assert direct(3, N - 1, "round-robin") < target
    assert a["gib_per_replica"] == pytest.approx(N * 147_456 * B / 2**30)  # Qwen3-8B bf16: 144 KiB per token


def test_plan_unreachable_target_is_reported_not_invented(trace):
    out = _plan(trace, "--target", "0.99", "--N", "150", "--router", "round-robin", "--max-replicas", "16")
    a = out["answers"][0]
    assert not a["found"] and a["replicas"] is None
    assert any("not reached" in n for n in out["notes"])


def test_plan_rows_equal_the_library_and_compute_is_the_flops_model(trace):
    out = _plan(trace, "--target", "0.3", "--N", "150", "--router", "session", "--gpu", "H100", "--mfu", "0.4")
    tr = Trace.read(trace)
    rq = block_requests(tr, block_size=B)
    mask = np.asarray(window_for(tr, None, None).mask(tr), bool)
    t = np.asarray(tr["time"], float)
    st = FleetStream(rq.prompt_tokens, rq.hash_offsets, rq.hashes, tr.dense_conv(), t, mask, B,
                     float(t[mask].max() - t[mask].min()))  # fmt: skip
    fl = prefill_flops("qwen3-8b")
    gpu = PEAK_BF16_TFLOPS["h100"] * 1e12 * 0.4
    for row in out["rows"]:
        p = evaluate([st], replicas=row["replicas"], N=row["N"], router="session", flops=fl, gpu_flops=gpu)
        assert row["token_hit_ratio"] == p.token_hit_ratio
        assert row["saved_gpus"] == pytest.approx(p.saved_gpus, rel=1e-12)
        # GPUs saved = FLOPs of the hit prefixes / (peak × mfu) / span, recomputed here from the hit tokens
        Ns = [row["N"]] * row["replicas"]
        res = simulate_fleet(
            rq.prompt_tokens,
            rq.hash_offsets,
            rq.hashes,
            tr.dense_conv(),
            Ns=Ns,
            block_size=B,
            router="session",
            times=t,
        )
        h = (res.hit_blocks * B)[mask]
        want = sum(2 * fl.linear_params * x + 2 * 32 * 256 * 36 * x * (x + 1) / 2 for x in h.tolist()) / st.span / gpu
        assert row["saved_gpus"] == pytest.approx(want, rel=1e-9)
    assert out["compute"]["mfu"] == 0.4 and out["compute"]["peak_tflops_per_gpu"] == 989.0


def test_curve_rows_equal_the_library(trace):
    r = runner.invoke(
        app, ["fleet", "curve", "--trace", str(trace), "--block-size", str(B), "--replicas", "3", "--N", "150",
              "--prefill-tokens-per-s", "50", "--param", "request_weight", "--values", "0,4", "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["param"] == "request_weight" and [x["value"] for x in out["rows"]] == [0.0, 4.0]
    assert [b["router"] for b in out["baselines"]] == ["round-robin", "least-loaded", "session"]
    tr = Trace.read(trace)
    rq = block_requests(tr, block_size=B)
    mask = window_for(tr, None, None).mask(tr)
    hold = rq.prompt_tokens / 50.0
    for row in out["rows"]:
        res = simulate_fleet(rq.prompt_tokens, rq.hash_offsets, rq.hashes, tr.dense_conv(), Ns=[150] * 3, block_size=B,
                             router="dynamo", router_params={"request_weight": row["value"]}, times=tr["time"],
                             hold=hold)  # fmt: skip
        s = res.summary(mask)
        assert row["token_hit_ratio"] == s["token_hit_ratio"]
        assert row["imbalance_prefill_tokens"] == s["imbalance_prefill_tokens"]


@pytest.mark.parametrize(
    "cmd,args,needle",
    [
        ("plan", ["--target", "0.5", "--N", "150", "--max-replicas", "0"], "--max-replicas"),
        ("plan", ["--target", "1.5", "--N", "150"], "--target"),
        ("plan", ["--target", "0.5", "--N", "150", "--router", "nope"], "--router"),
        ("plan", ["--target", "0.5", "--N", "150", "--router", "dynamo", "--request-weight", "-1"], "--request-weight"),
        ("plan", ["--target", "0.5", "--N", "150", "--router", "session", "--queue-weight", "1"], "--queue-weight"),
        ("plan", ["--target", "0.5"], "--N"),
        ("plan", ["--target", "0.5", "--N", "150", "--kv-gb", "1"], "--N"),
        ("plan", ["--target", "0.5", "--N", "150", "--replicas", "2"], "--replicas"),
        ("plan", ["--target", "0.5", "--vary", "hbm"], "--replicas"),
        ("plan", ["--target", "0.5", "--vary", "hbm", "--replicas", "0"], "--replicas"),
        ("plan", ["--target", "0.5", "--N", "150", "--replications", "2"], "--replications"),
        ("plan", ["--target", "0.5", "--N", "150", "--mfu", "0"], "--mfu"),
        ("plan", ["--target", "0.5", "--N", "150", "--gpu", "Ascend-910B2"], "peak"),
        ("plan", ["--target", "0.5", "--N", "1"], "largest request"),
        ("curve", ["--replicas", "0", "--N", "150", "--prefill-tokens-per-s", "50"], "--replicas"),
        ("curve", ["--replicas", "2", "--N", "150"], "--prefill-tokens-per-s"),
        (
            "curve",
            ["--replicas", "2", "--N", "150", "--prefill-tokens-per-s", "5", "--router", "round-robin"],
            "--router",
        ),
        ("curve", ["--replicas", "2", "--N", "150", "--prefill-tokens-per-s", "5", "--param", "ttl"], "--param"),
        ("curve", ["--replicas", "2", "--N", "150", "--prefill-tokens-per-s", "5", "--values", "-1"], "--values"),
        (
            "curve",
            ["--replicas", "2", "--N", "150", "--prefill-tokens-per-s", "5", "--overlap-score-credit", "1"],
            "--overlap-score-credit",
        ),
    ],
)
def test_bad_input_one_line_exit_2(trace, cmd, args, needle):
    r = runner.invoke(app, ["fleet", cmd, "--trace", str(trace), "--block-size", str(B), *args])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip() if r.stderr else r.output.strip()
    assert needle in err and "Traceback" not in r.output, err
    assert len(err.splitlines()) == 1, err


def test_two_sources_refused(trace):
    r = runner.invoke(app, ["fleet", "plan", "--target", "0.5", "--N", "150"])
    assert r.exit_code == 2 and "--trace: required (or give --blocks-trace or --sharegpt)" in (r.stderr or r.output)


def test_flops_model_identities():
    fl = prefill_flops("llama-3.1-8b")
    # 8,030,261,248 parameters − embedding and untied LM head (2 × 128,256 × 4,096) − RMSNorm weights
    # (2 per layer + the final one, × 4,096): the matrices multiplied per token
    assert fl.linear_params == 8_030_261_248 - 2 * 128_256 * 4096 - (2 * 32 + 1) * 4096
    a, h, T = np.array([0, 0, 5]), np.array([0, 17, 300]), np.array([1, 1000, 301])
    np.testing.assert_allclose(fl.flops(a, T), fl.flops(a, h) + fl.flops(h, T), rtol=1e-12)
    # sliding-window layers (gpt-oss: W = 128 on half of the layers) against a brute-force sum
    g = prefill_flops("gpt-oss-20b")
    assert g.sliding_layers == 12 and g.window == 128
    c = 2 * g.heads * (g.d_qk + g.d_v)
    for lo, hi in [(0, 50), (0, 300), (100, 129), (200, 400)]:
        brute = 2 * g.linear_params * (hi - lo) + c * sum(
            g.full_layers * (i + 1) + g.sliding_layers * min(i + 1, 128) for i in range(lo, hi)
        )
        assert float(g.flops([lo], [hi])[0]) == pytest.approx(brute, rel=1e-12)


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    rng = np.random.default_rng(0)
    rows, t = [], 0
    for c in range(30):  # 30 chains sharing a 2-block system prompt; each grows turn by turn
        base = [0, 1] + [1000 * c + k for k in range(int(rng.integers(1, 4)))]
        for _ in range(int(rng.integers(1, 5))):
            t += int(rng.integers(100, 3000))
            rows.append((t, 512 * len(base), list(base)))
            base = base + [1000 * c + len(base) + k for k in range(int(rng.integers(1, 3)))]
    rows.sort()
    p = tmp_path_factory.mktemp("mc") / "t.jsonl"
    p.write_text(
        "".join(
            json.dumps({"timestamp": a, "input_length": n, "output_length": 5, "hash_ids": h}) + "\n"
            for a, n, h in rows
        )
    )
    return p


def test_blocks_trace_fleet_equals_the_library(mooncake):
    from kvhit.workload.production import read_production

    r = runner.invoke(app, ["fleet", "simulate", "--blocks-trace", str(mooncake), "--replicas", "3", "--N", "12",
                            "--router", "session,dynamo", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert any("derived from prefix sharing" in n for n in out["notes"])
    pt = read_production(mooncake)
    assert pt.session is not None
    for row in out["rows"]:
        res = simulate_fleet(pt.prompt_tokens, pt.hash_offsets, pt.hashes, pt.session, Ns=[12] * 3,
                             block_size=pt.block_size, router=row["router"], times=pt.time)  # fmt: skip
        assert row["token_hit_ratio"] == res.token_hit_ratio()
    r = runner.invoke(app, ["fleet", "simulate", "--blocks-trace", str(mooncake), "--replicas", "2", "--N", "12",
                            "--block-size", "16"])  # fmt: skip
    assert r.exit_code == 2 and "--block-size" in (r.stderr or r.output)


def test_plan_at_lam0_uses_the_resampled_streams(mooncake):
    from kvhit.fleet.plan import stream_from_resample
    from kvhit.sim.resample import conversation_pool, resample
    from kvhit.workload.production import read_production

    out = _plan_blocks(mooncake, "--target", "0.3", "--N", "12", "--router", "session", "--lam0", "0.01",
                       "--replications", "2", "--conversations", "20", "--max-replicas", "2")  # fmt: skip
    assert out["lam0"] == 0.01
    pool = conversation_pool(read_production(mooncake))
    streams = [stream_from_resample(resample(pool, lam0=0.01, n_conversations=20, seed=s)) for s in (0, 1)]
    for row in out["rows"]:
        p = evaluate(streams, replicas=row["replicas"], N=12, router="session")
        assert row["token_hit_ratio"] == p.token_hit_ratio and row["per_replication"] == p.per_replication


def _plan_blocks(path, *args):
    r = runner.invoke(app, ["fleet", "plan", "--blocks-trace", str(path), "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_inflight_imbalance_against_a_time_grid():
    from kvhit.fleet.plan import inflight_imbalance

    no = np.zeros(2, bool)
    assert inflight_imbalance([0, 0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], no, 2) == 2.0
    assert inflight_imbalance([0, 1], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0], no, 2) == 1.0
    rng = np.random.default_rng(4)
    R, n = 3, 40
    rep = rng.integers(0, R, n)
    t = np.sort(rng.integers(0, 50, n)).astype(float)
    wait = rng.integers(0, 3, n).astype(float)
    hold = rng.integers(1, 6, n).astype(float)
    rej = rng.random(n) < 0.1
    grid = np.arange(0, 70, 0.5) + 0.25  # integer event times: the load is constant on each half-unit cell
    q = np.array([[((rep == k) & ~rej & (t <= g) & (g < t + wait + hold)).sum() for k in range(R)] for g in grid])
    want = q.max(axis=1).sum() / q.mean(axis=1).sum()
    assert inflight_imbalance(rep, t, wait, hold, rej, R) == pytest.approx(want, rel=1e-12)


def test_plan_capacity_from_kv_gb_and_gpu(trace):
    from kvhit.plan import hardware, model_config

    out = _plan(trace, "--target", "0.3", "--kv-gb", "0.4", "--router", "session", "--max-replicas", "2")
    bpb = model_config.get_model("qwen3-8b").bytes_per_block(B)
    assert out["capacity"]["N"] == int(hardware.gb_to_bytes(0.4) // bpb) and out["capacity"]["source"] == "--kv-gb"
    out = _plan(trace, "--target", "0.3", "--vary", "hbm", "--replicas", "2", "--router", "session", "--gpu", "H100")
    budget = hardware.kv_budget_bytes("H100", "qwen3-8b")
    a = out["answers"][0]
    assert a["found"] and a["fits_on_gpu"] == (a["N"] * bpb <= budget)
    assert out["capacity"]["kv_gib_available"] == pytest.approx(budget / 2**30)
