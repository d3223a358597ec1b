"""kvhit from Python: spec → theory; trace → simulators and estimators. Run: python examples/quickstart.py"""

import numpy as np

from kvhit.estimate import theory
from kvhit.estimate.engine import estimate_engine
from kvhit.estimate.mean_field import estimate
from kvhit.estimate.trace_stats import trace_moments
from kvhit.sim.runner import simulate_trace_block, simulate_trace_content
from kvhit.workload import Geometric, Window, WorkloadSpec, generate

spec = WorkloadSpec.scm(1.5, 0.75, x=Geometric.from_mean(4), y=Geometric.from_mean(3), mean_w=135.0)
m = theory.moments(spec)
print(f"A_R = {m.A_R:.2f}, A_H_hash = {m.A_H_hash:.2f}, E[B] = {m.E_B:.2f}, h_max = {m.h_max:.3f}")
Ns = np.array([1000, 2275, 10000])
print("mean-field h (eq. 32):", np.round(theory.h_mean_field(spec, Ns, practical=True), 4))

trace = generate(spec, seed=0, n_conversations=25_000)  # a reproducible trace (columns conv, time, Z, R, ...)
trace.meta["block_size"] = 128
window = Window.warmup_conversations(trace, 5_000)  # skip the warm-up conversations
for N in Ns:
    alg1 = simulate_trace_content(trace, N, window=window, practical=True).h
    _, vllm = simulate_trace_block(trace, N, engine="vllm", window=window)
    print(f"N = {N:>6,}: Algorithm 1 h = {alg1:.4f}   vLLM block cache h = {vllm['h_blocks']:.4f}")

conv = trace.conversations()
measured = conv["conv"][conv["arrival"] >= window.start]
mom = trace_moments(trace, measured)  # eq. (35)-(37)
print("paper estimator (eq. 39):", np.round(estimate(mom, Ns, 1.5, "empirical").h, 4))
print(
    "engine-aware (vLLM):     ",
    np.round(estimate_engine(trace, Ns, 1.5, metric="blocks", rows=np.isin(trace["conv"], measured)).h, 4),
)
