"""``request_reuse``'s compiled passes (issue 23 §6) against its numpy implementation at commit da358f2.

The reference below is the body of ``kvhit.workload.reuse.request_reuse`` as it stood at da358f2 (before the
compiled ``_id_groups`` / ``_per_request`` / ``_segments``), copied unchanged: every field must be equal, integer
for integer, on the stored production traces (whole blocks and chunks), a generated kvhit trace and random id
streams (hypothesis: shared prefixes across sessions, several agents per session, repeated and empty prompts).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvhit.workload.reuse as RU
from kvhit.workload.production import read_mooncake, read_weka
from kvhit.workload.reuse import _chunked, _leading, _table, request_reuse

DATA = Path(__file__).parent / "data" / "production"
MOON = DATA / "mooncake_small.jsonl"
W22, W26, W14 = DATA / "weka_0022.json", DATA / "weka_0026.json", DATA / "weka_0014_cut.json"


def _reference(tb, chunk_blocks=1) -> dict:
    """request_reuse at da358f2, from its table (time, T, off, ids, sess, stream, b, kind)."""
    time, T, off, ids, sess, stream, b, kind = tb
    if chunk_blocks > 1:
        off, ids, b = _chunked(T, off, ids, b, int(chunk_blocks))
    n = T.shape[0]
    F = np.diff(off)
    m = ids.shape[0]
    req_of = np.repeat(np.arange(n, dtype=np.int64), F)
    # previous access of every id (stream order = arrival order, ties in file order)
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    same = np.zeros(m, bool)
    if m:
        same[1:] = sid[1:] == sid[:-1]
    prev_pos = np.full(m, -1, np.int64)
    prev_pos[order[same]] = order[np.flatnonzero(same) - 1]
    prev_req = np.where(prev_pos >= 0, req_of[np.maximum(prev_pos, 0)], -1)
    L_any = _leading(prev_pos >= 0, off)
    # sessions per id (shared prefixes)
    if m:
        grp_start = ~same
        gid = np.cumsum(grp_start) - 1
        key = np.unique(gid * (int(sess.max()) + 1) + sess[req_of[order]])
        nsess = np.bincount(key // (int(sess.max()) + 1), minlength=int(gid[-1]) + 1)
        sess_of_id = np.empty(m, np.int64)
        sess_of_id[order] = nsess[gid]
        distinct = int(gid[-1]) + 1
        n_shared = int((nsess >= 2).sum())
    else:
        sess_of_id = np.zeros(0, np.int64)
        distinct = n_shared = 0
    L_shared = _leading(sess_of_id >= 2, off)
    last_sh = np.zeros(n, np.int64)
    has = L_shared > 0
    last_sh[has] = sess_of_id[off[:-1][has] + L_shared[has] - 1]
    # previous request of the same stream and the common leading prefix with it
    so = np.lexsort((np.arange(n), stream))
    prev = np.full(n, -1, np.int64)
    if n:
        cont = np.zeros(n, bool)
        cont[1:] = stream[so[1:]] == stream[so[:-1]]
        prev[so[cont]] = so[np.flatnonzero(cont) - 1]
    gap = np.full(n, np.nan)
    hp = prev >= 0
    gap[hp] = time[hp] - time[prev[hp]]
    L_own = np.zeros(n, np.int64)
    if hp.any():
        r = np.flatnonzero(hp)
        p = prev[r]
        mm = np.minimum(F[r], F[p])
        tot = int(mm.sum())
        if tot:
            within = np.arange(tot, dtype=np.int64) - np.repeat(np.cumsum(mm) - mm, mm)
            eq = ids[np.repeat(off[r], mm) + within] == ids[np.repeat(off[p], mm) + within]
            o2 = np.zeros(r.shape[0] + 1, np.int64)
            np.cumsum(mm, out=o2[1:])
            L_own[r] = _leading(eq, o2)
    # age segments of the reusable run: runs of equal prev_req inside [0, L_any)
    within_all = np.arange(m, dtype=np.int64) - np.repeat(off[:-1], F)
    in_run = within_all < L_any[req_of] if m else np.zeros(0, bool)
    start = in_run.copy()
    if m:
        start[1:] &= (within_all[1:] == 0) | (prev_req[1:] != prev_req[:-1])
        start[0] = in_run[0]
    spos = np.flatnonzero(start)
    seg_req = req_of[spos]
    seg_start = within_all[spos]
    seg_src = prev_req[spos]
    seg_off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(seg_req, minlength=n), out=seg_off[1:])
    nxt = np.empty(spos.shape[0], np.int64)
    if spos.shape[0]:
        nxt[:-1] = seg_start[1:]
        same_req = np.zeros(spos.shape[0], bool)
        same_req[:-1] = seg_req[1:] == seg_req[:-1]
        nxt = np.where(same_req, nxt, L_any[seg_req])
    seg_end = nxt
    return {
        "time": time,
        "prompt_tokens": T,
        "full_blocks": F,
        "session": sess,
        "stream": stream,
        "block_size": b,
        "prev": prev,
        "gap": gap,
        "L_own": L_own,
        "L_any": L_any,
        "L_shared": L_shared,
        "seg_off": seg_off,
        "seg_start": seg_start,
        "seg_end": seg_end,
        "seg_src": seg_src,
        "source": kind,
        "n_shared_ids": n_shared,
        "shared_sessions_of_last": last_sh,
        "distinct_blocks": distinct,
    }


def _assert_same(u, ref: dict):
    for f in fields(u):
        got, want = getattr(u, f.name), ref[f.name]
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype, f.name
            assert np.array_equal(got, want, equal_nan=True), f.name
        else:
            assert got == want, f.name


@pytest.mark.parametrize("chunk", [1, 4])
def test_stored_traces_equal_reference(chunk):
    for src in (read_mooncake(MOON), read_weka([W22, W26, W14], arrival="uniform", span=900, seed=1)):
        u = request_reuse(src, chunk_blocks=chunk)
        _assert_same(u, _reference(_table(src), chunk))
        assert u.seg_src.size and u.n_shared_ids >= 0


def test_generated_trace_equals_reference():
    from kvhit.workload.dists import Constant, Exponential, Geometric
    from kvhit.workload.generate import generate
    from kvhit.workload.spec import IIDIncrements, WorkloadSpec

    tr = generate(WorkloadSpec(0.05, Geometric(0.7), IIDIncrements(Constant(5)), Exponential(30.0)), 2,
                  n_conversations=80)  # fmt: skip
    tr.meta["block_size"] = 16
    _assert_same(request_reuse(tr), _reference(_table(tr)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 100_000), n=st.integers(0, 40), vocab=st.integers(1, 30))
def test_random_streams_equal_reference(seed, n, vocab):
    rng = np.random.default_rng(seed)
    sess = rng.integers(0, max(1, n // 3), n).astype(np.int64)
    stream = (sess * 2 + rng.integers(0, 2, n)).astype(np.int64)
    F = rng.integers(0, 9, n)
    off = np.concatenate([[0], np.cumsum(F)]).astype(np.int64)
    # prefixes from a small vocabulary of chains: shared heads, divergences, repeats
    heads = rng.integers(0, vocab, n)
    ids = np.concatenate(
        [
            heads[r] * 1000
            + np.minimum(np.arange(F[r]), rng.integers(1, 9)) * 7
            + (np.arange(F[r]) >= rng.integers(0, 9))
            for r in range(n)
        ]
        or [np.zeros(0)]
    )
    tb = (np.sort(rng.uniform(0, 100, n)), F * 16 + 3, off, ids.astype(np.int64), sess, stream, 16, "trace")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RU, "_table", lambda source: tb)
        u = request_reuse(None)
    _assert_same(u, _reference(tb))
