"""The closed-form displacement moments (kvhit.estimate.displacement.phi_moments) equal the segment-by-segment
integration they replace, and both equal a brute-force integral over arrival times."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.estimate.displacement import phi_moments, phi_moments_reference


@st.composite
def conversations(draw):
    L = draw(st.integers(1, 5))
    Ms = [draw(st.integers(1, 7)) for _ in range(L)]
    gaps = st.one_of(st.just(0.0), st.floats(0.01, 20.0))  # ties (zero gaps) included
    off, cn, hist = [], [], []
    for M in Ms:
        g = [0.0] + [draw(gaps) for _ in range(M - 1)]
        off.append(np.cumsum(g))
        cn.append(np.cumsum([draw(st.integers(0, 6)) for _ in range(M)]).astype(float))
        hist.append(np.array([draw(st.integers(0, 12)) for _ in range(M)], float))
    ptr = np.concatenate([[0], np.cumsum(Ms)]).astype(np.int64)
    t = np.array(draw(st.lists(st.one_of(st.just(0.0), st.floats(0.0, 60.0)), min_size=1, max_size=8)))
    return ptr, np.concatenate(off), np.concatenate(cn), np.concatenate(hist), t


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_closed_form_equals_segment_integration(case):
    ptr, off, cn, hist, t = case
    m, v = phi_moments(ptr, off, cn, hist, t)
    m0, v0 = np.zeros(t.size), np.zeros(t.size)
    phi_moments_reference(ptr, off, cn, hist, t, m0, v0)
    np.testing.assert_allclose(m, m0, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(v, v0, rtol=1e-10, atol=1e-9)


def _phi_brute(s, new, hist, a, t):
    inside = np.flatnonzero((a + s > 0) & (a + s <= t))
    if inside.size == 0:
        return 0.0
    f, lst = inside[0], inside[-1]
    return new[f : lst + 1].sum() + (hist[f - 1] if f >= 1 else 0.0)


def test_both_equal_a_riemann_sum_over_arrival_times():
    s = np.array([0.0, 2.0, 2.0, 7.5, 9.0])
    new = np.array([3.0, 1.0, 0.0, 2.0, 5.0])
    hist = np.array([3.0, 4.0, 4.0, 6.0, 11.0])
    ptr = np.array([0, 5], np.int64)
    for t in (0.5, 3.0, 8.0, 20.0):
        edges = np.linspace(-s[-1] - 1, t + 1, 20_001)
        da = edges[1] - edges[0]
        phi = np.array([_phi_brute(s, new, hist, x, t) for x in 0.5 * (edges[1:] + edges[:-1])])  # midpoints
        m, v = phi_moments(ptr, s, np.cumsum(new), hist, np.array([t]))
        assert abs(m[0] - phi.sum() * da) < 0.01 * max(1.0, m[0])
        assert abs(v[0] - (phi**2).sum() * da) < 0.01 * max(1.0, v[0])


def test_long_conversation_takes_the_segment_path_and_agrees():
    # 400 accesses within a short span: more surviving pairs than 4·G·M, so phi_moments integrates segments
    rng = np.random.default_rng(0)
    M = 400
    s = np.sort(rng.uniform(0, 1.0, M))
    s[0] = 0.0
    cn = np.cumsum(rng.integers(0, 4, M)).astype(float)
    hist = rng.integers(0, 30, M).astype(float)
    ptr = np.array([0, M], np.int64)
    t = np.array([0.1, 0.5, 2.0])
    m, v = phi_moments(ptr, s, cn, hist, t)
    m0, v0 = np.zeros(3), np.zeros(3)
    phi_moments_reference(ptr, s, cn, hist, t, m0, v0)
    np.testing.assert_allclose(m, m0, rtol=1e-10)
    np.testing.assert_allclose(v, v0, rtol=1e-10)


@settings(max_examples=300, deadline=None)
@given(conversations(), st.lists(st.one_of(st.just(0.0), st.floats(0.0, 200.0)), min_size=1, max_size=8))
def test_phi_table_kernel_is_its_reference_bit_for_bit(case, s_points):
    """_phi_table_kernel (whole-segment sums reused below the first segment, segments ending before the cut
    skipped) adds exactly what the segment-by-segment _phi_table_reference adds, in the same order."""
    from kvhit.estimate.displacement import _phi_table_kernel, _phi_table_reference

    ptr, off, cn, hist, t = case
    tg = np.unique(t)
    sg = np.unique(np.asarray(s_points))
    out = []
    for kernel in (_phi_table_kernel, _phi_table_reference):
        m, v = np.zeros((tg.size, sg.size)), np.zeros((tg.size, sg.size))
        kernel(ptr, off, cn, hist, tg, sg, m, v)
        out.append((m, v))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


@settings(max_examples=300, deadline=None)
@given(conversations(), st.lists(st.one_of(st.just(0.0), st.floats(0.0, 200.0)), min_size=1, max_size=8))
def test_phi_table_grouped_is_the_kernel_to_rounding(case, s_points):
    """_phi_table_grouped (whole-segment sums bucketed by their first column and summed cumulatively over s, cut
    columns by suffix sums) adds the kernel's terms in another order: equal to 1e-12 relative, and adds onto out."""
    from kvhit.estimate.displacement import _phi_table_grouped, _phi_table_reference

    ptr, off, cn, hist, t = case
    tg = np.unique(t)
    sg = np.unique(np.asarray(s_points))
    out = []
    for kernel in (_phi_table_grouped, _phi_table_reference):
        m, v = np.full((tg.size, sg.size), 1.0), np.full((tg.size, sg.size), 2.0)
        kernel(ptr, off, cn, hist, tg, sg, m, v)
        out.append((m, v))
    for a, b in zip(out[0], out[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(b).max())))
