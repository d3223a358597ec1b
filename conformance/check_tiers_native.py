"""Conformance: kvhit's vLLM native CPU-offloading tier against vLLM's own ``CPUOffloadingManager``.

Usage (inside the vLLM conformance environment, ``conformance/make_env.sh vllm 0.33.0``; never imported by
kvhit)::

    PYTHONPATH=src $(conformance/make_env.sh vllm 0.33.0) conformance/check_tiers_native.py --cases 300 --seed 0

What is real and what is transcribed: the CPU side is vLLM's ``CPUOffloadingManager`` with its real ``lru`` /
``arc`` ``CachePolicy`` (chunk pool, ref counts, store-threshold tracker, all-or-nothing ``prepare_store`` with
the offered keys protected, request-scoped recency committed by ``on_request_finished``), called with real
``ReqContext`` objects carrying the chunk positions, and every transfer completed at once
(``complete_load`` / ``complete_store`` right after ``prepare_*``, as a worker that finishes in the step would).
The scheduler-side logic that decides *which* keys are looked up, loaded and offered (``OffloadingConnector
Scheduler``) is kvhit's transcription in :class:`kvhit.sim.tiers.native.NativeCpuTier`, shared by both sides;
driving the real ``OffloadingConnectorScheduler`` (it needs a ``VllmConfig`` and ``SchedulerOutput`` objects)
is left for later. So this checks kvhit's manager/policy mirror, request by request, not the transcription.

Each case is a random multi-turn workload (pools of a few blocks, tiny CPU tiers, exact block multiples,
``blocks_per_chunk`` 1–3, ``store_threshold`` 0 or 2, LRU and ARC, in-flight holds). After every event the
per-request outcome (GPU hit, CPU hit) and the CPU eviction order (resident keys, next victim first) are
compared. With ``--expect-mismatch`` (negative control: kvhit's side uses a deliberately wrong policy, LRU
committing head-first) the run succeeds only if a mismatch is found. Exit 0 = as expected, 1 = not.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import vllm
from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvhit.sim.engine import replay, requests_from_stream
from kvhit.sim.tiers import TieredEngine
from kvhit.sim.tiers.native import CpuOffloadManager, LruPolicy, NativeCpuTier
from kvhit.sim.vllm.blockids import hashes_from_block_counts
from kvhit.sim.vllm.engine import VllmEngine


def _bkey(k: int):
    return make_offload_key(int(k).to_bytes(8, "big", signed=True), 0)


def _ikey(b: bytes) -> int:
    return int.from_bytes(b[:8], "big", signed=True)


class RealManager:
    """vLLM's ``CPUOffloadingManager`` behind kvhit's manager interface (transfers complete at once)."""

    def __init__(self, capacity: int, *, policy: str, store_threshold: int) -> None:
        self.m = CPUOffloadingManager(num_chunks=capacity, cache_policy=policy, store_threshold=store_threshold)
        self.policy_name = policy
        self.store_failures = 0
        self._probe = ReqContext(req_id="lookup-probe")
        self._n = 0

    def _ctx(self, st) -> ReqContext:
        if st.ctx is None:
            self._n += 1
            st.ctx = ReqContext(req_id=f"r{self._n}")
            for k, p in st.pos.items():
                st.ctx.set_offload_key_position(_bkey(k), p)
            self.m.on_new_request(st.ctx)
        return st.ctx

    def lookup(self, key: int) -> bool:
        from vllm.v1.kv_offload.base import LookupResult

        return self.m.lookup(_bkey(key), self._probe) is not LookupResult.MISS

    def prepare_load(self, keys, st) -> None:
        ctx = self._ctx(st)
        bk = [_bkey(k) for k in keys]
        self.m.prepare_load(bk, ctx)
        self.m.complete_load(bk, ctx)

    def prepare_store(self, keys, st):
        ctx = self._ctx(st)
        out = self.m.prepare_store([_bkey(k) for k in keys], ctx)
        if out is None:
            self.store_failures += 1
            return None
        self.m.complete_store(out.keys_to_store, ctx)
        return [_ikey(k) for k in out.keys_to_store]

    def on_request_finished(self, st) -> None:
        self.m.on_request_finished(self._ctx(st))

    def order(self) -> list[int]:
        pol = self.m._policy
        if self.policy_name == "lru":
            return [_ikey(k) for k, _ in sorted(pol._ranks.items(), key=lambda kv: kv[1])]
        return [_ikey(k) for k in list(pol.t1) + list(pol.t2)]

    def resident(self) -> int:
        return len(self.order())


class _HeadFirstLru(LruPolicy):
    """Negative control: commits a finished request's chunks head first (tail most recent) — wrong."""

    def on_request_finished(self, ordered_keys, insertion_only, reused, st) -> None:
        super().on_request_finished(list(reversed(ordered_keys)), insertion_only, reused, st)


def gen_case(rng: np.random.Generator) -> dict:
    b = int(rng.choice([1, 2, 4]))
    n = int(rng.integers(2, 30))
    nconv = int(rng.integers(1, 6))
    conv = rng.integers(0, nconv, n)
    last: dict[int, int] = {}
    T = np.zeros(n, np.int64)
    for r, c in enumerate(conv):
        T[r] = last.get(int(c), 0) + int(rng.integers(1, 5 * b))
        if rng.random() < 0.2:
            T[r] = -(-T[r] // b) * b  # exact block multiple
        last[int(c)] = int(T[r]) + int(rng.integers(0, 2 * b))
    off, h = hashes_from_block_counts(conv, T // b, shared_prefix_blocks=int(rng.integers(0, 3)))
    N = int(-(-T.max() // b)) + int(rng.integers(0, 10))
    hold = None
    times = None
    if rng.random() < 0.4:
        times = np.cumsum(rng.integers(0, 3, n)).astype(float)
        hold = rng.integers(0, 4, n).astype(float)
    return {
        "b": b,
        "T": T,
        "off": off,
        "h": h,
        "N": N,
        "C": int(rng.integers(0, 12)),
        "bpc": int(rng.integers(1, 4)),
        "policy": str(rng.choice(["lru", "arc"])),
        "threshold": int(rng.choice([0, 0, 2])),
        "times": times,
        "hold": hold,
    }


STATS = {"cpu_hits": 0, "store_failures": 0, "evictions": 0, "hold_cases": 0}


def run_case(cs: dict, wrong: bool = False) -> str | None:
    reqs = requests_from_stream(cs["T"], cs["off"], cs["h"])
    sides = []
    for real in (False, True):
        if real:
            mgr = RealManager(cs["C"], policy=cs["policy"], store_threshold=cs["threshold"])
        else:
            mgr = CpuOffloadManager(cs["C"], policy=cs["policy"], store_threshold=cs["threshold"])
            if wrong and cs["policy"] == "lru":
                mgr.policy = _HeadFirstLru(cs["C"])
        host = NativeCpuTier(cs["C"], block_size=cs["b"], blocks_per_chunk=cs["bpc"], policy=cs["policy"], manager=mgr)
        e = TieredEngine(VllmEngine(cs["N"], block_size=cs["b"]), host)
        log: list = []

        def on_event(kind, r, out, e=e, log=log):
            o = (out.gpu_hit_tokens, out.cpu_hit_tokens) if kind == "submit" else None
            log.append((kind, r, o, tuple(e.host_eviction_order())))

        res = replay(e, reqs, times=cs["times"], hold=cs["hold"], on_event=on_event)
        sides.append(log)
        if not real:
            STATS["cpu_hits"] += sum(1 for o in res.outcomes if o is not None and o.cpu_hit_tokens)
            STATS["store_failures"] += mgr.store_failures
            STATS["evictions"] += mgr.evictions
            STATS["hold_cases"] += cs["hold"] is not None
    for a, b in zip(*sides, strict=True):
        if a != b:
            return f"kvhit {a}\nvllm  {b}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expect-mismatch", action="store_true")
    ap.add_argument("--json", default=None, help="append a one-line JSON summary to this file")
    a = ap.parse_args(argv)
    rc = _main(a)
    if a.json:
        import json

        with open(a.json, "a") as f:
            f.write(
                json.dumps(
                    {
                        "check": "tiers-native",
                        "vllm": vllm.__version__,
                        "cases": a.cases,
                        "seed": a.seed,
                        "expect_mismatch": a.expect_mismatch,
                        "ok": rc == 0,
                        "exercised": STATS,
                    }
                )
                + "\n"
            )
    return rc


def _main(a) -> int:
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    for i in range(a.cases):
        cs = gen_case(rng)
        if a.expect_mismatch:
            cs["policy"] = "lru"
        diff = run_case(cs, wrong=a.expect_mismatch)
        if diff is not None:
            if a.expect_mismatch:
                print(f"vllm=={vllm.__version__} native tier: mismatch found as expected (case {i})")
                return 0
            print(f"vllm=={vllm.__version__} native tier: MISMATCH in case {i}: {cs}\n{diff}")
            return 1
    if a.expect_mismatch:
        print(f"vllm=={vllm.__version__} native tier: no mismatch found in {a.cases} cases (negative control FAILED)")
        return 1
    print(
        f"vllm=={vllm.__version__} native tier (CPUOffloadingManager): {a.cases} cases equal "
        f"({time.time() - t0:.1f} s; exercised: {STATS})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
