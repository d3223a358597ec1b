# ruff: noqa: E501
"""Hand-made mutation pass over ``src/kvhit/plan/planner.py``: plant each bug below, one at a time, run the planning
tests, and report which bugs no test noticed (survivors).

    .venv/bin/python tests/mutants_plan.py            # all mutants (~30 s each on this machine)
    .venv/bin/python tests/mutants_plan.py M01 M07    # some

The unmutated suite must pass first (else a "kill" means nothing). The file is restored after every mutant (also
on Ctrl-C). Not collected by pytest (no ``test_`` prefix). M22 is an equivalent mutant under the current code
(a capacity of one block is refused as infeasible for vLLM before the guard is reached, and the Algorithm 1
predictor is 0 there anyway); it is kept as a record.
mutmut 3.8.1 installs here, but it generates a mutant per operator/constant of the module (hundreds for
plan.py) and this suite needs ~30 s per run on the shared 2-core machine: hours, hence this list of bugs a
person could plausibly write.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "src" / "kvhit" / "plan" / "planner.py"
TESTS = ["tests/test_plan.py", "tests/test_plan_pinned.py"]

#: (id, what the bug is, exact text in plan.py (its first occurrence is mutated), replacement)
MUTANTS = [
    ("M01", "verify simulates at half the planned capacity",
     "p.verify = _verify(wl, cap.N, p.h_at_capacity)", "p.verify = _verify(wl, cap.N // 2, p.h_at_capacity)"),
    ("M02", "prefill saved drops its λ0 factor",
     "p.h_at_capacity * wl.lam0 * wl.prompt_tokens_per_conv", "p.h_at_capacity * wl.prompt_tokens_per_conv"),
    ("M03", "GiB for the target priced at the budget's N",
     "p.gib_for_target = p.N_for_target * cap.bytes_per_block", "p.gib_for_target = cap.N * cap.bytes_per_block"),
    ("M04", "smallest capacity off by one (returns the last miss)", "    return hi\n\n\n@dataclass", "    return lo\n\n\n@dataclass"),
    ("M05", "target reached only strictly above", "ok = h(grid) >= target", "ok = h(grid) > target"),
    ("M06", "largest λ0 returns the bracket's lower end", "return math.exp(brentq(g, lo, hi, xtol=rtol))", "return math.exp(lo)"),
    ("M07", "largest λ0 evaluates h at the workload's own λ0",
     "_largest_lam0(lambda lam0: h_at(cap.N, lam0), target, wl.lam0)", "_largest_lam0(lambda lam0: h_at(cap.N), target, wl.lam0)"),
    ("M08", "measured conversations exclude the first one after warm-up", "measured = conv_ids >= nw", "measured = conv_ids > nw"),
    ("M09", "the lam0 argument ignored on a trace",
     'lam = float(lam0 if lam0 is not None else tr.meta.get("lam0", mom.lam0_hat))', 'lam = float(tr.meta.get("lam0", mom.lam0_hat))'),
    ("M10", "prompt tokens per block counted b instead of b − 1 for the partial block",
     'weights=(tr["R"] * b - 1).astype(float)', 'weights=(tr["R"] * b).astype(float)'),
    ("M11", "prompt tokens averaged over warm-up conversations too", "tokens = float(per[measured].mean())", "tokens = float(per.mean())"),
    ("M12", "engine ceiling replaced by the paper's", "h_max = float(acc.h_max)", "h_max = float(mom.h_max_hash)"),
    ("M13", "capacity rounds the block count up",
     "return Capacity(int(hardware.blocks_from_bytes(kv_bytes, bpb)),", "return Capacity(int(hardware.blocks_from_bytes(kv_bytes, bpb)) + 1,"),
    ("M14", "a target above the ceiling is not refused", "if target >= wl.h_max:", "if target >= wl.h_max + 1:"),
    ("M15", "verify always reports the token metric",
     'm["token_hit_ratio"] if wl.metric == "tokens" else m["h_blocks"]', 'm["token_hit_ratio"]'),
    ("M16", "verify ignores the warm-up window",
     "window = Window.warmup_conversations(tr, nw) if nw > 0 else Window.all()", "window = Window.all()"),
    ("M17", "spec prompt tokens from A_H instead of A_R", "mom.A_R * block_size,", "mom.A_H * block_size,"),
    ("M18", "spec predictor uses the base model's A_H", "mom.A_R, mom.A_H_hash, mom.E_B, spec.interarrival", "mom.A_R, mom.A_H, mom.E_B, spec.interarrival"),
    ("M19", "target 0 accepted", "if not 0 < target < 1:", "if not 0 <= target < 1:"),
    ("M20", "saved fraction reported as the miss ratio", "p.saved_fraction = p.h_at_capacity", "p.saved_fraction = 1 - p.h_at_capacity"),
    ("M21", "verify simulates Algorithm 1 with the base weights",
     "simulate_trace_content(tr, N, window=window, practical=True).h", "simulate_trace_content(tr, N, window=window, practical=False).h"),
    ("M22", "one block treated as able to hold history", "if N < 2:", "if N < 1:"),
    ("M23", "both an accelerator and a budget accepted",
     "if (accelerator is None) == (kv_gb is None):", "if accelerator is None and kv_gb is None:"),
    ("M24", "trace predictor ignores its λ0 argument",
     "return np.asarray(est.estimate_engine(acc, N, lam_, F).h, dtype=float)", "return np.asarray(est.estimate_engine(acc, N, lam, F).h, dtype=float)"),
    ("M25", "note on an unreachable budget inverted", "if h_cap < target:", "if h_cap > target:"),
]  # fmt: skip


def main(argv: list[str]) -> int:
    want = set(argv)
    orig = PLAN.read_text(encoding="utf-8")
    base = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *TESTS], cwd=ROOT, capture_output=True
    )
    if base.returncode != 0:  # a kill only means something when the unmutated suite passes
        print("the planning tests fail on the unmutated plan/planner.py: fix them first")
        return 1
    rows = []
    try:
        for mid, what, old, new in MUTANTS:
            if want and mid not in want:
                continue
            if old not in orig:
                rows.append((mid, what, "NOT APPLIED (text not found)", 0.0))
                continue
            line = orig[: orig.index(old)].count("\n") + 1
            what = f"{what} (line {line})"
            PLAN.write_text(orig.replace(old, new, 1), encoding="utf-8")  # the first occurrence only
            t0 = time.perf_counter()
            r = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", *TESTS],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            status = "killed" if r.returncode != 0 else "SURVIVED"
            rows.append((mid, what, status, time.perf_counter() - t0))
            print(f"{mid} {status:9s} {rows[-1][3]:5.0f} s  {what}", flush=True)
    finally:
        PLAN.write_text(orig, encoding="utf-8")
    killed = sum(r[2] == "killed" for r in rows)
    print(f"\n{killed}/{len(rows)} mutants killed; survivors: {[r[0] for r in rows if r[2] != 'killed']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
