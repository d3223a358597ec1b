"""Conformance: kvhit's ``engine="sglang"`` against SGLang's own RadixCache + token allocator (page_size 1).

    python conformance/check_sglang.py --cases 300 --seed 0 [--model sglang|no-hit-cap|lru-always|other-cache]
        [--cache radix|unified-rust|unified-python] [--evict-policy lru|fifo|mru|filo|lfu|slru|priority|tlru]
        [--tlru-threshold N] [--expect-mismatch]

Random multi-turn workloads (prompts + outputs as token ids; exact retries, duplicated conversations, shared
system prompts, pools of a few tokens, requests near and above capacity, in-flight holds with ties); both
engines run through :func:`kvhit.sim.engine.replay`; after every event the outcome (hit tokens, evicted nodes
as token paths, evicted tokens), the free/evictable/cached token counts and the eviction order are compared.
The first mismatching case is shrunk and printed. ``--cache unified-*`` drives ``UnifiedRadixCache`` instead
(``real_sglang.RealUnifiedEngine``); its evicted node paths and eviction order are not observable and not compared.
kvhit's model follows the cache driven (``cache="radix"`` for ``--cache radix``, ``"unified"`` otherwise);
``--model other-cache`` runs the other one (a negative control for FIFO/FILO, where they differ).
``--tlru-threshold N``: T-LRU's ``threshold`` (``--radix-eviction-policy-config``; ``next_prompt_estimate`` 0), kvhit's
``tlru_tail_budget=N``.
Not checked here: ``page_size > 1``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import add_common_args, drop_one, first_difference, run  # noqa: E402
from real_sglang import VERSION, RealSglangEngine, RealUnifiedEngine  # noqa: E402

from kvhit.sim.engine import Request, replay  # noqa: E402
from kvhit.sim.sglang.engine import SglangEngine  # noqa: E402


@dataclass(frozen=True)
class Case:
    C: int
    reqs: tuple[tuple[int, tuple[int, ...]], ...]  # (prompt tokens T, prompt + output token ids)
    times: tuple[float, ...] | None = None
    hold: tuple[float, ...] | None = None

    def show(self) -> str:
        out = [f"capacity={self.C} tokens, requests={len(self.reqs)}"]
        for r, (T, toks) in enumerate(self.reqs):
            t = "" if self.hold is None else f" t={self.times[r]} hold={self.hold[r]}"
            out.append(f"  r{r}: T={T} outputs={len(toks) - T}{t} tokens={list(toks)}")
        return "\n".join(out)


def gen_case(rng) -> Case:
    C = int(rng.choice([int(rng.integers(2, 12)), int(rng.integers(12, 40)), int(rng.integers(40, 120))]))
    nconv = int(rng.integers(1, 6))
    sysp = [int(x) for x in rng.integers(10_000, 20_000, int(rng.integers(0, 8)))]
    hist = [list(sysp) if rng.random() < 0.5 else [] for _ in range(nconv)]
    nxt = [1000 * (c + 1) for c in range(nconv)]
    reqs = []
    for _ in range(int(rng.integers(1, 20))):
        c = int(rng.integers(0, nconv))
        inc = int(rng.integers(1, 10)) if rng.random() < 0.8 else max(1, C - len(hist[c]) + int(rng.integers(-3, 3)))
        for _ in range(inc):
            hist[c].append(nxt[c])
            nxt[c] += 1
        T = len(hist[c])
        out = int(rng.integers(1, 8))
        toks = list(hist[c]) + [500_000 + nxt[c] + i for i in range(out)]
        nxt[c] += out
        reqs.append((T, tuple(toks)))
        if rng.random() < 0.15:  # an exact retry: same prompt, same outputs
            reqs.append(reqs[int(rng.integers(0, len(reqs)))])
        hist[c] = toks if len(toks) < 3 * C else []
        if rng.random() < 0.1 and nconv > 1:  # a conversation duplicated into another
            hist[int(rng.integers(0, nconv))] = list(hist[c])
    times = hold = None
    if rng.random() < 0.5:
        n = len(reqs)
        times = tuple(float(x) for x in np.sort(np.round(rng.uniform(0, 6, n), 0)))
        hold = tuple(float(x) for x in np.round(rng.exponential(2.0, n), 0) * (rng.random(n) >= 0.3))
    return Case(C, tuple(reqs), times, hold)


def requests(case: Case) -> list[Request]:
    return [
        Request(rid=r, prompt_tokens=T, output_tokens=len(t) - T, token_ids=t) for r, (T, t) in enumerate(case.reqs)
    ]


class _NoHitCap(SglangEngine):
    """Mutant (negative control): the admission match is not capped at T - 1 tokens."""

    def submit(self, req):
        orig = self._match
        self._match = lambda key: orig(req.token_ids[: req.prompt_tokens])
        try:
            return super().submit(req)
        finally:
            self._match = orig


class _LruAlways(SglangEngine):
    """Mutant (negative control for ``--evict-policy``): the model always evicts LRU."""

    def __init__(self, capacity, evict_policy="lru", **kw):
        super().__init__(capacity, cache=kw["cache"])


def _other_cache(capacity, **kw):
    """Mutant (negative control for the cache class): kvhit's model of the other class."""
    kw["cache"] = {"unified": "radix", "radix": "unified"}[kw["cache"]]
    return SglangEngine(capacity, **kw)


MODELS = {"sglang": SglangEngine, "no-hit-cap": _NoHitCap, "lru-always": _LruAlways, "other-cache": _other_cache}


def trace(engine, case: Case, state) -> list:
    log = []

    def on_event(kind, rid, out):
        o = (out.hit_tokens, out.evicted, out.evicted_units) if kind == "submit" else None
        log.append((kind, rid, o, state(engine), tuple(engine.eviction_order())))

    replay(engine, requests(case), times=case.times, hold=case.hold, on_event=on_event)
    return log


CACHES = {
    "radix": lambda C, pol, cfg: RealSglangEngine(C, evict_policy=pol, policy_config=cfg),
    "unified-rust": lambda C, pol, cfg: RealUnifiedEngine(C, "rust", evict_policy=pol, policy_config=cfg),
    "unified-python": lambda C, pol, cfg: RealUnifiedEngine(C, "python", evict_policy=pol, policy_config=cfg),
}
NAMES = {"radix": "RadixCache", "unified-rust": "UnifiedRadixCache (rust core)",
         "unified-python": "UnifiedRadixCache (python core)"}  # fmt: skip
CACHE = ["radix", "lru", 0]  # set from --cache, --evict-policy, --tlru-threshold


def _unobservable(log: list) -> list:
    """UnifiedRadixCache: evicted node paths and the eviction order are internal to the tree core; drop them."""
    return [(k, rid, None if o is None else (o[0], (), o[2]), st, ()) for k, rid, o, st, _ in log]


def compare(case: Case, model: str):
    kw = {"evict_policy": CACHE[1], "cache": "radix" if CACHE[0] == "radix" else "unified"}
    cfg = None
    if CACHE[1] == "tlru":
        kw["tlru_tail_budget"] = CACHE[2]
        cfg = {"threshold": CACHE[2], "next_prompt_estimate": 0}
    a = trace(MODELS[model](case.C, **kw), case, lambda e: (e.available, e.evictable_size(), e.cached_tokens()))
    r = trace(CACHES[CACHE[0]](case.C, CACHE[1], cfg), case, lambda e: e.state())
    if CACHE[0] != "radix":
        a, r = _unobservable(a), _unobservable(r)
    n = sum(1 for e in r if e[0] == "submit")
    fields = [
        "event",
        "request",
        "outcome (hit, evicted, evicted tokens)",
        "(free, evictable, cached)",
        "eviction order",
    ]
    return n, first_difference(a, r, fields, f"kvhit {model}", f"sglang {VERSION}")


def smaller(case: Case) -> list[Case]:
    """The shrinker's candidates: drop holds, drop one request, shrink the pool."""
    cands = drop_one(case, "reqs")
    if case.C > 1:
        cands.append(replace(case, C=case.C - 1))
    return [c for c in cands if c.reqs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="sglang")
    ap.add_argument("--cache", choices=sorted(CACHES), default="radix", help="SGLang cache class (tree core)")
    ap.add_argument(
        "--evict-policy", choices=["lru", "fifo", "mru", "filo", "lfu", "slru", "priority", "tlru"], default="lru"
    )
    ap.add_argument("--tlru-threshold", type=int, default=0, help="T-LRU threshold (tokens), with --evict-policy tlru")
    add_common_args(ap)
    a = ap.parse_args()
    CACHE[:] = [a.cache, a.evict_policy, a.tlru_threshold]
    return run(
        a,
        gen_case=gen_case,
        compare=lambda c: compare(c, a.model),
        smaller=smaller,
        title=f"kvhit engine={a.model} vs SGLang {VERSION} {NAMES[a.cache]} ({a.evict_policy}"
        + (f", threshold {a.tlru_threshold})" if a.evict_policy == "tlru" else ")"),
        summary={
            "model": a.model,
            "engine": f"sglang=={VERSION}",
            "cache": a.cache,
            "evict_policy": a.evict_policy,
            **({"tlru_threshold": a.tlru_threshold} if a.evict_policy == "tlru" else {}),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
