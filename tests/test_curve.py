"""kvhit.experiments.curve: the default capacity range ends where the exact curves saturate (stated rule), the
vLLM series are marked infeasible below the largest request, and the curve's values are the simulators'."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kvhit.experiments.curve import (
    POLICIES,
    SATURATION_MARGIN,
    SATURATION_QUANTILE,
    curve_data,
    curve_inputs,
    default_capacity_range,
    saturation_capacity,
)
from kvhit.sim.runner import simulate_trace_block, simulate_trace_content
from kvhit.workload import Window, WorkloadSpec, generate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _trace(name: str, n: int):
    sp = WorkloadSpec.from_toml(EXAMPLES / name)
    tr = generate(sp, 0, n_conversations=n)
    tr.meta.update(n_warm=n // 5, block_size=128)
    return tr, Window.warmup_conversations(tr, n // 5)


@pytest.fixture(scope="module", params=[("scm.toml", 3000), ("long_context.toml", 400)])
def case(request):
    tr, window = _trace(*request.param)
    return tr, window, curve_inputs(tr, window)


def test_default_range_ends_where_every_curve_saturates(case):
    tr, window, inp = case
    n_min, n_max = default_capacity_range(inp)
    sat = saturation_capacity(inp)
    assert set(sat) == set(POLICIES)
    n_sat = max(sat.values())
    assert n_max == math.ceil(SATURATION_MARGIN * max(n_sat, inp.N_min))
    big = 10**12
    Ns = np.array(sorted({n_sat - 1, n_sat, n_max, big}), np.int64)
    d = curve_data(tr, Ns, window, estimates=False, inputs=inp)
    at = {int(n): i for i, n in enumerate(Ns)}
    for p, label in POLICIES.items():
        plateau = d[label][at[big]]
        assert plateau > 0
        # at its own saturation capacity each curve has reached 99% of its plateau, and at the range's end too
        own = np.array([sat[p]], np.int64)
        h_own = curve_data(tr, own, window, estimates=False, inputs=inp, policies=(p,))[label][0]
        assert h_own >= SATURATION_QUANTILE * plateau * (1 - 1e-12) or not np.isfinite(h_own)
        if np.isfinite(d[label][at[n_max]]):
            assert d[label][at[n_max]] >= SATURATION_QUANTILE * plateau
    # the rule is tight: one block below N_sat the slowest curve is still below 99% of its plateau
    slowest = max(sat, key=sat.get)
    lab = POLICIES[slowest]
    below = curve_data(tr, np.array([n_sat - 1], np.int64), window, estimates=False, inputs=inp, policies=(slowest,))
    assert below[lab][0] < SATURATION_QUANTILE * d[lab][at[big]] or not np.isfinite(below[lab][0])


def test_long_context_range_covers_the_largest_request():
    tr, window = _trace("long_context.toml", 400)
    inp = curve_inputs(tr, window)
    assert inp.N_min == int(tr["R"].max())  # practical model T = R·b − 1: ⌈T/b⌉ = R
    _, n_max = default_capacity_range(inp)
    assert n_max >= SATURATION_MARGIN * inp.N_min


def test_vllm_series_are_infeasible_below_the_largest_request_and_exact_above():
    tr, window = _trace("long_context.toml", 300)
    inp = curve_inputs(tr, window)
    Ns = np.array([inp.N_min - 1, inp.N_min, inp.N_min + 500], np.int64)
    d = curve_data(tr, Ns, window, inputs=inp)
    assert d["feasible"].tolist() == [False, True, True]
    for label in (POLICIES["vllm"], POLICIES["vllm-0.23"], "estimate: vLLM ≥ 0.24 (engine-aware)"):
        assert np.isnan(d[label][0]) and np.isfinite(d[label][1:]).all()
    assert np.isfinite(d[POLICIES["content"]]).all()  # Algorithm 1 never refuses
    for k in (1, 2):
        N = int(Ns[k])
        m = simulate_trace_block(tr, N, engine="vllm", window=window)[1]
        assert d[POLICIES["vllm"]][k] == pytest.approx(m["h_blocks"], abs=1e-12)
        h = simulate_trace_content(tr, N, window=window, practical=True).h
        assert d[POLICIES["content"]][k] == pytest.approx(h, abs=1e-12)
