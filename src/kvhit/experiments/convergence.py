"""Mean-field convergence (Theorem 3.1 / C.5): simulated h^(N) → h^(∞) as N grows with λ0^(N) = N·λ0.

For each capacity N the arrival rate is scaled to N·λ0 (App. B.5) with every other primitive fixed, a trace is
generated, Algorithm 1 is simulated, and h is measured (eq. (12), or eq. (31) with ``practical``) over a window
that starts after ``warmup`` time units and stops at the last arrival. Independent replications give a Student-t
95% interval. ``python -m kvhit.experiments.convergence`` prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvhit.estimate import theory
from kvhit.sim.metrics import mean_ci
from kvhit.sim.runner import simulate_trace_content
from kvhit.workload import Geometric, WorkloadSpec, generate
from kvhit.workload.dists import Constant, Exponential
from kvhit.workload.spec import PromptResponse
from kvhit.workload.trace import Window

__all__ = ["ConvergenceRow", "default_spec", "convergence_table"]


@dataclass(frozen=True)
class ConvergenceRow:
    """One capacity of the mean-field convergence table (Theorem 3.1): N, the scaled λ0·N, the simulated h with its
    95% half-width, the limit h(∞) and the turns simulated."""

    N: int
    lam0_scaled: float
    h_sim: float
    ci95: float
    h_inf: float
    conversations: int
    turns: int

    @property
    def error(self) -> float:
        return self.h_sim - self.h_inf


def default_spec() -> WorkloadSpec:
    """An SCM (geometric turns, p = 0.6; X ~ Geometric(mean 2); Y = 1; W ~ Exp(1)) with λ0 chosen so that
    T_C = 1 (the cache holds one mean interarrival's worth of traffic): h(∞) is mid-range, not saturated."""
    base = WorkloadSpec(
        1.0,
        Geometric(0.6),
        PromptResponse(Geometric.from_mean(2.0), Constant(1)),
        Exponential(1.0),
        name="convergence SCM",
    )
    mom = theory.moments(base)
    lam0 = 1.0 / float(theory.d(1.0, mom, base.interarrival, lam0=1.0))  # d(1) = 1 at this λ0
    return base.with_lam0(lam0)


def convergence_table(
    Ns=(100, 1_000, 10_000, 100_000),
    *,
    spec: WorkloadSpec | None = None,
    horizon: float = 40.0,
    warmup: float = 10.0,
    replications: int = 8,
    seed: int = 0,
    practical: bool = False,
) -> list[ConvergenceRow]:
    """Simulated h^(N) with 95% CI vs h^(∞) for each N (arrival rate N·λ0, horizon and warm-up in time units)."""
    spec = spec or default_spec()
    h_inf = theory.h_prac_infinity(spec) if practical else theory.h_infinity(spec)
    rows = []
    for N in Ns:
        scaled = spec.with_lam0(spec.lam0 * N)
        hs, conv, turns = [], 0, 0
        for r in range(replications):
            tr = generate(scaled, seed + 1000 * r + int(N) % 997, horizon=horizon)
            end = float(tr.conversations()["arrival"].max())
            st = simulate_trace_content(tr, int(N), window=Window(warmup, end), practical=practical)
            hs.append(st.h)
            conv += tr.n_conversations
            turns += tr.n_turns
        h, half = mean_ci(hs)
        rows.append(ConvergenceRow(int(N), scaled.lam0, h, half, h_inf, conv, turns))
    return rows


def main() -> None:  # pragma: no cover - a report for humans
    """Print the convergence table (``python -m kvhit.experiments.convergence``)."""
    rows = convergence_table()
    print(f"{'N':>8} {'λ0·N':>10} {'h_sim':>8} {'±95%':>8} {'h(∞)':>8} {'h_sim−h(∞)':>11} {'turns':>10}")
    for r in rows:
        print(
            f"{r.N:>8,} {r.lam0_scaled:>10.3f} {r.h_sim:>8.4f} {r.ci95:>8.4f} {r.h_inf:>8.4f} "
            f"{r.error:>11.4f} {r.turns:>10,}"
        )


if __name__ == "__main__":  # pragma: no cover
    main()
