"""Conformance: kvhit's SGLang HiCache model against SGLang's own ``UnifiedRadixCache`` + ``HybridCacheController``.

    python conformance/check_hicache.py --policy write_through --cases 150 --seed 0 [--tree-core rust|python]
        [--model hicache|threshold-1|through-as-selective] [--expect-mismatch] [--json FILE]

Runs only in the throwaway SGLang environment (``conformance/make_env.sh sglang 0.5.23``). SGLang's side is its
real HiCache stack, built as ``init_hicache`` builds it (host pool of ``--hicache-ratio`` × device pool, the
``HybridCacheController``, the ``L2TransferEngine``, the tree core — Rust by default, or the Python core), with
``io_backend=direct`` and ``layer_first`` layout. Stubbed, all GPU-only and none of them cache logic:
``_cuda_host_register`` (cudaHostRegister page pinning), ``transfer_kv_direct`` (the sgl_kernel KV byte copy;
the KV contents are never read here) and ``torch.cpu.Stream.synchronize`` (a device-stream sync; missing on CPU),
plus ``sglang.srt.configs`` as in ``real_sglang.py``.

The scheduler steps around the cache are transcribed from sglang 0.5.23, for requests of one generated token
(no decode steps, no checkpoint: the insert at release covers the prompt), one at a time:
``match_prefix`` of the prompt capped at ``T − 1``; ``inc_lock_ref`` of the device node; when there is a host
hit, ``load_back`` of the best-match node (its threshold, path lock, eviction and allocation are SGLang's), then
``start_loading`` and ``loading_check`` of every queued ack (transfers complete at once, as the model assumes)
and the lock moved to the loaded node; ``evict_for_alloc`` of the shortfall and ``alloc`` of the ``T − hit``
new slots; ``insert`` of the prompt (``prev_prefix_len`` = hit, ``inserted_len`` = 0); ``dec_lock_ref``;
``writing_check(write_back=True)`` (start every queued write and wait for its ack). Compared per request:
(device hit tokens, host hit tokens). Random workloads: 1–5 conversations, a device pool of 12–60 tokens,
ratio 0.5–4 (host pools smaller and larger than the device), turns adding 1–14 tokens, long histories cut.
Not compared here: decode steps and checkpoints (outputs), page sizes > 1, in-flight holds, eviction order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--policy", choices=["write_through", "write_through_selective", "write_back"], default="write_through")
ap.add_argument("--model", choices=["hicache", "threshold-1", "through-as-selective"], default="hicache")
ap.add_argument("--tree-core", choices=["rust", "python"], default="rust")
ap.add_argument("--cases", type=int, default=150)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--expect-mismatch", action="store_true")
ap.add_argument("--json")
A = ap.parse_args()
os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = A.tree_core

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import logging  # noqa: E402

import real_sglang  # noqa: E402,F401  (installs the sglang.srt.configs stub)
import torch  # noqa: E402

logging.disable(logging.WARNING)
import sglang.srt.mem_cache.pool_host.common as _phc  # noqa: E402
import sglang.srt.mem_cache.pool_host.mha as _phm  # noqa: E402

_phc._cuda_host_register = lambda *a, **k: None  # cudaHostRegister: GPU-only page pinning
_phm.transfer_kv_direct = lambda *a, **k: None  # sgl_kernel KV byte copy (CUDA); contents unused
if not hasattr(torch.cpu.Stream, "synchronize"):
    torch.cpu.Stream.synchronize = lambda self: None  # device-stream sync: a no-op on CPU

from array import array  # noqa: E402

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

from kvhit.sim.engine import Request  # noqa: E402
from kvhit.sim.sglang.engine import SglangEngine  # noqa: E402
from kvhit.sim.tiers.hicache import HiCacheTier  # noqa: E402

VERSION = real_sglang.VERSION


def _key(t) -> RadixKey:
    return RadixKey(array("q", t))


class RealHiCache:
    """SGLang's HiCache stack for a device pool of ``C`` tokens (page size 1, full attention)."""

    def __init__(self, C: int, ratio: float, policy: str) -> None:
        sa = ServerArgs(
            model_path="dummy",
            page_size=1,
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            hicache_write_policy=policy,
            hicache_ratio=ratio,
            enable_hierarchical_cache=True,
        )
        set_global_server_args_for_scheduler(sa)
        r2t = ReqToTokenPool(size=8, max_context_len=4096, device="cpu", enable_memory_saver=False)
        kv = MHATokenToKVPool(
            size=C, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=4, layer_num=1, device="cpu",
            enable_memory_saver=False,
        )  # fmt: skip
        self.alloc = TokenToKVPoolAllocator(size=C, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
        p = CacheInitParams(
            req_to_token_pool=r2t, token_to_kv_pool_allocator=self.alloc, page_size=1, disable=False,
            tree_components=(ComponentType.FULL,),
        )  # fmt: skip
        self.cache = UnifiedRadixCache(params=p)
        assert self.cache._tree_core_backend == A.tree_core
        self.cache.init_hicache(sa, p)
        self.H = self.cache.cache_controller.mem_pool_host.size

    def run(self, T: int, toks) -> tuple[int, int]:
        c = self.cache
        m = c.match_prefix(MatchPrefixParams(key=_key(toks[: T - 1])))
        g = m.device_prefix_len
        dnode = m.last_device_node
        lk = c.inc_lock_ref(dnode).to_dec_params()
        loaded = 0
        if m.host_hit_length > 0 and c.load_back(m.best_match_node, None, req=None):
            cc = c.cache_controller
            cc.start_loading()
            c.loading_check(finish_count=len(cc.ack_load_queue))
            loaded = len(c.tree_core.collect_full_device_indices(m.best_match_node, dnode))
            c.dec_lock_ref(dnode, lk)
            dnode = m.best_match_node
            lk = c.inc_lock_ref(dnode).to_dec_params()
        prefix = c.tree_core.collect_full_device_indices(dnode, c.root_node_handle())
        need = T - g - loaded
        avail = self.alloc.available_size()
        if avail < need:
            c.evict_for_alloc(EvictParams(num_tokens=need - avail))
        new = self.alloc.alloc(need)
        if new is None:
            raise RuntimeError(f"SGLang: out of KV slots ({need} > {self.alloc.available_size()})")
        value = torch.cat([prefix.to(torch.int64), new.to(torch.int64)])
        c.insert(InsertParams(key=_key(toks[:T]), value=value, prev_prefix_len=g + loaded, inserted_len=0))
        c.dec_lock_ref(dnode, lk)
        c.writing_check(write_back=True)
        return g, loaded


def gen_case(rng):
    C = rng.randint(12, 60)
    ratio = rng.choice([0.5, 1.0, 2.0, 4.0])
    nconv = rng.randint(1, 5)
    hist = {i: [] for i in range(nconv)}
    nxt = {i: 1000 * (i + 1) for i in range(nconv)}
    reqs = []
    for _ in range(rng.randint(2, 25)):
        cv = rng.randrange(nconv)
        for _ in range(rng.randint(1, 14)):
            hist[cv].append(nxt[cv])
            nxt[cv] += 1
        if len(hist[cv]) >= C:
            hist[cv] = hist[cv][-5:]
        reqs.append(tuple(hist[cv]))
    return C, ratio, reqs


def compare(case, policy: str, model: str):
    """(requests compared, host hits seen, first difference or None)."""
    C, ratio, reqs = case
    real = RealHiCache(C, ratio, policy)
    mpol = "write_through_selective" if model == "through-as-selective" and policy == "write_through" else policy
    tier = HiCacheTier(real.H, write_policy=mpol, load_back_threshold=1 if model == "threshold-1" else 10)
    eng = SglangEngine(C, host=tier)
    hits = 0
    for rid, toks in enumerate(reqs):
        T = len(toks)
        o = eng.submit(Request(rid, T, output_tokens=1, token_ids=toks))
        eng.finish(rid)
        want = (o.gpu_hit_tokens, o.cpu_hit_tokens)
        got = real.run(T, toks)
        hits += got[1] > 0
        if got != want:
            return rid + 1, hits, f"request {rid}: SGLang (device, host) hit {got}, kvhit {want}"
    return len(reqs), hits, None


def shrink(case, policy, model):
    C, ratio, reqs = case
    changed = True
    while changed:
        changed = False
        for i in range(len(reqs)):
            cand = (C, ratio, reqs[:i] + reqs[i + 1 :])
            if cand[2] and compare(cand, policy, model)[2] is not None:
                case, (C, ratio, reqs), changed = cand, cand, True
                break
    return case


def main() -> int:
    rng = random.Random(A.seed)
    t0 = time.perf_counter()
    compared = host_hits = bad = 0
    first = None
    for _ in range(A.cases):
        case = gen_case(rng)
        n, h, diff = compare(case, A.policy, A.model)
        compared += n
        host_hits += h
        if diff is not None:
            bad += 1
            first = first or case
    secs = round(time.perf_counter() - t0, 1)
    label = "negative control " if A.expect_mismatch else ""
    print(
        f"{label}kvhit hicache model={A.model} vs SGLang {VERSION} HiCache ({A.policy}, {A.tree_core} tree core): "
        f"{A.cases} cases, {compared} requests ({host_hits} with host hits), {bad} mismatching cases ({secs} s)"
    )
    if first is not None:
        C, ratio, reqs = shrink(first, A.policy, A.model)
        print(f"minimal mismatching case: device pool {C} tokens, --hicache-ratio {ratio}")
        for r, toks in enumerate(reqs):
            print(f"  r{r}: T={len(toks)} tokens={list(toks)}")
        print(compare((C, ratio, reqs), A.policy, A.model)[2])
    if A.json:
        with open(A.json, "a") as f:
            f.write(
                json.dumps(
                    {
                        "model": f"hicache:{A.model}",
                        "engine": f"sglang=={VERSION} hicache {A.policy} ({A.tree_core} core)",
                        "cases": A.cases,
                        "seed": A.seed,
                        "requests": compared,
                        "mismatching_cases": bad,
                        "negative_control": A.expect_mismatch,
                        "seconds": secs,
                    }
                )
                + "\n"
            )
    return 0 if (bad > 0) == A.expect_mismatch else 1


if __name__ == "__main__":
    sys.exit(main())
