"""Accuracy of the hit-ratio estimators against the simulated engines (docs/estimators.md reproduces its tables).

Grids: Experiment 1 (λ0 = 1.5, exponential W with mean 90…240 s) and Experiment 2 (mean 135 s, λ0 0.5…2.0) on the
ShareGPT trace of App. E (1,000 warm-up + 5,000 measured conversations, b = 128, N = 2,275; W exponential at the
target mean, requests instantaneous), and a synthetic long-context workload (b = 64, E[R]/N ≈ 0.1–0.4). The
"actual" is the block simulator (vLLM ≥ 0.24 and ≤ 0.23 free orders; token and block metrics) over
App. E's window (Window.warmup_conversations); predictions use the trace's F̂ and the setting's λ0.

Columns (ingredients, cumulative): paper = eq. (39) on the measured conversations; a = engine accounting
(mean field); a+c = own size in the threshold (all or nothing); a+b+c = tail-first partial prefix hits;
a+b+c+d = Gaussian fluctuations of D(W) (Lemma D.1); win = window-exact form (the counted rows, their own gaps,
no conversation before the system origin: the warm-up transient) with d; win-d = same without fluctuations.
These columns count every request (``rejection=False``, the estimators before rejection-aware accounting);
a+b+c+d+r and win+r add (r): requests with ⌈T/b⌉ > N are rejected by vLLM (EngineAccounting.admitted).

Part ``content``: Algorithm 1 (``simulate_trace_content(..., practical=True)``, eq. (31) over the same window)
against paper eq. (39), ``estimate_finite`` (the issue's finite-capacity estimator, paper accounting) and the
engine-aware ``engine="content"`` estimators (mean field; finite; finite + fluctuations; window form), on the
ShareGPT setting (λ0 = 1.5, μ = 135 s, N = 2,275) and the long-context workload.

Part ``warm``: the stationary estimator (a+b+c+d+r) against the simulation with a 4,000-conversation warm-up
(ShareGPT, λ0 = 1.5, μ = 135 s, N = 2,275, 4,000 + 3,500 conversations), to separate the window's warm-up
transient from the accounting.

    NUMBA_CACHE_DIR=/tmp/numba_cache /tmp/venvtest/bin/python benchmarks/estimator_accuracy.py [--seeds 0 1] \
        [--json out.json] [--quick] [--only sharegpt long content warm]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from kvhit.estimate.accounting import engine_accounting
from kvhit.estimate.engine import estimate_engine, estimate_finite, estimate_window
from kvhit.estimate.mean_field import estimate
from kvhit.estimate.trace_stats import trace_moments
from kvhit.sim.runner import block_requests, simulate_trace_block, simulate_trace_content
from kvhit.workload.blocks import block_accounting
from kvhit.workload.dists import Exponential
from kvhit.workload.generate import trace_from_conversations
from kvhit.workload.sharegpt_trace import build_sharegpt_trace
from kvhit.workload.trace import Window

COLS = ["paper", "a", "a+c", "a+b+c", "a+b+c+d", "win-d", "win", "a+b+c+d+r", "win+r"]
CONTENT_COLS = ["eq39", "finite", "content-a", "content-a+c", "content-a+c+d", "content-win"]
ENGINES = ["vllm", "vllm-0.23"]
METRICS = {"tokens": "token_hit_ratio", "blocks": "h_blocks"}


def predictions(tr, n_warm, N, lam0, engine, metric):
    rows = Window.warmup_conversations(tr, n_warm, only_measured=True).mask(tr)
    win = Window.warmup_conversations(tr, n_warm)
    acc = engine_accounting(tr, engine=engine, metric=metric, rows=rows)
    out = {"paper": estimate(trace_moments(tr, rows=rows), N, lam0).h}
    kw = {"rejection": False}
    out["a"] = estimate_engine(acc, N, lam0, finite=False, fluctuations=False, **kw).h
    out["a+c"] = estimate_engine(acc, N, lam0, partial=False, fluctuations=False, **kw).h
    out["a+b+c"] = estimate_engine(acc, N, lam0, fluctuations=False, **kw).h
    out["a+b+c+d"] = estimate_engine(acc, N, lam0, **kw).h
    wkw = {"window": win, "engine": engine, "metric": metric}
    out["win-d"] = estimate_window(tr, N, lam0, fluctuations=False, **wkw, **kw).h
    out["win"] = estimate_window(tr, N, lam0, **wkw, **kw).h
    out["a+b+c+d+r"] = estimate_engine(acc, N, lam0).h
    out["win+r"] = estimate_window(tr, N, lam0, **wkw).h
    return out


def run_point(tr, n_warm, N, lam0):
    win = Window.warmup_conversations(tr, n_warm)
    rq = block_requests(tr, source="counts")
    res = {}
    for eng in ENGINES:
        _, m = simulate_trace_block(tr, N, engine=eng, window=win, requests=rq)
        for metric, key in METRICS.items():
            res[(eng, metric)] = {"actual": float(m[key]), **predictions(tr, n_warm, N, lam0, eng, metric)}
    return res


def sharegpt_grid(seeds, quick):
    mus = [90.0, 135.0, 240.0] if quick else [float(x) for x in range(90, 241, 15)]
    lams = [0.5, 1.25, 2.0] if quick else [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    pts = [("exp1", 1.5, mu) for mu in mus] + [("exp2", lam, 135.0) for lam in lams]
    out = []
    for grid, lam0, mu in pts:
        for seed in seeds:
            tr, _ = build_sharegpt_trace(
                n_warm=1000, n_meas=5000, seed=seed, lam0=lam0, interarrival=Exponential(mu), block_size=128
            )
            out.append(
                {"grid": grid, "lam0": lam0, "mu": mu, "seed": seed, "N": 2275, "res": run_point(tr, 1000, 2275, lam0)}
            )
    return out


def long_context_trace(seed, lam0, mu, n_conv=3000, b=64):
    """Agentic-coding-like conversations: M − 1 ~ Geometric (mean 9), prompts ~ lognormal (mean ≈ 1,500
    tokens, tool output), responses ~ lognormal (mean ≈ 300 tokens); T_M ≈ 15k tokens ≈ 240 blocks."""
    rng = np.random.default_rng(10_000 + seed)
    M = 1 + rng.geometric(1 / 9.0, size=n_conv)
    n = int(M.sum())
    p = np.maximum(1, rng.lognormal(np.log(1500) - 0.5, 1.0, size=n)).astype(np.int64)
    r = np.maximum(1, rng.lognormal(np.log(300) - 0.5, 1.0, size=n)).astype(np.int64)
    cols = block_accounting(M, p, r, b)
    extra = {k: cols[k] for k in ("prompt_tokens", "response_tokens", "cum_tokens", "R_full", "R_phys")}
    return trace_from_conversations(
        M,
        cols["Z"],
        lam0=lam0,
        interarrival=Exponential(mu),
        seed=seed,
        extra=extra,
        meta={"source": "long-context", "block_size": b},
    )


def long_context_grid(seeds, quick):
    Ns = [600, 1200] if quick else [400, 800, 1600]
    out = []
    for seed in seeds:
        tr = long_context_trace(seed, lam0=0.05, mu=30.0)
        for N in Ns:
            out.append(
                {"grid": "long", "lam0": 0.05, "mu": 30.0, "seed": seed, "N": N, "res": run_point(tr, 500, N, 0.05)}
            )
    return out


def content_point(tr, n_warm, N, lam0):
    """Algorithm 1 simulated (eq. (31) over App. E's window) and its estimators at one capacity."""
    win = Window.warmup_conversations(tr, n_warm)
    rows = Window.warmup_conversations(tr, n_warm, only_measured=True).mask(tr)
    acc = engine_accounting(tr, engine="content", rows=rows)
    return {
        "actual": float(simulate_trace_content(tr, N, window=win, practical=True).h),
        "eq39": estimate(trace_moments(tr, rows=rows), N, lam0).h,
        "finite": estimate_finite(tr, N, lam0, rows=rows).h,
        "content-a": estimate_engine(acc, N, lam0, finite=False, fluctuations=False).h,
        "content-a+c": estimate_engine(acc, N, lam0, fluctuations=False).h,
        "content-a+c+d": estimate_engine(acc, N, lam0).h,
        "content-win": estimate_window(tr, N, lam0, window=win, engine="content").h,
    }


def content_grid(seeds, quick):
    Ns = [600, 1200] if quick else [400, 800, 1600]
    out = []
    for seed in seeds:
        tr, _ = build_sharegpt_trace(
            n_warm=1000, n_meas=5000, seed=seed, lam0=1.5, interarrival=Exponential(135.0), block_size=128
        )
        out.append({"workload": "sharegpt", "N": 2275, "seed": seed, "res": content_point(tr, 1000, 2275, 1.5)})
        tr = long_context_trace(seed, lam0=0.05, mu=30.0)
        for N in Ns:
            out.append({"workload": "long", "N": N, "seed": seed, "res": content_point(tr, 500, N, 0.05)})
    return out


def content_table(points):
    lines = [
        "| workload | N | seed | Algorithm 1 sim | " + " | ".join(f"err {c}" for c in CONTENT_COLS) + " |",
        "|" + "---|" * (4 + len(CONTENT_COLS)),
    ]
    for p in points:
        r = p["res"]
        errs = " | ".join(f"{r[c] - r['actual']:+.4f}" for c in CONTENT_COLS)
        lines.append(f"| {p['workload']} | {p['N']} | {p['seed']} | {r['actual']:.4f} | {errs} |")
    lines += ["", "| workload | " + " | ".join(f"max abs {c}" for c in CONTENT_COLS) + " |"]
    lines.append("|" + "---|" * (1 + len(CONTENT_COLS)))
    for w in sorted({p["workload"] for p in points}):
        ps = [p["res"] for p in points if p["workload"] == w]
        mx = [max(abs(r[c] - r["actual"]) for r in ps) for c in CONTENT_COLS]
        lines.append(f"| {w} | " + " | ".join(f"{x:.4f}" for x in mx) + " |")
    return "\n".join(lines)


def warm_grid(seeds, n_warm=4000, n_meas=3500):
    """Stationary estimator vs the simulation after a long warm-up (ShareGPT, λ0 = 1.5, μ = 135 s; the corpus
    has 7,506 conversations with ≥ 2 turns, so 4,000 + 3,500)."""
    out = []
    for seed in seeds:
        tr, _ = build_sharegpt_trace(
            n_warm=n_warm, n_meas=n_meas, seed=seed, lam0=1.5, interarrival=Exponential(135.0), block_size=128
        )
        win = Window.warmup_conversations(tr, n_warm)
        rows = Window.warmup_conversations(tr, n_warm, only_measured=True).mask(tr)
        rq = block_requests(tr, source="counts")
        for eng in ENGINES:
            _, m = simulate_trace_block(tr, 2275, engine=eng, window=win, requests=rq)
            acc = engine_accounting(tr, engine=eng, metric="tokens", rows=rows)
            out.append(
                {
                    "seed": seed,
                    "engine": eng,
                    "actual": float(m["token_hit_ratio"]),
                    "a+b+c+d+r": float(estimate_engine(acc, 2275, 1.5).h),
                }
            )
    return out


def warm_table(points):
    lines = ["| engine | seed | actual (tokens) | err a+b+c+d+r |", "|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['engine']} | {p['seed']} | {p['actual']:.4f} | {p['a+b+c+d+r'] - p['actual']:+.4f} |")
    return "\n".join(lines)


def table(points, engine, metric):
    lines = [
        "| grid | λ0 | μ_W | N | seed | actual | " + " | ".join(f"err {c}" for c in COLS) + " |",
        "|" + "---|" * (6 + len(COLS)),
    ]
    for p in points:
        r = p["res"][(engine, metric)]
        errs = " | ".join(f"{r[c] - r['actual']:+.4f}" for c in COLS)
        lines.append(
            f"| {p['grid']} | {p['lam0']} | {p['mu']:.0f} | {p['N']} | {p['seed']} | {r['actual']:.4f} | {errs} |"
        )
    return "\n".join(lines)


def summary(points):
    lines = [
        "| grid | engine | metric | " + " | ".join(f"max abs {c}" for c in COLS) + " |",
        "|" + "---|" * (3 + len(COLS)),
    ]
    for grid in sorted({p["grid"] for p in points}):
        for eng in ENGINES:
            for metric in METRICS:
                ps = [p["res"][(eng, metric)] for p in points if p["grid"] == grid]
                mx = [max(abs(r[c] - r["actual"]) for r in ps) for c in COLS]
                lines.append(f"| {grid} | {eng} | {metric} | " + " | ".join(f"{x:.4f}" for x in mx) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="+", choices=["sharegpt", "long", "content", "warm"], default=None)
    a = ap.parse_args()
    parts = a.only or ["sharegpt", "long", "content", "warm"]
    t0 = time.perf_counter()
    pts = []
    if "sharegpt" in parts:
        pts += sharegpt_grid(a.seeds, a.quick)
    if "long" in parts:
        pts += long_context_grid(a.seeds, a.quick)
    dump = {}
    if pts:
        print("## Max |estimate − simulated| per grid, engine, metric and ingredient\n")
        print(summary(pts))
        for eng in ENGINES:
            for metric in METRICS:
                print(f"\n## {eng}, metric {metric}: estimate − actual per point\n")
                print(table(pts, eng, metric))
        dump["engine"] = [
            {**{k: v for k, v in p.items() if k != "res"}, "res": {f"{e}/{m}": r for (e, m), r in p["res"].items()}}
            for p in pts
        ]
    if "content" in parts:
        cp = content_grid(a.seeds, a.quick)
        print("\n## Algorithm 1 (content): estimate − simulated (practical metric eq. (31))\n")
        print(content_table(cp))
        dump["content"] = cp
    if "warm" in parts:
        wp = warm_grid(sorted(set(a.seeds) | {0, 1, 2}) if not a.quick else a.seeds)
        print("\n## Stationary estimator after a 4,000-conversation warm-up (ShareGPT, λ0 = 1.5, μ = 135 s, 3,500")
        print("measured conversations, N = 2,275, vLLM token metric)\n")
        print(warm_table(wp))
        dump["warm"] = wp
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dump, f, indent=1)


if __name__ == "__main__":
    main()
