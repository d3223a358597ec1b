"""The hand-worked cases of ``tests/test_sglang_policies.py`` replayed through SGLang's own caches.

    python conformance/pinned_sglang.py      (in the SGLang environment: conformance/make_env.sh sglang 0.5.23)

For every case and setting pinned there, prints the tokens the last request's admission evicted in SGLang's
``RadixCache`` (with the evicted node paths) and ``UnifiedRadixCache`` (Python and Rust tree cores), next to
kvhit's model; exits 1 if any differs. Settings a class does not offer (T-LRU on ``RadixCache``) are skipped.
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
