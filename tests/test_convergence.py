"""Theorem 3.1 / C.5 in simulation: with λ0^(N) = N·λ0, Algorithm 1's hit ratio approaches h(∞) (eq. (25))."""

from __future__ import annotations

from kvhit.estimate import theory
from kvhit.experiments.convergence import convergence_table, default_spec


def test_default_spec_is_mid_range():
    spec = default_spec()
    assert abs(float(theory.T_C(spec)) - 1.0) < 1e-9  # λ0 chosen so that T_C = 1
    h = theory.h_infinity(spec)
    assert 0.2 < h < theory.moments(spec).h_max - 0.1


def test_simulated_hit_ratio_converges_to_mean_field_limit():
    rows = convergence_table(Ns=(100, 1_000, 100_000), replications=8, horizon=40.0, warmup=10.0)
    big = rows[-1]
    assert big.turns > 5_000_000
    assert big.ci95 < 0.0025  # the interval is well below the tolerance
    assert abs(big.error) < 0.005
    # and the finite-N error shrinks from N = 10² to N = 10⁵ (beyond the statistical noise)
    assert abs(rows[0].error) > abs(big.error) + big.ci95
