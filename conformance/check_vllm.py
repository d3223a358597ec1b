"""Conformance: kvhit's vLLM model against vLLM's own KVCacheManager, request by request.

Usage (inside a conformance environment, see ``make conformance``)::

    python conformance/check_vllm.py --model vllm --cases 300 --seed 0
    python conformance/check_vllm.py --model vllm-0.23 --cases 300 --seed 0 --expect-mismatch

Each case is a random multi-turn workload (see :func:`gen_case`: exact block multiples, prompts shorter
than a block, requests near and above capacity, pools of a few blocks, content duplicated across
conversations, in-flight holds with ties). Both engines are driven by the same
:func:`kvhit.sim.engine.replay`; after every event the per-request outcome (hit tokens, new block ids,
evicted hashes in order), the free-queue order (block ids, head first) and the eviction order (cached
hashes, head first) are compared. The first mismatch is shrunk (drop requests, shorten prompts, shrink
the pool, drop holds) to a minimal case, which is printed. With ``--expect-mismatch`` (negative control)
the run succeeds only if a mismatch is found. Exit status 0 = as expected, 1 = not.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

import numpy as np

from kvhit.sim.engine import Request, replay
from kvhit.sim.vllm.blockids import hashes_from_token_ids
from kvhit.sim.vllm.engine import VllmEngine

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import add_common_args, drop_one, first_difference, run  # noqa: E402
from real_vllm import VERSION, RealVllmEngine  # noqa: E402


@dataclass(frozen=True)
class Case:
    b: int
    N: int
    prompts: tuple[tuple[int, ...], ...]  # each request's whole prompt, token ids
    times: tuple[float, ...] | None = None
    hold: tuple[float, ...] | None = None

    def show(self) -> str:
        lines = [f"block_size={self.b} N={self.N} requests={len(self.prompts)}"]
        for r, p in enumerate(self.prompts):
            t = "" if self.hold is None else f" t={self.times[r]} hold={self.hold[r]}"
            lines.append(f"  r{r}: T={len(p)}{t} tokens={list(p)}")
        return "\n".join(lines)


def gen_case(rng: np.random.Generator) -> Case:
    b = int(rng.choice([1, 2, 3, 4, 8, 16]))
    N = int(rng.choice([int(rng.integers(1, 6)), int(rng.integers(6, 16)), int(rng.integers(16, 48))]))
    nconv = int(rng.integers(1, 6))
    sys_prompt = list(rng.integers(10_000, 20_000, int(rng.integers(0, 3 * b + 1))))
    hist: list[list[int]] = []
    for c in range(nconv):
        if c and rng.random() < 0.25:  # an exact duplicate of an earlier conversation's content
            hist.append(list(hist[int(rng.integers(0, c))]))
        else:
            hist.append(list(sys_prompt) if rng.random() < 0.5 else [])
    nxt = [1000 * (c + 1) for c in range(nconv)]
    dup_of = {c: i for c in range(nconv) for i in range(c) if hist[c] == hist[i] and hist[c]}
    prompts = []
    for _ in range(int(rng.integers(1, 25))):
        c = int(rng.integers(0, nconv))
        kind = rng.random()
        if kind < 0.3:
            inc = b * int(rng.integers(1, 4))  # exact block multiples
        elif kind < 0.55:
            inc = int(rng.integers(1, b + 1))  # shorter than a block
        elif kind < 0.7:
            inc = max(1, N * b - len(hist[c]) + int(rng.integers(-b, b + 2)))  # near / above capacity
        else:
            inc = int(rng.integers(1, 3 * b + 1))
        src = dup_of.get(c, c) if rng.random() < 0.5 else c  # duplicated conversations repeat content
        for _ in range(inc):
            hist[c].append(nxt[src])
            nxt[src] += 1
        if len(hist[c]) > 4 * N * b + 8:  # restart a conversation that outgrew the pool
            hist[c] = hist[c][-int(rng.integers(1, b * N + 2)) :]
        prompts.append(tuple(int(x) for x in hist[c]))
        if prompts and rng.random() < 0.15:  # a retry: an earlier prompt exactly (the T - 1 hit cap binds)
            prompts.append(prompts[int(rng.integers(0, len(prompts)))])
        resp = int(rng.integers(0, 2 * b + 1))  # the response becomes part of the next prompt
        for _ in range(resp):
            hist[c].append(nxt[c] + 500_000)
            nxt[c] += 1
    times = hold = None
    if rng.random() < 0.6:
        n = len(prompts)
        times = tuple(float(x) for x in np.sort(np.round(rng.uniform(0, 6, n), 0)))
        hold = tuple(float(x) for x in np.round(rng.exponential(2.0, n), 0) * (rng.random(n) >= 0.3))
    return Case(b, N, tuple(prompts), times, hold)


def requests(case: Case) -> list[Request]:
    off, hs = hashes_from_token_ids([np.array(p, np.int64) for p in case.prompts], case.b)
    hs = hs.view(np.int64)
    return [
        Request(rid=r, prompt_tokens=len(p), block_hashes=tuple(int(x) for x in hs[off[r] : off[r + 1]]), token_ids=p)
        for r, p in enumerate(case.prompts)
    ]


def trace(engine, case: Case) -> list:
    """Every event with the engine's state after it."""
    log: list = []

    def on_event(kind, rid, out):
        o = None
        if kind == "submit":
            o = (out.hit_tokens, out.new_blocks, out.evicted)
        log.append((kind, rid, o, tuple(engine.free_queue_order()), tuple(engine.eviction_order())))

    replay(engine, requests(case), times=case.times, hold=case.hold, on_event=on_event)
    return log


class _NoHitCapEngine(VllmEngine):
    """Mutant for a negative control: the lookup without vLLM's ``T - 1`` hit cap (may hit ``T // b``)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        pool = self.pool
        orig = pool.get_computed_blocks
        pool.get_computed_blocks = lambda hashes, num_tokens: orig(hashes, num_tokens + 1)


MUTANTS = {"no-hit-cap:vllm": _NoHitCapEngine, "no-hit-cap:vllm-0.23": _NoHitCapEngine}
COMPARE = "all"


def _model(case: Case, model: str):
    if model in MUTANTS:
        return MUTANTS[model](case.N, block_size=case.b, engine=model.split(":")[1])
    return VllmEngine(case.N, block_size=case.b, engine=model)


def compare(case: Case, model: str) -> tuple[int, str | None]:
    """(requests compared, first difference or None); ``COMPARE="hits"`` compares hit tokens only."""
    a = trace(_model(case, model), case)
    r = trace(RealVllmEngine(case.N, block_size=case.b), case)
    if COMPARE == "hits":
        a = [(e[0], e[1], e[2] and e[2][0], None, None) for e in a]
        r = [(e[0], e[1], e[2] and e[2][0], None, None) for e in r]
    n = sum(1 for e in r if e[0] == "submit")
    fields = ["event", "request", "outcome (hit tokens, new blocks, evicted)", "free queue", "eviction order"]
    return n, first_difference(a, r, fields, f"kvhit {model}", f"vLLM {VERSION}")


def smaller(case: Case) -> list[Case]:
    """The shrinker's candidates: drop holds, drop one request, shrink the pool, shorten one prompt."""
    cands = drop_one(case, "prompts")
    if case.N > 1:
        cands.append(replace(case, N=case.N - 1))
    for i in range(len(case.prompts)):
        if len(case.prompts[i]) > 1:
            p = list(case.prompts)
            p[i] = p[i][:-1]
            cands.append(replace(case, prompts=tuple(p)))
    return [c for c in cands if c.prompts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, choices=["vllm", "vllm-0.23", *MUTANTS])
    ap.add_argument("--compare", choices=["all", "hits"], default="all", help="hits: hit tokens only")
    add_common_args(ap)
    a = ap.parse_args()
    global COMPARE
    COMPARE = a.compare
    return run(
        a,
        gen_case=gen_case,
        compare=lambda c: compare(c, a.model),
        smaller=smaller,
        title=f"kvhit engine={a.model} vs vLLM {VERSION} ({a.compare})",
        summary={"model": a.model, "engine": f"vllm=={VERSION}", "compared": a.compare},
    )


if __name__ == "__main__":
    sys.exit(main())
