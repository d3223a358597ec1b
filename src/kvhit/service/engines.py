"""Per-engine rules of the service layer: which flags apply to which engine, SGLang's eviction policies, and
the capacity of an engine at a given memory (from :mod:`kvhit.sim.registry`).

Every command dispatches on the engine once, through a table keyed by the names of
:data:`kvhit.sim.registry.ENGINES` (``simulate``: ``_SIMULATE`` in :mod:`kvhit.service.simulate`; ``plan
--compare``: :mod:`kvhit.service.plan`); the rules here are what those tables share.

Units: SGLang's capacity is its KV pool in **tokens** (``--N`` of ``simulate``), a multiple of ``--page-size``;
the hit ratio is SGLang's token hit ratio (cached prompt tokens / prompt tokens). On ``curve`` and ``plan`` the
axis stays vLLM's (blocks of ``b`` tokens, GiB of the model's KV): SGLang at the same memory has ``N·b`` tokens
(rounded down to pages), since both pools store the same bytes per token.

Eviction policies: SGLang 0.5.23's ``--radix-eviction-policy`` offers ``lru`` (default), ``lfu``, ``slru``,
``priority`` and ``tlru``; its strategy table (``mem_cache/utils.py``) also holds ``fifo``, ``mru`` and ``filo``.
All eight are modelled (:mod:`kvhit.sim.sglang.engine`). ``priority``: requests carry no priority here, i.e.
SGLang's default 0 (``req.priority or 0``); the prompt re-insert at release runs at priority 1
(``split_prompt``), so a finished request's prompt outlives its output leaf. ``tlru`` takes
``--tlru-threshold`` (``threshold − next_prompt_estimate`` of ``--radix-eviction-policy-config``; SGLang's
default 0 orders as LRU) and needs the unified cache. Cache class (``--sglang-cache``): ``unified``
(``UnifiedRadixCache``, what SGLang builds for a full-attention model; default) or ``radix`` (``RadixCache``);
they differ only for ``fifo``/``filo``.

Invariant: a flag that does not apply to the engine asked for is refused in one line (block-only flags with
SGLang, SGLang flags without it). NOT modelled: what the engine models do not model (their docstrings).
"""

from __future__ import annotations

from kvhit.service.errors import InputError

__all__ = [
    "MODELLED_POLICIES",
    "SGLANG_CACHES",
    "SGLANG_POLICIES",
    "check_evict_policy",
    "check_pools",
    "check_sglang_flags",
    "sglang_model",
    "sglang_notes",
    "sglang_tokens",
]

#: ``--radix-eviction-policy`` choices of SGLang 0.5.23 (``arg_groups/choices.py``) + strategy-table-only ones
SGLANG_POLICIES = ("lru", "lfu", "slru", "priority", "tlru", "fifo", "mru", "filo")
MODELLED_POLICIES = SGLANG_POLICIES
#: ``--sglang-cache`` choices: UnifiedRadixCache (default, what SGLang builds for full attention), RadixCache
SGLANG_CACHES = ("unified", "radix")


def check_evict_policy(name: str | None) -> str:
    """The policy to model (default ``lru``), or a one-line refusal."""
    if name is None:
        return "lru"
    if name in MODELLED_POLICIES:
        return name
    raise InputError(f"--evict-policy {name}: not an SGLang 0.5.23 policy ({', '.join(SGLANG_POLICIES)})")


def sglang_model(req, pol: str) -> dict:
    """The cache class and T-LRU tail budget (keyword arguments of the SGLang models) from ``--sglang-cache`` and
    ``--tlru-threshold``, or a one-line refusal."""
    cache = getattr(req, "sglang_cache", None) or "unified"
    if cache not in SGLANG_CACHES:
        raise InputError(f"--sglang-cache {cache}: expected one of {', '.join(SGLANG_CACHES)}")
    thr = getattr(req, "tlru_threshold", None)
    if thr is not None and pol != "tlru":
        raise InputError("--tlru-threshold: applies to --evict-policy tlru")
    if pol == "tlru" and cache != "unified":
        raise InputError("--sglang-cache radix: SGLang 0.5.23 offers --evict-policy tlru on UnifiedRadixCache only")
    return {"cache": cache, "tlru_tail_budget": int(thr or 0)}


def check_sglang_flags(
    req, sglang: bool, block_only: tuple[str, ...] = (), where: str = "--engine sglang"
) -> tuple[int, str]:
    """Refuse SGLang flags without SGLang and ``block_only`` flags with it; return (page size, policy)."""
    names = ("page_size", "evict_policy", "decode_tokens_per_s", "sglang_cache", "tlru_threshold")
    sg_fields = [n for n in names if getattr(req, n, None) is not None]
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
    from kvhit.sim.registry import ENGINES

    return ENGINES["sglang"].capacity_at_memory(N_blocks, block_size, page_size)


def check_pools(Cs, p: int) -> None:
    """Refuse (:class:`InputError`) an SGLang pool that is not a multiple of the page size ``p`` or whose tables
    would not fit in memory."""
    from kvhit.service.base import check_capacity_memory

    for C in Cs:
        if C % p:
            raise InputError(
                f"--N {C}: an SGLang pool is whole pages; {C:,} tokens is not a multiple of --page-size {p}"
            )
        check_capacity_memory(max(C // p, 1), "--N")


def sglang_notes(p: int, pol: str, hold, cache: str = "unified") -> list[str]:
    """The notes an SGLang result carries: what N and h mean for the radix cache, why there is no one-pass curve,
    and the holds used."""
    cls = {"unified": "UnifiedRadixCache", "radix": "RadixCache"}[cache]
    out = [
        f"engine sglang (SGLang 0.5.23 {cls}, page size {p}, {pol}): N is the KV pool in tokens; h is the "
        "token hit ratio (cached prompt tokens / prompt tokens), CI from 10 batch means in arrival order",
        "no one-pass curve: SGLang's whole-leaf eviction has no inclusion property (kvhit.sim.sglang.run)",
    ]
    if hold is not None:
        out.append("in-flight holds: a request keeps its KV for T/prefill + n/decode seconds; FIFO admission")
    return out
