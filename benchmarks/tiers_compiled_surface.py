"""`kvhit tiers` surfaces with the compiled tier passes against the step-wise models, on a real trace.

For each tier, :func:`kvhit.sim.tiers.surface.hit_surface` over an (HBM, DRAM) grid twice — ``compiled=True`` (the
default: :mod:`kvhit.sim.tiers.native_fast`, :mod:`~kvhit.sim.tiers.lmcache_fast`,
:mod:`~kvhit.sim.tiers.simple_fast`) and ``compiled=False`` (the step-wise Python models) — asserts the two surfaces
equal (h and loaded tokens, exactly) and reports each one's CPU seconds (``time.process_time``, one process,
``workers=1``; the compiled run after a warm-up that compiles or loads the numba cache).

Grid: the HBM sizes of docs/tiers.md (``--hbm-blocks 500,1000,2000,4000,8000``) and host sizes for 0, 128, 256, 512,
1024, 2048 GiB of DRAM for Qwen3-8B bf16 (the simple tiers: at least one CPU block). Run:
``python benchmarks/tiers_compiled_surface.py [trace] [tier ...]`` (default: the Mooncake conversation trace, every
tier).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from kvhit.plan import model_config
from kvhit.sim.tiers.sizing import host_units
from kvhit.sim.tiers.surface import hit_surface
from kvhit.workload.production import read_production

MOONCAKE = "/work/shared/data/traces/mooncake_fast25/conversation_trace.jsonl"
HBM = (500, 1000, 2000, 4000, 8000)
DRAM_GB = (0, 128, 256, 512, 1024, 2048)


def run(path: str = MOONCAKE, tiers=("native", "lmcache", "simple", "simple-lazy")) -> dict:
    rq = read_production(path).to_block_requests()
    b = int(rq.block_size)
    bpb = model_config.resolve_model("qwen3-8b").bytes_per_block(b, "bf16", 1)
    out: dict = {"requests": int(rq.prompt_tokens.shape[0]), "block_size": b, "hbm_blocks": list(HBM)}
    for tier in tiers:
        kw = {"chunk_tokens": 512} if tier == "lmcache" else {}  # LMCache chunks: a multiple of the 512-token block
        units = [
            host_units(tier, int(g * 2**30), bytes_per_block_rank=bpb, block_size=b, chunk_tokens=512) for g in DRAM_GB
        ]
        if tier.startswith("simple"):
            units = [max(1, u) for u in units]
        args = dict(tier=tier, gpu_blocks=list(HBM), host=units, block_size=b, **kw)
        hit_surface(rq.prompt_tokens[:50], rq.hash_offsets[:51], rq.hashes[: rq.hash_offsets[50]], **args)  # warm
        t0 = time.process_time()
        fast = hit_surface(rq.prompt_tokens, rq.hash_offsets, rq.hashes, **args)
        t_fast = time.process_time() - t0
        t0 = time.process_time()
        slow = hit_surface(rq.prompt_tokens, rq.hash_offsets, rq.hashes, compiled=False, **args)
        t_slow = time.process_time() - t0
        assert np.array_equal(fast.hit, slow.hit, equal_nan=True), f"{tier}: compiled surface differs"
        assert np.array_equal(fast.load_tokens, slow.load_tokens), f"{tier}: compiled loads differ"
        out[tier] = {
            "host_units": units,
            "pairs": len(HBM) * len(units),
            "compiled_cpu_s": round(t_fast, 2),
            "stepwise_cpu_s": round(t_slow, 2),
            "speedup": round(t_slow / t_fast, 1),
            "h_max": float(np.nanmax(fast.hit)),
        }
    return out


def main(argv: list[str]) -> None:
    path = argv[0] if argv else MOONCAKE
    tiers = tuple(argv[1:]) or ("native", "lmcache", "simple", "simple-lazy")
    print(json.dumps(run(path, tiers), indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
