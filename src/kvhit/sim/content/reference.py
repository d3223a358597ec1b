"""Plain-Python references for the simulators (slow; used by tests and as benchmark baselines).

They share nothing with the compiled kernels except input validation, so a bug in a kernel cannot hide
in its reference.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvhit.sim.content.lru import ContentResult, _validate_capacity, validate_events

__all__ = ["simulate_content_reference"]


def simulate_content_reference(conv, R, N) -> ContentResult:
    """Whole-content LRU (paper App. B.4, Algorithm 1) with :class:`collections.OrderedDict`.

    The dict holds ``θ -> Z_θ`` ordered from LRU (first) to MRU (last). Same inputs and outputs as
    :func:`kvhit.sim.content.lru.simulate_content`.
    """
    N = _validate_capacity(N)
    conv, R, _C = validate_events(conv, R)
    n = conv.shape[0]
    hit = np.zeros(n, dtype=np.uint8)
    lru: OrderedDict[int, int] = OrderedDict()
    total = 0
    evictions = 0
    evicted_blocks = 0
    max_resident = 0
    reused = 0
    conv_l = conv.tolist()
    R_l = R.tolist()
    for i in range(n):
        c = conv_l[i]
        r = R_l[i]
        old = lru.pop(c, None)  # line 1-3
        if old is not None:
            hit[i] = 1
            reused += old
            total -= old
        lru[c] = r  # line 4-5: Z_θ <- R_j at the MRU end
        total += r
        while total > N:  # line 6-9
            _, z = lru.popitem(last=False)
            total -= z
            evicted_blocks += z
            evictions += 1
        if total > max_resident:
            max_resident = total
    return ContentResult(
        hit=hit,
        N=N,
        evictions=evictions,
        evicted_blocks=evicted_blocks,
        max_resident=max_resident,
        reused_blocks=reused,
        total_blocks=int(sum(R_l)),
    )
