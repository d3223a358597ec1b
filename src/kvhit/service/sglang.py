"""``--engine sglang`` in ``simulate``, ``curve`` and ``plan --compare sglang``: SGLang 0.5.23's radix cache
(:mod:`kvhit.sim.engines.sglang`, compiled as :mod:`kvhit.sim.radix`) on every workload source.

Units: SGLang's capacity is its KV pool in **tokens** (``--N`` of ``simulate``), a multiple of ``--page-size``;
the hit ratio is SGLang's token hit ratio (cached prompt tokens / prompt tokens). On ``curve`` and ``plan`` the
axis stays vLLM's (blocks of ``b`` tokens, GiB of the model's KV): SGLang at the same memory has ``N·b`` tokens
(rounded down to pages), since both pools store the same bytes per token.

Eviction policies: SGLang 0.5.23's ``--radix-eviction-policy`` offers ``lru`` (default), ``lfu``, ``slru``,
``priority`` and ``tlru``; its strategy table (``mem_cache/utils.py``) also holds ``fifo``, ``mru`` and ``filo``.
Modelled: ``lru``, ``fifo``, ``mru``, ``filo`` (a node priority from its access or creation time). Refused:
``lfu``/``slru`` (per-node hit counts incremented by inserts with a per-request ``inserted_len`` — not
modelled), ``priority`` (per-request priorities the traces do not carry), ``tlru`` (per-node tail bookkeeping
of the unified tree and a ``--radix-eviction-policy-config``).

Invariant: a flag that does not apply to the engine asked for is refused in one line (block-only flags with
SGLang, SGLang flags without it). NOT modelled: what :mod:`kvhit.sim.engines.sglang` does not model; no
estimator is computed here (the simulated rows only).
"""

from __future__ import annotations

import numpy as np

from .errors import InputError, translating

__all__ = [
    "MODELLED_POLICIES",
    "SGLANG_POLICIES",
    "check_evict_policy",
    "check_sglang_flags",
    "sglang_tokens",
    "simulate_sglang",
]

#: ``--radix-eviction-policy`` choices of SGLang 0.5.23 (``arg_groups/choices.py``) + strategy-table-only ones
SGLANG_POLICIES = ("lru", "lfu", "slru", "priority", "tlru", "fifo", "mru", "filo")
MODELLED_POLICIES = ("lru", "fifo", "mru", "filo")
_WHY = {
    "lfu": "per-node hit counts updated by inserts (per-request inserted_len)",
    "slru": "per-node hit counts updated by inserts (per-request inserted_len)",
    "priority": "per-request priorities, which the traces do not carry",
    "tlru": "the unified tree's per-node tail bookkeeping and --radix-eviction-policy-config",
}


def check_evict_policy(name: str | None) -> str:
    """The policy to model (default ``lru``), or a one-line refusal."""
    if name is None:
        return "lru"
    if name in MODELLED_POLICIES:
        return name
    if name in _WHY:
        raise InputError(
            f"--evict-policy {name}: SGLang 0.5.23 offers it but kvhit does not model it ({_WHY[name]}); "
            f"modelled: {', '.join(MODELLED_POLICIES)}"
        )
    raise InputError(f"--evict-policy {name}: not an SGLang 0.5.23 policy ({', '.join(SGLANG_POLICIES)})")


def check_sglang_flags(
    req, sglang: bool, block_only: tuple[str, ...] = (), where: str = "--engine sglang"
) -> tuple[int, str]:
    """Refuse SGLang flags without SGLang and ``block_only`` flags with it; return (page size, policy)."""
    sg_fields = [n for n in ("page_size", "evict_policy", "decode_tokens_per_s") if getattr(req, n, None) is not None]
    if not sglang:
        if sg_fields:
            raise InputError(f"{req.flag(sg_fields[0])}: applies to {where}")
        return 1, "lru"
    for name in block_only:
        v = getattr(req, name, None)
        if v is not None and v is not False:
            what = {
                "block_size": "SGLang's pool is in tokens; give its page size with --page-size",
                "colocated": "SGLang always caches responses (prompt and output share the pool)",
                "weighting": "SGLang's hit ratio is in tokens",
            }.get(name, "it applies to vLLM's block cache")
            raise InputError(f"{req.flag(name)}: a vLLM block-cache flag; {what}")
    return int(req.page_size or 1), check_evict_policy(req.evict_policy)


def sglang_tokens(N_blocks: int, block_size: int, page_size: int) -> int:
    """SGLang's pool at the memory of ``N_blocks`` vLLM blocks: ``N·b`` tokens rounded down to whole pages."""
    return int(N_blocks) * int(block_size) // page_size * page_size


def _check_pools(Cs, p: int) -> None:
    from .base import check_capacity_memory

    for C in Cs:
        if C % p:
            raise InputError(
                f"--N {C}: an SGLang pool is whole pages; {C:,} tokens is not a multiple of --page-size {p}"
            )
        check_capacity_memory(max(C // p, 1), "--N")


def _notes(p: int, pol: str, hold) -> list[str]:
    out = [
        f"engine sglang (SGLang 0.5.23 radix cache, page size {p}, {pol}): N is the KV pool in tokens; h is the "
        "token hit ratio (cached prompt tokens / prompt tokens), CI from 10 batch means in arrival order",
        "no one-pass curve: SGLang's whole-leaf eviction has no inclusion property (kvhit.sim.radixrun)",
    ]
    if hold is not None:
        out.append("in-flight holds: a request keeps its KV for T/prefill + n/decode seconds; FIFO admission")
    return out


def simulate_sglang(req, source: str, progress=None):
    """``simulate --engine sglang`` on a production trace, a kvhit trace or a spec (replications)."""
    from ..sim.radixrun import radix_holds, radix_rows
    from ..sim.streams import streams_from_production, streams_from_trace
    from .inputs import production_mask, production_notes, read_blocks_trace, read_trace, window_for
    from .simulate import SimulateResponse

    p, pol = check_sglang_flags(req, True, ("block_size", "colocated", "weighting"))
    if "policy" in req.model_fields_set and req.policy == "content":
        raise InputError("--policy content and --engine sglang: the SGLang model is its own policy; drop --policy")
    Cs = [int(n) for n in req.N]
    _check_pools(Cs, p)
    speeds = (req.prefill_tokens_per_s, req.decode_tokens_per_s)
    if source == "blocks":
        pt = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        mask = production_mask(pt, req.warmup_time)
        with translating(f"--blocks-trace {req.blocks_trace}"):
            ts = streams_from_production(pt)
            hold = radix_holds(ts, *speeds)
            rows, feas, _ = radix_rows(
                ts, Cs, page_size=p, evict_policy=pol, mask=mask, times=pt.time, hold=hold, progress=progress
            )
        return SimulateResponse(
            policy="sglang",
            blocks_trace=str(req.blocks_trace),
            describe=pt.describe(),
            rows=rows,
            notes=_notes(p, pol, hold) + production_notes(pt),
            N_min=feas.C_min,
        )
    if source == "trace":
        tr = read_trace(req.trace)
        window = window_for(tr, req.warmup, req.warmup_time, str(req.trace))
        with translating(f"--trace {req.trace}"):
            ts = streams_from_trace(tr, block_size=tr.block_size or 128)
            hold = radix_holds(ts, *speeds)
            rows, feas, _ = radix_rows(
                ts,
                Cs,
                page_size=p,
                evict_policy=pol,
                mask=window.mask(tr),
                times=tr["time"],
                hold=hold,
                progress=progress,
            )
        return SimulateResponse(
            policy="sglang", trace=str(req.trace), rows=rows, notes=_notes(p, pol, hold), N_min=feas.C_min
        )

    from ..sim.metrics import mean_ci
    from ..workload import Window, generate
    from .spec import load_spec

    sp = load_spec(req)
    conversations = req.conversations or 20_000
    replications = req.replications or 5
    n_warm = req.warmup if req.warmup is not None else max(1, conversations // 5)
    per: dict[int, list[dict]] = {c: [] for c in Cs}
    hold = None
    C_min = 0
    with translating(str(req.spec) if req.spec else "spec"):
        for r in range(replications):
            tr = generate(sp, req.seed + r, n_conversations=conversations + n_warm)
            window = Window.warmup_conversations(tr, n_warm)
            ts = streams_from_trace(tr, block_size=128)
            hold = radix_holds(ts, *speeds)
            rows, feas, _ = radix_rows(
                ts, Cs, page_size=p, evict_policy=pol, mask=window.mask(tr), times=tr["time"], hold=hold
            )
            C_min = max(C_min, feas.C_min)
            for row in rows:
                per[row["N"]].append(row)
            if progress is not None:
                progress(r + 1, replications)
    out = []
    for c in Cs:
        reps = per[c]
        base = {"N": c, "engine": "sglang", "unit": "tokens", "page_size": p, "evict_policy": pol}
        if not all(x["feasible"] for x in reps):
            base.update(
                feasible=False,
                h=None,
                h_ci95=None,
                refused_request_share=float(np.mean([x["refused_request_share"] for x in reps])),
                refused_token_share=float(np.mean([x["refused_token_share"] for x in reps])),
                replications=replications,
            )
        else:
            h, half = mean_ci([x["h"] for x in reps])
            base.update(
                feasible=True,
                h=h,
                h_ci95=half,
                token_hit_ratio=h,
                request_hit_rate=mean_ci([x["request_hit_rate"] for x in reps])[0],
                refused_request_share=0.0,
                refused_token_share=0.0,
                replications=replications,
                h_reps=[x["h"] for x in reps],
            )
        out.append(base)
    notes = _notes(p, pol, hold)
    notes[0] = notes[0].replace("CI from 10 batch means in arrival order", "CI over independent replications")
    return SimulateResponse(policy="sglang", rows=out, spec=sp.to_dict(), notes=notes, N_min=C_min)


def plan_compare_sglang(req, plan_blocks_trace, plan_rest):
    """``plan --compare sglang``: the engine's plan as usual (``plan_blocks_trace``/``plan_rest`` answer it
    without the comparison), plus both engines simulated at the same KV budget
    (:func:`kvhit.plan_sglang.compare_vllm_sglang`) in ``compare``."""
    from ..plan_sglang import compare_vllm_sglang

    p, pol = check_sglang_flags(req, True)
    if req.accelerator is None and req.kv_gb is None:
        raise InputError("--compare sglang: needs a KV budget (--gpu or --kv-gb)")
    if req.engine not in ("vllm", "vllm-0.23"):
        raise InputError(f"--compare sglang: compares simulated vLLM with SGLang; --engine {req.engine} is not vLLM")
    if req.blocks_trace is not None and (req.lam0 is not None or req.scale is not None):
        raise InputError("--compare sglang: compares on the trace as read (no --lam0/--scale resampling)")
    base = req.model_copy(update={"compare": None, "page_size": None, "evict_policy": None})
    if req.blocks_trace is not None:
        from .inputs import production_mask, read_blocks_trace

        res = plan_blocks_trace(base)
        source = read_blocks_trace(req.blocks_trace, req.arrival, req.rate, req.span, req.seed)
        mask = production_mask(source, None)
        b, where = source.block_size, f"--blocks-trace {req.blocks_trace}"
    else:
        from .inputs import read_trace, window_for
        from .traces import bundled_sharegpt

        res = plan_rest(base)
        if req.sharegpt:
            with translating("ShareGPT"):
                source = bundled_sharegpt(req.block_size)
            where = "ShareGPT"
        elif req.trace is not None:
            source, where = read_trace(req.trace), f"--trace {req.trace}"
        else:
            from ..workload import generate
            from .spec import load_spec

            with translating(str(req.spec or "spec")):
                source = generate(load_spec(req), req.seed, n_conversations=6_000)
            source.meta.update(n_warm=1_000)
            where = str(req.spec or "spec")
            res.notes.append(
                "--compare sglang on a spec: one generated trace of 1,000 warm-up + 5,000 measured "
                f"conversations (seed {req.seed})"
            )
        b = int(req.block_size or source.block_size or 128)
        source.meta["block_size"] = b
        mask = window_for(source, None, None, where).mask(source)
    from .plan import _capacity

    c = _capacity(req, b)
    bpt = c.bytes_per_block // b
    C = c.kv_bytes // bpt // p * p
    if C < p:
        raise InputError(f"{req.flag('kv_gb' if req.kv_gb is not None else 'accelerator')}: no SGLang page fits")
    with translating(where):
        res.compare = compare_vllm_sglang(
            source, c.N, C, mask=mask, engine=req.engine, page_size=p, evict_policy=pol, block_size=b
        )
    res.compare["kv_gib"] = c.kv_bytes / 2**30
    res.notes.append(
        "--compare sglang: both engines simulated on the same requests at the same KV bytes (vLLM blocks vs SGLang "
        "tokens); token hit ratios with 95% batch-means CIs, the difference paired per batch"
    )
    return res
