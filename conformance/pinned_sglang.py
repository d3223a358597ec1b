"""The hand-worked cases of ``tests/test_sglang_policies.py`` replayed through SGLang's own caches.

    python conformance/pinned_sglang.py      (in the SGLang environment: conformance/make_env.sh sglang 0.5.23)

For every case and setting pinned there, prints the tokens the last request's admission evicted in SGLang's
``RadixCache`` (with the evicted node paths) and ``UnifiedRadixCache`` (Python and Rust tree cores), next to
kvhit's model; exits 1 if any differs. Settings a class does not offer (T-LRU on ``RadixCache``) are skipped.

Then the admission example of issue 26 (page 16, pool 48 tokens, a 40-token prompt with 9 outputs) through
SGLang's own admission code on an idle pool: the scheduler clips ``max_new_tokens``
(``Scheduler.init_req_max_new_tokens``: ``min(n, max_req_len − T − 1)``, then the allocator's
``max_new_tokens_for_memory``), and ``PrefillAdder.add_one_req`` admits when ``extend + max_new + page_size <
remaining`` (``PrefillBudget.check_prefill``). Printed: the clipped ``max_new_tokens`` and the verdict.
"""

from __future__ import annotations

import sys

here = __file__.rsplit("/", 1)[0]
sys.path[:0] = [here, here + "/../tests"]
from real_sglang import RealSglangEngine, RealUnifiedEngine  # noqa: E402

from kvhit.sim.engine import replay  # noqa: E402
from kvhit.sim.sglang.engine import SglangEngine  # noqa: E402
from test_sglang_policies import CASES, _requests  # noqa: E402

SETTINGS = [
    ("split", "fifo", 0),
    ("split", "lru", 0),
    ("hits", "lru", 0),
    ("hits", "lfu", 0),
    ("hits", "slru", 0),
    ("priority", "lru", 0),
    ("priority", "priority", 0),
    ("tlru", "tlru", 0),
    ("tlru", "tlru", 2),
]


def _last(engine, spec):
    o = replay(engine, _requests(spec)).outcomes[-1]
    return o.evicted_units, [list(p) for p in o.evicted]


def admission(T: int, n: int, C: int, p: int) -> tuple[int, bool]:
    """(max_new_tokens after the scheduler's clip, admitted on an idle pool?) from SGLang's own classes."""
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget
    from sglang.srt.mem_cache.radix_cache import RadixCache

    if p == 1:
        alloc = TokenToKVPoolAllocator(C, torch.float16, "cpu", None, False)
    else:
        alloc = PagedTokenToKVPoolAllocator(C, p, torch.float16, "cpu", None, False)
    cache = RadixCache(
        CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc, page_size=p)
    )
    max_req_len = C - 1  # tp_worker: min(context_len - 1, pool - 1), context assumed >= the pool
    m = max(0, min(n, max_req_len - T - 1))
    m = alloc.max_new_tokens_for_memory(T, m, token_capacity=C, sliding_window_size=None, chunk_size=None)
    hit = cache.match_prefix(
        MatchPrefixParams(key=__import__("real_sglang")._key(list(range(T - 1))))
    ).device_prefix_len
    total = (T - hit) + m + p  # add_one_req: extend + max_new + per_req_token_overhead (= page_size)
    ok, _ = PrefillBudget(alloc, cache).check_prefill(
        extend_input_len=T - hit,
        total_tokens=total,
        max_new_tokens=m,
        input_tokens=T,
        swa_host_hit_length=0,
        chunk_limit=None,
    )
    return m, ok


def main() -> int:
    bad = 0
    for name, pol, budget in SETTINGS:
        C, spec = CASES[name]
        cfg = {"threshold": budget, "next_prompt_estimate": 0} if pol == "tlru" else None
        for cls in ("radix", "unified-python", "unified-rust"):
            if pol == "tlru" and cls == "radix":
                continue
            if cls == "radix":
                real = RealSglangEngine(C, evict_policy=pol, policy_config=cfg)
            else:
                real = RealUnifiedEngine(C, cls.split("-")[1], evict_policy=pol, policy_config=cfg)
            ours = SglangEngine(
                C, evict_policy=pol, cache="radix" if cls == "radix" else "unified", tlru_tail_budget=budget
            )
            (ru, rp), (ou, op) = _last(real, spec), _last(ours, spec)
            ok = ru == ou and (cls != "radix" or rp == op)
            bad += not ok
            paths = f" {rp}" if cls == "radix" else ""
            print(
                f"{name:9} {pol:8} budget={budget} {cls:15} sglang {ru}{paths}  kvhit {ou}  {'ok' if ok else 'DIFFERS'}"
            )
    m, ok = admission(40, 9, 48, 16)
    e = SglangEngine(48, page_size=16)
    from kvhit.sim.engine import Request

    kv = e.fits(Request(rid=0, prompt_tokens=40, output_tokens=9, token_ids=tuple(range(48))))
    print(
        f"admission T=40 n=9 pool=48 page=16: sglang max_new_tokens={m}, admitted on an idle pool: {ok}; "
        f"kvhit fits: {kv}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
