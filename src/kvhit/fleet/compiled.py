"""Compiled fleet pass for the load- and cache-aware routers: the step-wise fleet in one numba kernel.

Invariant. :func:`simulate_compiled` returns, request by request, the same replica, hit blocks, new blocks, wait and
rejection as the step-wise path of :func:`kvhit.fleet.simulate.simulate_fleet` (``fast=False``) for the routers
``sticky``, ``least-loaded``, ``dynamo``, ``llm-d`` and ``sglang`` in every mode of :mod:`kvhit.fleet.routers`
(precise and approximate indexes, Dynamo's softmax temperature, lagged load snapshots, holds, colocated KV, the
per-request timing ``prefill_hold`` / ``hit_token_seconds``) — tested equal under ``hypothesis`` in
``tests/test_fleet_compiled.py`` and ``tests/test_fleet_timing.py``. It runs the same event loop (one global finish
heap ordered by (time, request index), finishes before arrivals at equal times, per-replica FIFO queues with
head-of-line blocking, the affected replica retried after every event) over ``R`` compiled vLLM block pools — the
very helpers of :mod:`kvhit.sim.vllm.block` (``_lookup``, ``_start``, ``_free``), one pool per replica — and scores
each request with the rule of its router, in the same floating-point operation order, drawing from the router's own
``numpy`` generator (numba implements ``Generator.integers`` and ``Generator.random`` with NumPy's algorithms on the
shared bit generator, so ties and softmax draws consume the same stream; Dynamo's softmax sums its weights in
NumPy's pairwise order, :func:`_np_sum`).

How the router state is kept. Precise overlaps probe each replica's own hash table (no router-side copy);
the unbounded approximate indexes (Dynamo's TTL shadow, SGLang's never-evicted tree) are one expiry per (block hash,
replica), the hashes first mapped to dense ids (a table as large as the distinct hashes: their cost, see
``benchmarks/bench_fleet_kv.py``); llm-d's LRU shadow, bounded by ``N_k``, is per replica a small hash table and a
doubly linked LRU order, like a block pool.
``router_ops`` counts the router's probes of the replicas' hash tables (precise modes), so ``block_ops +
router_ops`` is the step-wise path's pool counter.

NOT modelled here beyond the step-wise fleet (same NOT-modelled list as :mod:`kvhit.fleet.simulate`); the
oblivious routers keep their own compiled path (route, then :func:`kvhit.sim.vllm.block.simulate_block` per
replica), except with ``hit_token_seconds > 0``, which ``simulate_block`` has not: then they route first and this
kernel runs with the routes given (``routes``, kernel code :data:`FIXED_ROUTES`; tested equal to the step-wise path
under ``hypothesis`` in ``tests/test_fleet_timing.py``). Equality with temperature > 0 also needs both paths to take
the same exp: numba's scalar ``np.exp`` is libm's, which the step-wise router calls as ``math.exp`` (NumPy's
vectorised exp differs from it in the last bit on CPUs with AVX-512 — 65,185 of 2·10⁶ draws on this repository's CI
machine; tested on the softmax's argument range, ``test_numba_exp_is_libms``; a last-bit difference could flip a
draw only when it lands on a cumulative-weight boundary).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvhit.sim.vllm.block import _free, _heap_pop, _heap_push, _ht_delete_slot, _ht_find, _lookup, _start

__all__ = ["COMPILED_ROUTERS", "simulate_compiled"]

#: router name -> kernel code
COMPILED_ROUTERS = {"least-loaded": 0, "sticky": 1, "dynamo": 2, "llm-d": 3, "sglang": 4}

_NX, _PV = 0, 1
_NEG = -np.inf


# ---- NumPy-identical reductions and tie-breaks ----------------------------------------------------------------


@njit(cache=True)
def _pw_leaf(a, lo, n):
    """NumPy's ``pairwise_sum`` over ``a[lo:lo + n]`` for ``n <= 128`` (8 accumulators past 8 terms)."""
    if n < 8:
        res = -0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - (n % 8):
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True)
def _np_sum(a, n):
    """``np.sum`` of a contiguous float64 ``a[:n]`` bit for bit: NumPy's pairwise sum (blocks of 128, halves
    rounded down to a multiple of 8), evaluated with an explicit stack (numba's cache does not keep recursion)."""
    if n <= 128:
        return _pw_leaf(a, 0, n)
    slo = np.empty(192, np.int64)
    sn = np.empty(192, np.int64)
    ss = np.empty(192, np.int64)
    vs = np.empty(64, np.float64)
    top = 1
    vt = 0
    slo[0], sn[0], ss[0] = 0, n, 0
    while top > 0:
        top -= 1
        lo, m, state = slo[top], sn[top], ss[top]
        if m <= 128:
            vs[vt] = _pw_leaf(a, lo, m)
            vt += 1
        elif state == 0:
            n2 = m // 2
            n2 -= n2 % 8
            slo[top], sn[top], ss[top] = lo, m, 1
            slo[top + 1], sn[top + 1], ss[top + 1] = lo + n2, m - n2, 0
            slo[top + 2], sn[top + 2], ss[top + 2] = lo, n2, 0
            top += 3
        else:
            vt -= 1
            right = vs[vt]
            vs[vt - 1] = vs[vt - 1] + right
    return vs[0]


@njit(cache=True)
def _pick(cand, c, rng):
    """:func:`kvhit.fleet.routers._pick`: one ``rng.integers(c)`` draw only when there are two or more."""
    if c > 1:
        return cand[rng.integers(0, c)]
    return cand[0]


@njit(cache=True)
def _argmin(vals, R, rng, cand):
    m = vals[0]
    for k in range(1, R):
        if vals[k] < m:
            m = vals[k]
    c = 0
    for k in range(R):
        if vals[k] == m:
            cand[c] = k
            c += 1
    return _pick(cand, c, rng)


@njit(cache=True)
def _argmax(vals, R, rng, cand):
    m = vals[0]
    for k in range(1, R):
        if vals[k] > m:
            m = vals[k]
    c = 0
    for k in range(R):
        if vals[k] == m:
            cand[c] = k
            c += 1
    return _pick(cand, c, rng)


# ---- router indexes ---------------------------------------------------------------------------------------------


@njit(cache=True)
def _dense_ids(hashes):
    """Dense ids ``0..M-1`` of ``hashes`` in first-seen order (open addressing, linear probing; key and id share a
    row, ``id + 1`` stored so that a zeroed row is empty; the table doubles past half full, so it stays ~2M rows)."""
    H = hashes.shape[0]
    cap = 1 << 12
    m = cap - 1
    tab = np.zeros((cap, 2), np.int64)
    ids = np.empty(H, np.int64)
    M = 0
    for i in range(H):
        key = hashes[i]
        j = np.int64(np.uint64(key) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(20)) & m
        while tab[j, 1] != 0 and tab[j, 0] != key:
            j = (j + 1) & m
        if tab[j, 1] != 0:
            ids[i] = tab[j, 1] - 1
            continue
        tab[j, 0] = key
        M += 1
        tab[j, 1] = M
        ids[i] = M - 1
        if 2 * M > cap:  # grow: re-insert every key
            old = tab
            cap *= 2
            m = cap - 1
            tab = np.zeros((cap, 2), np.int64)
            for q in range(old.shape[0]):
                if old[q, 1] != 0:
                    jj = np.int64(np.uint64(old[q, 0]) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(20)) & m
                    while tab[jj, 1] != 0:
                        jj = (jj + 1) & m
                    tab[jj, 0] = old[q, 0]
                    tab[jj, 1] = old[q, 1]
    return ids, M


@njit(cache=True)
def _precise_overlap(hashes, off, maxhit, tab, mask):
    """Leading hashes of the request (at most ``maxhit``) present in one hash table, no state change: a replica's
    block table (the engine's lookup) or llm-d's bounded LRU shadow table."""
    h = 0
    while h < maxhit:
        if _ht_find(hashes[off + h], tab, mask) < 0:
            break
        h += 1
    return h


@njit(cache=True)
def _shadow_overlaps(ids, off, nh, R, sh_exp, t, ov, alive):
    """``_Shadow.overlap`` on every replica in one walk: ``ov[k]`` = leading routed hashes whose entry on replica
    ``k`` exists and has not expired (``exp > t``); a hash's ``R`` entries are adjacent, so one row per hash."""
    na = R
    for j in range(R):
        alive[j] = j
        ov[j] = nh
    i = 0
    while i < nh and na > 0:
        row = ids[off + i] * R
        m = 0
        for a in range(na):
            j = alive[a]
            if sh_exp[row + j, 0] > t:
                alive[m] = j
                m += 1
            else:
                ov[j] = i
        na = m
        i += 1


@njit(cache=True)
def _shadow_add(ids, off, nh, k, R, sh_exp, cnt, exp):
    """``_Shadow.add`` without a size bound (Dynamo's TTL index, SGLang's tree): set every hash's expiry; count the
    new entries (SGLang's tree size)."""
    for i in range(nh):
        node = ids[off + i] * R + k
        if sh_exp[node, 0] == _NEG:
            cnt[k] += 1
        sh_exp[node, 0] = exp


@njit(cache=True)
def _lru_overlap(hashes, off, nh, ltab, mask, xs):
    """:func:`_precise_overlap` on llm-d's LRU shadow table that also keeps each leading hash's entry (``xs[i]``),
    so that :func:`_lru_add` on the chosen replica moves them without probing the table again."""
    h = 0
    while h < nh:
        q = _ht_find(hashes[off + h], ltab, mask)
        if q < 0:
            break
        xs[h] = ltab[q, 1]
        h += 1
    return h


@njit(cache=True)
def _lru_add(hashes, off, nh, ltab, mask, skey, lnk, sfree, lst, size, xs, known):
    """llm-d's ``_Shadow.add`` on one replica: every hash to the LRU tail (inserted if absent), then evict the LRU
    head while more than ``size`` entries. Slots ``0..C-1`` hold keys; ``lnk`` rows ``C``/``C + 1`` are the
    head/tail sentinels of the doubly linked LRU order; ``lst`` = (entries, free slots on the ``sfree`` stack).
    The first ``known`` hashes are present with entries ``xs[:known]`` (:func:`_lru_overlap` just found them;
    entries do not move while hashes are added, evictions come last)."""
    C = skey.shape[0]
    head = C
    tail = C + 1
    for i in range(nh):
        key = hashes[off + i]
        if i < known:
            q = 0
            x = xs[i]
        else:
            q = _ht_find(key, ltab, mask)
            if q >= 0:
                x = ltab[q, 1]
        if q >= 0:
            a = lnk[x, 1]
            c = lnk[x, 0]
            lnk[a, 0] = c
            lnk[c, 1] = a
        else:
            lst[1] -= 1
            x = sfree[lst[1]]
            skey[x] = key
            ltab[-q - 1, 0] = key
            ltab[-q - 1, 1] = x
            lst[0] += 1
        a = lnk[tail, 1]
        lnk[a, 0] = x
        lnk[x, 1] = a
        lnk[x, 0] = tail
        lnk[tail, 1] = x
    while lst[0] > size:
        x = lnk[head, 0]
        c = lnk[x, 0]
        lnk[head, 0] = c
        lnk[c, 1] = head
        _ht_delete_slot(_ht_find(skey[x], ltab, mask), ltab, mask)
        sfree[lst[1]] = x
        lst[1] += 1
        lst[0] -= 1


# ---- the kernel -------------------------------------------------------------------------------------------------


@njit(cache=True)
def _fleet_kernel(
    T, L, off, hashes, ids, M, cv, nconv, times, hold, use_events, Ns, b, unhashed_to_head,
    kind, approx, metric_prefill, fp, lag, rng, ph, use_ph, hts,
):  # fmt: skip
    n = T.shape[0]
    R = Ns.shape[0]
    Nmax = 1
    for k in range(R):
        if Ns[k] > Nmax:
            Nmax = Ns[k]
    hit_out = np.zeros(n, np.int64)
    new_out = np.zeros(n, np.int64)
    wait_out = np.zeros(n, np.float64)
    rej_out = np.zeros(n, np.bool_)
    rep_out = np.full(n, -1, np.int64)
    st = np.zeros((R, 5), np.int64)
    for k in range(R):
        st[k, 0] = Ns[k]
    nb_arr = (L + b - 1) // b

    # the R block pools (kvhit.sim.vllm.block layout, padded to the largest N; head/tail sentinels N_k, N_k + 1)
    blk = np.zeros((R, Nmax + 2, 4), np.int32)
    dl = np.zeros((R, Nmax, 2), np.int32)
    bhash = np.zeros((R, Nmax), np.int64)
    cap = 16
    while cap < 2 * Nmax:
        cap *= 2
    mask = np.uint64(cap - 1)
    tab = np.zeros((R, cap, 2), np.int64)
    tab[:, :, 1] = -1
    for k in range(R):
        N = Ns[k]
        for i in range(N):
            blk[k, i, _NX] = i + 1
            blk[k, i, _PV] = i - 1
        blk[k, 0, _PV] = N
        blk[k, N - 1, _NX] = N + 1
        blk[k, N, _NX] = 0
        blk[k, N + 1, _PV] = N - 1

    # per-request block tables
    boff = np.zeros(n + 1, np.int64)
    if use_events:
        for r in range(n):
            boff[r + 1] = boff[r] + nb_arr[r]
        rb = np.empty(max(boff[n], 1), np.int32)
    else:
        mx = 1
        for r in range(n):
            if nb_arr[r] > mx:
                mx = nb_arr[r]
        rb = np.empty(mx, np.int32)

    # loads (floats, as the step-wise path) and their lagged snapshot
    inflight = np.zeros(R)
    pre = np.zeros(R)
    act = np.zeros(R)
    s_inf = np.zeros(R)
    s_pre = np.zeros(R)
    s_act = np.zeros(R)
    s_use = np.zeros(R)
    use = np.zeros(R)
    have_snap = False
    next_snap = 0.0

    # router state
    cand = np.empty(R, np.int64)
    vals = np.zeros(R)
    ov = np.zeros(R, np.int64)
    wts = np.zeros(R)
    size = np.zeros(R, np.int64)
    ttl = fp[0]
    lru = kind == 3 and approx
    sh_exp = np.full((M * R if approx and not lru else 1, 1), _NEG)  # expiry per (hash, replica)
    sh_cnt = np.zeros(R, np.int64)
    # llm-d's LRU shadow: per replica a table bounded by N_k + the longest request (it overflows during one add)
    mxh = 1
    for q in range(n):
        if off[q + 1] - off[q] > mxh:
            mxh = off[q + 1] - off[q]
    C = Nmax + mxh if lru else 1
    lcap = 16
    while lcap < 2 * C:
        lcap *= 2
    lmask = np.uint64(lcap - 1)
    ltab = np.zeros((R if lru else 1, lcap, 2), np.int64)
    ltab[:, :, 1] = -1
    skey = np.zeros((R if lru else 1, C), np.int64)
    lnk = np.zeros((R if lru else 1, C + 2, 2), np.int64)
    sfree = np.zeros((R if lru else 1, C), np.int64)
    lst = np.zeros((R if lru else 1, 2), np.int64)
    lxs = np.zeros((R if lru else 1, mxh), np.int64)  # per replica: the entries of the leading hashes just probed
    if lru:
        for k in range(R):
            lnk[k, C, 0] = C + 1
            lnk[k, C + 1, 1] = C
            for q in range(C):
                sfree[k, q] = C - 1 - q
            lst[k, 1] = C
    bind_k = np.zeros(max(nconv, 1), np.int64)
    bind_exp = np.full(max(nconv, 1), _NEG)
    router_ops = 0

    # event queue and per-replica FIFO queues (linked through qnext)
    hcap = max(2 * n if use_ph else n, 1)  # finishes, and prefill-done events (request index + n)
    ht = np.empty(hcap, np.float64)
    hr = np.empty(hcap, np.int64)
    hsize = 0
    qnext = np.full(n, -1, np.int64)
    qhead = np.full(R, -1, np.int64)
    qtail = np.full(R, -1, np.int64)

    r = 0
    while r < n or hsize > 0:
        is_fin = hsize > 0 and (r >= n or ht[0] <= times[r])
        now = ht[0] if is_fin else times[r]
        if lag > 0 and (not have_snap or now >= next_snap):
            for k in range(R):
                s_inf[k] = inflight[k]
                s_pre[k] = pre[k]
                s_act[k] = act[k]
                s_use[k] = (Ns[k] - st[k, 0]) / Ns[k]
            have_snap = True
            next_snap = (np.floor(now / lag) + 1.0) * lag
        retry = True
        if is_fin:
            f = hr[0]
            hsize = _heap_pop(ht, hr, hsize)
            if f >= n:  # prefill done: the outstanding prefill tokens leave the load; no block changes, no retry
                f -= n
                k = rep_out[f]
                pre[k] -= T[f] - hit_out[f] * b
                continue
            k = rep_out[f]
            _free(nb_arr[f], boff[f], rb, blk[k], Ns[k], Ns[k] + 1, unhashed_to_head, st[k])
            inflight[k] -= 1
            if not use_ph:
                pre[k] -= T[f] - hit_out[f] * b
            act[k] -= nb_arr[f]
        else:
            # ---- route request r ----
            if lag > 0:
                l_inf, l_pre, l_act = s_inf, s_pre, s_act
                for j in range(R):
                    use[j] = s_use[j]
            else:
                l_inf, l_pre, l_act = inflight, pre, act
                for j in range(R):
                    use[j] = (Ns[j] - st[j, 0]) / Ns[j]
            o = off[r]
            nh = off[r + 1] - o
            maxhit = (T[r] - 1) // b
            t = now
            if kind == 0:  # least-loaded
                k = _argmin(l_pre if metric_prefill else l_inf, R, rng, cand)
            elif kind == 1:  # sticky
                c = cv[r]
                if t < bind_exp[c]:
                    k = bind_k[c]
                else:
                    k = _argmin(l_inf, R, rng, cand)
                bind_k[c] = k
                bind_exp[c] = t + ttl
            elif kind == 2:  # dynamo
                w, credit, wr, temp = fp[1], fp[2], fp[3], fp[4]
                nbr = nb_arr[r]
                if approx:
                    _shadow_overlaps(ids, o, nh, R, sh_exp, t, ov, cand)
                for j in range(R):
                    if approx:
                        x = ov[j]
                    else:
                        x = _precise_overlap(hashes, o, maxhit, tab[j], mask)
                        router_ops += x + (1 if x < maxhit else 0)
                    p = max(l_pre[j] + T[r] - credit * x * b, 0.0) / b
                    vals[j] = w * p + (l_act[j] + nbr) + wr * l_inf[j]
                if temp == 0.0:
                    k = _argmin(vals, R, rng, cand)
                else:
                    lo = vals[0]
                    hi = vals[0]
                    for j in range(1, R):
                        if vals[j] < lo:
                            lo = vals[j]
                        if vals[j] > hi:
                            hi = vals[j]
                    for j in range(R):
                        z = (vals[j] - lo) / (hi - lo) if hi > lo else 0.0
                        wts[j] = np.exp(-z / temp)
                    s = _np_sum(wts, R)
                    u = rng.random()
                    acc = 0.0
                    k = R - 1
                    for j in range(R):
                        acc = wts[j] / s if j == 0 else acc + wts[j] / s
                        if acc > u:
                            k = j
                            break
            elif kind == 3:  # llm-d
                wp, wq, wk = fp[1], fp[2], fp[3]
                qmin = l_inf[0]
                qmax = l_inf[0]
                for j in range(1, R):
                    if l_inf[j] < qmin:
                        qmin = l_inf[j]
                    if l_inf[j] > qmax:
                        qmax = l_inf[j]
                for j in range(R):
                    if approx:
                        x = _lru_overlap(hashes, o, nh, ltab[j], lmask, lxs[j])
                        ov[j] = x
                    else:
                        x = _precise_overlap(hashes, o, maxhit, tab[j], mask)
                        router_ops += x + (1 if x < maxhit else 0)
                    ps = x / nh if nh else 0.0
                    qs = (qmax - l_inf[j]) / (qmax - qmin) if qmax > qmin else 1.0
                    vals[j] = wp * ps + wq * qs + wk * (1.0 - use[j])
                k = _argmax(vals, R, rng, cand)
            elif kind == 5:  # routes fixed in advance (an oblivious router: its choice reads no state)
                k = cv[r]
            else:  # sglang
                th, a_th, r_th = fp[1], fp[2], fp[3]
                lo = l_inf[0]
                hi = l_inf[0]
                for j in range(1, R):
                    if l_inf[j] < lo:
                        lo = l_inf[j]
                    if l_inf[j] > hi:
                        hi = l_inf[j]
                if hi - lo > a_th and hi > r_th * lo:
                    k = _argmin(l_inf, R, rng, cand)
                else:
                    best = 0
                    if approx:
                        _shadow_overlaps(ids, o, nh, R, sh_exp, t, ov, cand)
                    for j in range(R):
                        if approx:
                            x = ov[j]
                        else:
                            x = _precise_overlap(hashes, o, maxhit, tab[j], mask)
                            router_ops += x + (1 if x < maxhit else 0)
                        ov[j] = x
                        if j == 0 or x > best:
                            best = x
                    if nh and best / nh > th:
                        k = _argmax(ov, R, rng, cand)
                    elif approx:
                        for j in range(R):
                            size[j] = sh_cnt[j]
                        k = _argmin(size, R, rng, cand)
                    else:
                        k = _argmin(l_inf, R, rng, cand)
            if lru:
                _lru_add(hashes, o, nh, ltab[k], lmask, skey[k], lnk[k], sfree[k], lst[k], Ns[k], lxs[k], ov[k])
            elif approx and kind >= 2:
                _shadow_add(ids, o, nh, k, R, sh_exp, sh_cnt, t + ttl)
            rep_out[r] = k
            retry = True
            if nb_arr[r] > Ns[k]:
                rej_out[r] = True
                wait_out[r] = np.nan
                retry = False
            else:
                if qtail[k] >= 0:
                    qnext[qtail[k]] = r
                else:
                    qhead[k] = r
                qtail[k] = r
                inflight[k] += 1
                pre[k] += T[r]
                act[k] += nb_arr[r]
            r += 1
        # ---- start the affected replica's waiting requests (FIFO, head-of-line blocking) ----
        N = Ns[k]
        while retry and qhead[k] >= 0:
            w = qhead[k]
            nb = nb_arr[w]
            mh = (T[w] - 1) // b
            if st[k, 0] < nb - mh:  # cannot fit even with a full hit: the lookup would be refused too
                break
            base = boff[w] if use_events else 0
            h, probes, ev = _lookup(hashes, off[w], mh, tab[k], mask, rb, base, blk[k])
            st[k, 4] += probes
            if nb - h + ev > st[k, 0]:
                break
            qhead[k] = qnext[w]
            if qhead[k] < 0:
                qtail[k] = -1
            _start(h, nb, L[w] // b, off[w], base, hashes, rb, blk[k], dl[k], N, bhash[k], tab[k], mask, st[k])
            hit_out[w] = h
            new_out[w] = nb - h
            wait_out[w] = now - times[w]
            pre[k] -= h * b
            if use_events:
                d = hts * (h * b)
                hsize = _heap_push(ht, hr, hsize, now + max(hold[w] - d, 0.0), w)
                if use_ph:
                    hsize = _heap_push(ht, hr, hsize, now + max(ph[w] - d, 0.0), w + n)
            else:
                _free(nb, base, rb, blk[k], N, N + 1, unhashed_to_head, st[k])
                inflight[k] -= 1
                pre[k] -= T[w] - h * b
                act[k] -= nb
    ops = 0
    for k in range(R):
        ops += st[k, 4]
    return rep_out, hit_out, new_out, wait_out, rej_out, ops, router_ops


#: kernel code of a fleet whose routes are given (an oblivious router routed in advance)
FIXED_ROUTES = 5


def simulate_compiled(
    rt, T, L, off, hs, cv, tm, hold, Ns, b, engine_flag, lag, prefill_hold=None, hts=0.0, routes=None
):  # fmt: skip
    """Run the compiled fleet for router object ``rt`` (:data:`COMPILED_ROUTERS`), or, with ``routes`` (one replica
    per request, from an oblivious router that reads no state), the same event loop with those routes; arrays as in
    :func:`kvhit.fleet.simulate.simulate_fleet`'s internals (``prefill_hold`` and ``hts`` checked there).
    Returns ``(replica, hit, new, wait, rejected, block_ops, router_ops)``; the router's generator advances exactly
    as on the step-wise path."""
    fp = np.zeros(5)
    metric_prefill = approx = False
    ids, M = np.zeros(1, np.int64), 0
    cdense, nconv = np.zeros(cv.shape[0], np.int64), 0
    if routes is not None:  # the kernel reads each request's replica from the conversation column
        kind, rng = FIXED_ROUTES, np.random.default_rng(0)  # no draw is made
        cdense = np.ascontiguousarray(routes, np.int64)
    else:
        kind, rng = COMPILED_ROUTERS[rt.name], rt.rng
        approx = getattr(rt, "shadow", None) is not None
    if kind == 0:
        metric_prefill = rt.metric == "prefill_tokens"
    elif kind == 1:
        fp[0] = rt.ttl
    elif kind == 2:
        fp[:] = (rt.shadow.ttl if approx else 0.0, rt.w, rt.credit, rt.wr, rt.temp)
    elif kind == 3:
        fp[1:4] = (rt.wp, rt.wq, rt.wk)
        fp[0] = np.inf
    elif kind == 4:
        fp[:4] = (np.inf, rt.th, rt.abs, rt.rel)
    if approx and kind != 3:  # llm-d's LRU shadow is bounded and keyed by hash per replica: no dense ids
        ids, M = _dense_ids(hs)
    if kind == 1:
        _, cdense = np.unique(cv, return_inverse=True)
        cdense = cdense.astype(np.int64)
        nconv = int(cdense.max()) + 1 if cdense.size else 0
    use_events = hold is not None
    hd = np.zeros(T.shape[0]) if hold is None else np.ascontiguousarray(hold, np.float64)
    ph = np.zeros(1) if prefill_hold is None else np.ascontiguousarray(prefill_hold, np.float64)
    out = _fleet_kernel(
        T, np.ascontiguousarray(L, np.int64), off, hs, ids, M, cdense, nconv, np.ascontiguousarray(tm, np.float64),
        hd, use_events, np.asarray(Ns, np.int64), b, engine_flag, kind, approx, metric_prefill, fp, float(lag),
        rng, ph, prefill_hold is not None, float(hts),
    )  # fmt: skip
    rep, hit, new, wait, rej, ops, rops = out
    return rep, hit, new, wait, rej, int(ops), int(rops)
