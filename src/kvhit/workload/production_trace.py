"""The production block-id trace (:class:`ProductionTrace`) and the chain property of its hash stream.

A :class:`ProductionTrace` holds, per request sorted by arrival time (stable: ties keep file order), a prompt
length ``T_j`` (tokens), a response length and exactly ``⌊T_j / b⌋`` full-block ids (equal ids mean reusable
prefix KV blocks), as the CSR hash stream of :func:`kvhit.sim.vllm.block.simulate_block` /
:func:`kvhit.sim.vllm.curve.block_curve` (:meth:`ProductionTrace.to_block_requests`). The readers that build one
from Mooncake and WEKA files are in :mod:`kvhit.workload.production`.

Chain property
--------------
:func:`~kvhit.sim.vllm.curve.block_curve` needs a *chained* stream (each id always follows the same parent id,
a root id always starts a request), which is what vLLM's chained ``hash_block_tokens`` yields. Both stored
traces satisfy it as given (Mooncake after dropping the partial-block ids, WEKA after namespacing by
conversation; checked on every read). ``chain="auto"`` (default) checks it and, if it fails, re-chains the ids
as ``h_i = mix(h_{i−1}, id_i)`` — the hash vLLM would compute if the given ids identified block *content*:
equal id prefixes ↦ equal hashes, different prefixes ↦ different hashes; on an already chained stream this is
a bijection of the prefixes and changes no hit. :attr:`ProductionTrace.rechained` records what was done.
``chain="strict"`` raises instead (naming the first offending request), ``"rechain"`` always re-chains,
``"keep"`` neither checks nor re-chains.

Invariant: ``hash_offsets`` has ``n + 1`` entries and request ``r`` owns ``⌊T_r / b⌋`` ids; :func:`rechain` maps
equal id prefixes to equal hashes (a bijection of the prefixes of an already chained stream).

NOT modelled here: the file formats (:mod:`kvhit.workload.production`) and the engines' own block hashing
(:mod:`kvhit.sim.vllm.blockids`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64 as _fmix64
from kvhit.workload.requests import kv_tokens

__all__ = ["ProductionTrace", "ProductionTraceError", "chain_violation", "rechain"]


class ProductionTraceError(ValueError):
    """Malformed production trace (the message names the file, the record and the field)."""


@dataclass(frozen=True)
class ProductionTrace:
    """Requests of a production trace, sorted by arrival time, with their chained block-id stream.

    Per request ``r`` (arrays of length ``n``): ``time`` (s), ``prompt_tokens`` (``T_j``), ``output_tokens``,
    ``hash_offsets``/``hashes`` (CSR: ``hashes[hash_offsets[r]:hash_offsets[r+1]]`` are the ``⌊T_j/b⌋``
    full-block ids), ``session`` (dense session / conversation id, or ``None``), ``agent`` (WEKA: 0 main
    agent, k ≥ 1 the k-th sub-agent; Mooncake: all 0), ``model`` (index into ``models``, or ``None``),
    provenance ``file_index`` (into ``files``), ``record`` (Mooncake: 1-based line number; WEKA: index in
    the file's top-level ``requests``) and ``sub_record`` (WEKA: index inside a sub-agent marker, else -1).
    """

    time: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_offsets: np.ndarray
    hashes: np.ndarray
    block_size: int
    session: np.ndarray | None
    agent: np.ndarray
    model: np.ndarray | None
    models: tuple[str, ...]
    file_index: np.ndarray
    record: np.ndarray
    sub_record: np.ndarray
    files: tuple[str, ...]
    format: str  #: "mooncake" or "weka"
    session_source: str  #: "file", "derived:prefix-subtree" or "none"
    rechained: bool  #: the ids were re-chained (the given ids were not a chained stream)
    n_partial_dropped: int  #: partial-block ids dropped by the ``ceil`` hash-count rule
    skipped: tuple[tuple[str, str, str], ...] = ()  #: (file, record, reason) of records skipped (strict=False)
    meta: dict = field(default_factory=dict)

    # ---- basic properties -------------------------------------------------------------------------

    @property
    def n_requests(self) -> int:
        return int(self.prompt_tokens.shape[0])

    def __len__(self) -> int:
        return self.n_requests

    @property
    def full_blocks(self) -> np.ndarray:
        """``⌊T_j / b⌋``: hashed (full) prompt blocks per request = ids per request."""
        return np.diff(self.hash_offsets)

    @property
    def prompt_blocks(self) -> np.ndarray:
        """``R_j = ⌈T_j / b⌉`` (eq. (6))."""
        return -(-self.prompt_tokens // self.block_size)

    def where(self, r: int) -> str:
        """Human-readable provenance of request ``r`` (file and line / request index)."""
        f = self.files[int(self.file_index[r])]
        if self.format == "mooncake":
            return f"{f}: line {int(self.record[r])}"
        s = int(self.sub_record[r])
        rec = f"requests[{int(self.record[r])}]" + (f".requests[{s}]" if s >= 0 else "")
        return f"{f}: {rec}"

    # ---- views --------------------------------------------------------------------------------------

    def select(self, mask) -> ProductionTrace:
        """Sub-trace of the requests where ``mask`` (bool[n]) is true, order kept (e.g. one model only).

        Sessions are not renumbered. A sub-stream of a chained stream is not necessarily chained only if it
        drops requests whose ids it shares; the ids themselves are kept.
        """
        m = np.asarray(mask)
        if m.dtype != np.bool_ or m.shape != (self.n_requests,):
            raise ProductionTraceError(f"mask: expected a boolean array of shape ({self.n_requests},)")
        counts = self.full_blocks
        keep = np.repeat(m, counts)
        off = np.zeros(int(m.sum()) + 1, np.int64)
        np.cumsum(counts[m], out=off[1:])

        def sub(a):
            return None if a is None else a[m]

        return replace(
            self,
            time=self.time[m],
            prompt_tokens=self.prompt_tokens[m],
            output_tokens=self.output_tokens[m],
            hash_offsets=off,
            hashes=self.hashes[keep],
            session=sub(self.session),
            agent=self.agent[m],
            model=sub(self.model),
            file_index=self.file_index[m],
            record=self.record[m],
            sub_record=self.sub_record[m],
            meta=dict(self.meta),
        )

    def to_block_requests(self, *, colocated: bool = False):
        """The block simulator's input (:class:`kvhit.workload.requests.BlockRequests`, ``source="production"``).

        ``colocated=False`` (PD-disaggregated prefiller, paper Fig. 1): ``⌊T_j/b⌋`` ids per request, as read.
        ``colocated=True`` (Remark B.1): the simulator also hashes the ``⌊(T_j+O_j−1)/b⌋ − ⌊T_j/b⌋`` blocks
        completed by the response (the last sampled token never gets KV); the traces carry no id for them,
        so each gets a fresh, never-reused negative id (a lower bound: in a real multi-turn chat the next
        turn's prompt would reuse them only if it contained the response verbatim, which the ids cannot tell). Use with
        ``simulate_block(..., colocated=True, response_tokens=rq.response_tokens)``.
        """
        from kvhit.workload.requests import BlockRequests

        b = self.block_size
        T = self.prompt_tokens
        if not colocated:
            return BlockRequests(T, self.hash_offsets, self.hashes, None, b, "production")
        O = self.output_tokens
        extra = kv_tokens(T, O) // b - T // b
        counts = self.full_blocks + extra
        off = np.zeros(self.n_requests + 1, np.int64)
        np.cumsum(counts, out=off[1:])
        out = np.empty(int(off[-1]), np.int64)
        is_prompt = np.ones(int(off[-1]), bool)
        # positions of the fresh ids: the last extra[r] slots of each request
        tail_start = np.repeat(off[1:] - extra, extra)
        within = np.arange(int(extra.sum()), dtype=np.int64) - np.repeat(np.cumsum(extra) - extra, extra)
        fresh_pos = tail_start + within
        is_prompt[fresh_pos] = False
        out[is_prompt] = self.hashes
        out[fresh_pos] = -1 - np.arange(fresh_pos.shape[0], dtype=np.int64)
        return BlockRequests(T, off, out, O.astype(np.int64), b, "production")

    # ---- statistics ---------------------------------------------------------------------------------

    def leading_reused(self) -> np.ndarray:
        """Per request, the number of leading ids already seen earlier in the stream: the hit blocks of an
        infinite cache before vLLM's ``(T−1)//b`` cap (stop at the first miss, as ``find_longest_cache_hit``).
        """
        hs = self.hashes
        n = self.n_requests
        if hs.shape[0] == 0:
            return np.zeros(n, np.int64)
        _, first, inv = np.unique(hs, return_index=True, return_inverse=True)
        pos = np.arange(hs.shape[0], dtype=np.int64)
        seen = first[inv] < pos
        notseen = np.where(seen, np.iinfo(np.int64).max, pos)
        off = self.hash_offsets
        counts = np.diff(off)
        run = np.zeros(n, np.int64)
        ne = counts > 0
        if ne.any():
            firstmiss = np.minimum.reduceat(notseen, off[:-1][ne])
            run[ne] = np.minimum(firstmiss, off[1:][ne]) - off[:-1][ne]
        return run

    def describe(self) -> dict:
        """Summary statistics (plain Python numbers).

        ``ideal_*`` are the infinite-cache values (no eviction ever): ``ideal_id_reuse`` = fraction of the
        full-block ids already seen earlier in the stream; ``ideal_block_hit_ratio`` = the paper's ``h`` of
        eq. (6)/(31), ``Σ R^H_j / Σ R_j`` with ``R^H_j = min(leading reused, (T_j−1)//b)`` and ``R_j =
        ⌈T_j/b⌉``; ``ideal_token_hit_ratio`` = vLLM's ``prefix_cache_hits / prefix_cache_queries`` =
        ``b·Σ R^H_j / Σ T_j``. These equal :func:`~kvhit.sim.vllm.block.simulate_block` at a capacity large enough
        that nothing hashed is ever evicted. ``min_N`` = ``max_j ⌈T_j/b⌉``: below it requests are rejected.
        """
        n = self.n_requests
        b = self.block_size
        T = self.prompt_tokens
        hs = self.hashes
        full = int(hs.shape[0])
        if full:
            _, cnt = np.unique(hs, return_counts=True)
            distinct = int(cnt.shape[0])
            shared = int((cnt > 1).sum())
        else:
            distinct = shared = 0
        run = self.leading_reused()
        hit = np.minimum(run, np.maximum((T - 1) // b, 0))
        ptok = int(T.sum())
        pblk = int(self.prompt_blocks.sum())
        out = {
            "format": self.format,
            "files": len(self.files),
            "requests": n,
            "block_size": b,
            "time_span_s": float(self.time[-1] - self.time[0]) if n else 0.0,
            "prompt_tokens_total": ptok,
            "prompt_tokens_mean": float(T.mean()) if n else float("nan"),
            "output_tokens_mean": float(self.output_tokens.mean()) if n else float("nan"),
            "prompt_blocks": pblk,
            "full_blocks": full,
            "distinct_blocks": distinct,
            "reused_block_accesses": full - distinct,
            "shared_blocks": shared,
            "ideal_id_reuse": (full - distinct) / full if full else float("nan"),
            "ideal_block_hit_ratio": float(hit.sum() / pblk) if pblk else float("nan"),
            "ideal_token_hit_ratio": float(hit.sum() * b / ptok) if ptok else float("nan"),
            "min_N": int(self.prompt_blocks.max()) if n else 0,
            "sessions": None,
            "multi_turn_sessions": None,
            "session_source": self.session_source,
            "rechained": self.rechained,
            "n_partial_dropped": self.n_partial_dropped,
            "n_skipped": len(self.skipped),
        }
        if self.session is not None and n:
            sc = np.bincount(self.session)
            sc = sc[sc > 0]
            out["sessions"] = int(sc.shape[0])
            out["multi_turn_sessions"] = int((sc >= 2).sum())
        return out


_SEED = np.uint64(0x9E3779B97F4A7C15)
_SALT = np.uint64(0x632BE59BD9B4E019)
_MUL = np.uint64(0xD6E8FEB86659FD93)


@njit(cache=True)
def _rechain_kernel(off, ids, out):  # pragma: no cover - compiled
    n = off.shape[0] - 1
    for r in range(n):
        h = _SEED
        for j in range(off[r], off[r + 1]):
            h = _fmix64(h * _MUL + _fmix64(ids[j] ^ _SALT))
            out[j] = h


def rechain(hash_offsets: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Chained ids ``h_i = fmix64(h_{i−1}·M + fmix64(id_i ⊕ s))`` per request (``h_{−1}`` a constant).

    Equal id prefixes give equal hashes; a collision of different prefixes has probability ~ 2⁻⁶⁴ per pair.
    """
    off = np.ascontiguousarray(hash_offsets, dtype=np.int64)
    ids = np.ascontiguousarray(hashes, dtype=np.int64).view(np.uint64)
    out = np.empty(ids.shape[0], np.uint64)
    if off.shape[0] > 1:
        _rechain_kernel(off, ids, out)
    return out.view(np.int64)


def chain_violation(hash_offsets: np.ndarray, hashes: np.ndarray) -> int:
    """First request (in stream order) where an id occurs with a different parent than at its first
    occurrence (parent = previous id of the request, or "request start"), or -1 if the stream is chained —
    the property :func:`kvhit.sim.vllm.curve.block_hit_thresholds` checks."""
    hs = np.asarray(hashes, dtype=np.int64)
    off = np.asarray(hash_offsets, dtype=np.int64)
    m = hs.shape[0]
    if m == 0:
        return -1
    counts = np.diff(off)
    root = np.zeros(m, bool)
    root[off[:-1][counts > 0]] = True
    par = np.empty(m, np.int64)
    par[1:] = hs[:-1]
    par[0] = 0
    par[root] = 0
    order = np.argsort(hs, kind="stable")  # by id, then stream position
    sh = hs[order]
    start = np.ones(m, bool)
    start[1:] = sh[1:] != sh[:-1]
    grp = np.maximum.accumulate(np.where(start, np.arange(m), 0))
    canon = order[grp]
    bad = (par[order] != par[canon]) | (root[order] != root[canon])
    if not bad.any():
        return -1
    j = int(order[bad].min())
    return int(np.searchsorted(off, j, side="right") - 1)
