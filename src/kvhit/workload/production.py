"""Readers for real production block-id traces (Mooncake FAST'25, WEKA Claude-Code) for the block simulator.

The trace type and its chain property are :mod:`kvhit.workload.production_trace`.

Both formats give, per request, a prompt length ``T_j`` (tokens), a response length and a list of block ids
(``hash_ids``) such that equal ids mean reusable prefix KV blocks.
:class:`~kvhit.workload.production_trace.ProductionTrace` turns them into the CSR hash stream of
:func:`kvhit.sim.vllm.block.simulate_block` / :func:`kvhit.sim.vllm.curve.block_curve`
(:meth:`~kvhit.workload.production_trace.ProductionTrace.to_block_requests`): exactly ``⌊T_j / b⌋`` ids per
request, requests sorted by arrival time (stable: ties keep file order).

Hash-count rule
---------------
vLLM hashes only *full* blocks (``hash_request_tokens``), so request ``j`` owns ``⌊T_j/b⌋`` ids; its last
partial block (the ``R_j − 1`` of eq. (28)) is never reusable. Per record:

* ``hash_count="ceil"`` (Mooncake, documented ``len(hash_ids) == ⌈input/512⌉``): the id list must have
  ``⌈T/b⌉`` entries; if ``T mod b ≠ 0`` the last id covers the partial block and is dropped (on the stored
  Mooncake files such an id never re-occurs as a full block, so dropping it loses no hit);
* ``hash_count="floor"`` (WEKA, documented ``len == ⌊in/64⌋``): exactly ``⌊T/b⌋`` entries, all kept;
* ``hash_count="auto"``: either count is accepted record by record (unambiguous: they differ unless
  ``b | T``).

Any other count is an error (:class:`~kvhit.workload.production_trace.ProductionTraceError` naming file, line /
request and field) or, with ``strict=False``, the record is skipped and listed in
:attr:`~kvhit.workload.production_trace.ProductionTrace.skipped`. Nothing is dropped silently:
``n_partial_dropped`` counts the dropped partial-block ids.

Chain property
--------------
See :mod:`kvhit.workload.production_trace` (``chain=`` of the readers: ``"auto"`` checks the chain
property and re-chains if it fails, ``"strict"`` raises, ``"rechain"`` always re-chains, ``"keep"`` neither).

Sessions
--------
WEKA: one file = one conversation (= session id, dense in file order); sub-agent requests (``type:
"subagent"`` markers holding their own ``requests[]``, times relative to the marker) belong to the parent's
conversation and namespace (upstream ``hash_id_scope: "local"``) and are tagged by :attr:`agent` (0 = main
agent, k = k-th sub-agent marker of the file). Block ids are namespaced as ``(conversation << 32) | id``
so two files never collide. Mooncake has no session id; ``sessions="prefix"`` derives one heuristically
(the data's SOURCE.md rule (a)): a block id with at least ``shared_min_successors`` distinct successor ids
is "shared" (the conversation trace's system block ``0`` has 7,373); a request's session is the first
non-shared id of its ``hash_ids`` (partial-block id included), i.e. the trie subtree below the shared
prefix; a request made only of shared blocks is its own session. ``sessions="none"`` leaves
:attr:`session` ``None``. On the stored files this gives SOURCE.md's 7,373 sessions (2,259 multi-turn)
for the conversation trace and 2,211 (408) for the synthetic one.

Time axis (WEKA)
----------------
WEKA times are relative to each conversation's start; ``arrival`` places conversation ``k`` (in file order) at
a start offset ``S_k``: ``"sequential"`` (default, ``S_0 = 0``, ``S_k`` = last request time of conversation
``k−1`` + ``gap``), ``"poisson"`` (Poisson arrivals of conversations at ``rate`` per second: ``S_0 = 0``,
``S_k − S_{k−1} ~ Exp(rate)`` i.i.d., ``numpy.random.default_rng(seed)``), ``"uniform"`` (``S_k ~ U[0,
span]`` i.i.d., seeded; the data's SOURCE.md example uses ``span=3600, seed=0``) or explicit ``starts``.
Mooncake ``timestamp`` is in ms (global) and is converted to seconds.

Invariant: a record is read in full or refused (:class:`~kvhit.workload.production_trace.ProductionTraceError`
naming file, record and field; with ``strict=False`` skipped and listed), never dropped silently.

NOT modelled here: the trace type and its chain property (:mod:`kvhit.workload.production_trace`) and the cache
of parsed reads (:mod:`kvhit.workload.production_cache`).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from kvhit.workload.production_trace import ProductionTrace, ProductionTraceError, chain_violation, rechain

__all__ = ["read_mooncake", "read_production", "read_weka"]

_HASH_COUNTS = ("ceil", "floor", "auto")
_CHAIN_MODES = ("auto", "strict", "rechain", "keep")
_ARRIVALS = ("sequential", "poisson", "uniform")
_NS_SHIFT = 32


#: Largest Mooncake ``timestamp`` read (ms): 10^13 ms is the year 2286 as a Unix epoch, 317 years as a relative time.
MAX_TIMESTAMP_MS = 1e13


# --------------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return (isinstance(x, int | float) and not isinstance(x, bool)) and math.isfinite(x)


class _Skip(Exception):
    """A record-level problem (message = 'field ...: reason')."""


def _hash_list(h, T: int, b: int, rule: str) -> tuple[list, bool]:
    """Validate ``hash_ids`` of a record; return the full-block ids and whether a partial id was dropped."""
    if not isinstance(h, list):
        raise _Skip(f"field 'hash_ids': expected a list of integers, got {type(h).__name__}")
    kinds = set(map(type, h))
    if kinds - {int}:
        bad = next(x for x in h if type(x) is not int)
        raise _Skip(f"field 'hash_ids': expected integer ids, found {bad!r}")
    F = T // b
    C = -(-T // b)
    k = len(h)
    if rule == "floor":
        ok = k == F
    elif rule == "ceil":
        ok = k == C
    else:
        ok = k in (F, C)
    if not ok:
        want = {"floor": f"floor(T/b) = {F}", "ceil": f"ceil(T/b) = {C}", "auto": f"{F} or {C}"}[rule]
        raise _Skip(f"field 'hash_ids': {k} ids for {T} prompt tokens and block_size {b}, expected {want}")
    if k > F:
        return h[:F], True
    return h, False


def _flatten(lists: list[list], what: str) -> np.ndarray:
    total = sum(map(len, lists))
    try:
        arr = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=total)
    except OverflowError:
        arr = None
    if arr is None or (total and arr.min() < 0):
        for i, h in enumerate(lists):
            for x in h:
                if not 0 <= x < 2**63:
                    raise ProductionTraceError(f"{what(i)}: field 'hash_ids': id {x} outside [0, 2**63)")
    return arr


def _apply_chain(off: np.ndarray, hs: np.ndarray, chain: str, where) -> tuple[np.ndarray, bool]:
    if chain not in _CHAIN_MODES:
        raise ProductionTraceError(f"chain: expected one of {_CHAIN_MODES}, got {chain!r}")
    if chain == "keep":
        return hs, False
    if chain == "rechain":
        return rechain(off, hs), True
    bad = chain_violation(off, hs)
    if bad < 0:
        return hs, False
    if chain == "strict":
        raise ProductionTraceError(
            f"{where(bad)}: field 'hash_ids': a block id recurs after a different parent id, the ids are not "
            "a chained prefix-hash stream (use chain='rechain' or 'auto')"
        )
    return rechain(off, hs), True


def _check_opts(hash_count: str, strict: bool) -> None:
    if hash_count not in _HASH_COUNTS:
        raise ProductionTraceError(f"hash_count: expected one of {_HASH_COUNTS}, got {hash_count!r}")
    if not isinstance(strict, bool):
        raise ProductionTraceError(f"strict: expected a bool, got {strict!r}")


def _block_size(block_size) -> int:
    if not _is_int(block_size) or block_size < 1:
        raise ProductionTraceError(f"block_size: expected a positive integer, got {block_size!r}")
    return int(block_size)


# --------------------------------------------------------------------------------------------------
# Mooncake
# --------------------------------------------------------------------------------------------------


def _prefix_sessions(raw_off: np.ndarray, raw: np.ndarray, min_succ: int) -> np.ndarray:
    """SOURCE.md rule (a): session = first id of the request with < ``min_succ`` distinct successors."""
    n = raw_off.shape[0] - 1
    m = raw.shape[0]
    counts = np.diff(raw_off)
    if m == 0:
        return np.arange(n, dtype=np.int64)
    uid, inv = np.unique(raw, return_inverse=True)
    last = np.zeros(m, bool)
    last[raw_off[1:][counts > 0] - 1] = True
    a = inv[:-1][~last[:-1]]
    c = inv[1:][~last[:-1]]
    pairs = np.unique(a.astype(np.int64) * uid.shape[0] + c)
    nsucc = np.bincount(pairs // uid.shape[0], minlength=uid.shape[0])
    shared = nsucc[inv] >= min_succ
    pos = np.arange(m, dtype=np.int64)
    cand = np.where(shared, np.iinfo(np.int64).max, pos)
    key = np.full(n, -1, np.int64)
    ne = counts > 0
    if ne.any():
        fm = np.minimum.reduceat(cand, raw_off[:-1][ne])
        okr = fm < raw_off[1:][ne]
        idx = np.flatnonzero(ne)[okr]
        key[idx] = inv[fm[okr]]
    # requests without a non-shared id: own session (distinct negative keys)
    lone = key < 0
    key[lone] = -1 - np.arange(int(lone.sum()))
    _, first, dense = np.unique(key, return_index=True, return_inverse=True)
    # renumber sessions by first appearance
    rank = np.empty(first.shape[0], np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    return rank[dense]


def read_mooncake(
    path: str | os.PathLike,
    *,
    strict: bool = True,
    block_size: int = 512,
    hash_count: str = "ceil",
    sessions: str = "prefix",
    shared_min_successors: int = 50,
    chain: str = "auto",
) -> ProductionTrace:
    """Read a Mooncake FAST'25 JSONL trace (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids`` of ``block_size``-token blocks).

    See the module docstring for ``hash_count``, ``sessions`` and ``chain``. Blank lines are ignored. A bad
    record raises :class:`ProductionTraceError` ``"<file>: line <k>: field '<name>': ..."``; with
    ``strict=False`` it is skipped and listed in ``skipped``.
    """
    _check_opts(hash_count, strict)
    b = _block_size(block_size)
    if sessions not in ("prefix", "none"):
        raise ProductionTraceError(f"sessions: expected 'prefix' or 'none', got {sessions!r}")
    p = str(path)
    try:
        fh = open(p, encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        raise ProductionTraceError(f"{p}: cannot open: {e}") from e
    times: list[float] = []
    T_l: list[int] = []
    O_l: list[int] = []
    H_l: list[list] = []
    raw_l: list[list] = []
    lines: list[int] = []
    skipped: list[tuple[str, str, str]] = []
    dropped = 0
    loads = json.loads
    with fh:
        for ln, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                try:
                    d = loads(line)
                except json.JSONDecodeError as e:
                    raise _Skip(f"invalid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(d, dict):
                    raise _Skip(f"expected a JSON object, got {type(d).__name__}")
                for k in ("timestamp", "input_length", "output_length", "hash_ids"):
                    if k not in d:
                        raise _Skip(f"field '{k}': missing")
                t = d["timestamp"]
                if not _is_num(t) or t < 0 or t > MAX_TIMESTAMP_MS:
                    raise _Skip(
                        f"field 'timestamp': expected a number of ms in [0, 10^13] (≤ year 2286 as an epoch), got {t!r}"
                    )
                T = d["input_length"]
                if not _is_int(T) or T < 1:
                    raise _Skip(f"field 'input_length': expected an integer >= 1, got {T!r}")
                O = d["output_length"]
                if not _is_int(O) or O < 0:
                    raise _Skip(f"field 'output_length': expected an integer >= 0, got {O!r}")
                h, drop = _hash_list(d["hash_ids"], T, b, hash_count)
            except _Skip as e:
                if strict:
                    raise ProductionTraceError(f"{p}: line {ln}: {e}") from None
                skipped.append((p, f"line {ln}", str(e)))
                continue
            dropped += drop
            times.append(t / 1000.0)
            T_l.append(T)
            O_l.append(O)
            H_l.append(h)
            raw_l.append(d["hash_ids"])
            lines.append(ln)
    n = len(T_l)
    rec = np.asarray(lines, np.int64)
    hs = _flatten(H_l, lambda i: f"{p}: line {int(rec[i])}")
    counts = np.fromiter(map(len, H_l), np.int64, count=n)
    time = np.asarray(times, np.float64)
    order = np.argsort(time, kind="stable")
    sorted_already = bool(np.all(order == np.arange(n)))
    out_of_order = int(np.count_nonzero(np.diff(time) < 0)) if n > 1 else 0  # reported, never silent
    off0 = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=off0[1:])
    sess = None
    if sessions == "prefix":
        rcounts = np.fromiter(map(len, raw_l), np.int64, count=n)
        roff = np.zeros(n + 1, np.int64)
        np.cumsum(rcounts, out=roff[1:])
        raw = _flatten(raw_l, lambda i: f"{p}: line {int(rec[i])}")
        if not sorted_already:
            raw, roff = _csr_take(roff, raw, order)
        sess = _prefix_sessions(roff, raw, int(shared_min_successors))
    if not sorted_already:
        hs, off0 = _csr_take(off0, hs, order)
    hs, rechained = _apply_chain(off0, hs, chain, lambda r: f"{p}: line {int(rec[order][r])}")
    return ProductionTrace(
        time=time[order],
        prompt_tokens=np.asarray(T_l, np.int64)[order],
        output_tokens=np.asarray(O_l, np.int64)[order],
        hash_offsets=off0,
        hashes=hs,
        block_size=b,
        session=sess,
        agent=np.zeros(n, np.int32),
        model=None,
        models=(),
        file_index=np.zeros(n, np.int32),
        record=rec[order],
        sub_record=np.full(n, -1, np.int32),
        files=(p,),
        format="mooncake",
        session_source="derived:prefix-subtree" if sessions == "prefix" else "none",
        rechained=rechained,
        n_partial_dropped=int(dropped),
        skipped=tuple(skipped),
        meta={
            "hash_count": hash_count,
            "shared_min_successors": int(shared_min_successors),
            "chain": chain,
            "out_of_order": out_of_order,
        },
    )


def _csr_take(off: np.ndarray, vals: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.diff(off)[order]
    new_off = np.zeros(order.shape[0] + 1, np.int64)
    np.cumsum(counts, out=new_off[1:])
    starts = np.repeat(off[:-1][order], counts)
    within = np.arange(int(new_off[-1]), dtype=np.int64) - np.repeat(new_off[:-1], counts)
    return vals[starts + within], new_off


# --------------------------------------------------------------------------------------------------
# WEKA
# --------------------------------------------------------------------------------------------------


def _weka_files(paths, max_files) -> list[str]:
    if isinstance(paths, str | os.PathLike):
        pp = Path(paths)
        if pp.is_dir():
            files = sorted(str(f) for f in pp.glob("*.json"))
            if not files:
                raise ProductionTraceError(f"{pp}: no *.json files in the directory")
        else:
            files = [str(pp)]
    else:
        files = [str(f) for f in paths]
        if not files:
            raise ProductionTraceError("paths: empty list of WEKA trace files")
    if max_files is not None:
        if not _is_int(max_files) or max_files < 1:
            raise ProductionTraceError(f"max_files: expected a positive integer, got {max_files!r}")
        files = files[:max_files]
    return files


def _weka_walk(reqs, base_t: float, label: str, agent: int, counter: list, out: list, sub_of: int | None):
    """Flatten a ``requests`` array (sub-agent markers recursively) into ``out`` as tuples
    (t, T, O, hash_ids, model, agent, record, sub_record, label)."""
    for i, r in enumerate(reqs):
        lab = f"{label}[{i}]"
        if not isinstance(r, dict):
            out.append(_Skip(f"{lab}: expected a JSON object, got {type(r).__name__}"))
            continue
        t = r.get("t")
        if not _is_num(t) or t < 0:
            out.append(_Skip(f"{lab}: field 't': expected a finite number >= 0 (s), got {t!r}"))
            continue
        typ = r.get("type")
        if typ == "subagent":
            sub = r.get("requests")
            if not isinstance(sub, list):
                out.append(_Skip(f"{lab}: field 'requests': expected the sub-agent's request list"))
                continue
            counter[0] += 1
            _weka_walk(sub, base_t + t, lab + ".requests", counter[0], counter, out, i if sub_of is None else sub_of)
            continue
        if typ not in ("n", "s"):
            out.append(_Skip(f"{lab}: field 'type': expected 'n', 's' or 'subagent', got {typ!r}"))
            continue
        out.append((base_t + t, r, agent, i if sub_of is None else sub_of, -1 if sub_of is None else i, lab))


def read_weka(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    max_files: int | None = None,
    arrival: str = "sequential",
    rate: float | None = None,
    span: float | None = None,
    seed: int = 0,
    starts: Sequence[float] | np.ndarray | None = None,
    gap: float = 0.0,
    subagents: bool = True,
    strict: bool = True,
    hash_count: str = "floor",
    chain: str = "auto",
) -> ProductionTrace:
    """Read WEKA Claude-Code traces (one JSON file = one conversation) onto one time axis.

    ``paths``: a directory (its ``*.json``, sorted by name), one file or a list of files (order kept; that
    order is the conversation index ``k``); ``max_files`` keeps the first ones. Conversation ``k`` starts at
    ``S_k`` given by ``arrival`` (module docstring: ``"sequential"`` with ``gap`` s, ``"poisson"`` with
    ``rate`` conversations/s, ``"uniform"`` on ``[0, span]``; ``seed`` for the random ones) or explicitly by
    ``starts`` (one per file, overrides ``arrival``). A request arrives at ``S_k + t`` (sub-agent requests at
    ``S_k + t_marker + t``). ``subagents=False`` drops sub-agent requests. Ids are namespaced per file
    (``hash_id_scope: "local"``; ``"global"`` keeps them). Errors name the file, ``requests[i]`` (or
    ``requests[i].requests[j]``) and the field; file-level errors always raise, record-level ones are
    skipped with ``strict=False``.
    """
    _check_opts(hash_count, strict)
    files = _weka_files(paths, max_files)
    C = len(files)
    if C >= 2**31:
        raise ProductionTraceError("paths: at most 2**31 - 1 files")
    S = _starts(arrival, C, rate, span, seed, starts, gap)  # validated (may be None: sequential)
    b = None
    rows: list = []  # (time, T, O, ids, model, agent, conv, record, sub_record)
    skipped: list[tuple[str, str, str]] = []
    models: dict[str, int] = {}
    ends = np.zeros(C, np.float64)
    for k, f in enumerate(files):
        try:
            with open(f, "rb") as fh:
                d = json.loads(fh.read())
        except OSError as e:
            raise ProductionTraceError(f"{f}: cannot open: {e}") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProductionTraceError(f"{f}: invalid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ProductionTraceError(f"{f}: expected a JSON object (one conversation), got {type(d).__name__}")
        fb = d.get("block_size")
        if not _is_int(fb) or fb < 1:
            raise ProductionTraceError(f"{f}: field 'block_size': expected a positive integer, got {fb!r}")
        if b is None:
            b = fb
        elif fb != b:
            raise ProductionTraceError(f"{f}: field 'block_size': {fb} differs from {b} of {files[0]}")
        scope = d.get("hash_id_scope")
        if scope not in ("local", "global"):
            raise ProductionTraceError(f"{f}: field 'hash_id_scope': expected 'local' or 'global', got {scope!r}")
        reqs = d.get("requests")
        if not isinstance(reqs, list):
            raise ProductionTraceError(f"{f}: field 'requests': expected a list")
        flat: list = []
        _weka_walk(reqs, 0.0, "requests", 0, [0], flat, None)
        last = 0.0
        for item in flat:
            try:
                if isinstance(item, _Skip):
                    raise item
                t, r, agent, rec, sub, lab = item
                try:
                    T = r.get("in")
                    if not _is_int(T) or T < 1:
                        raise _Skip(f"field 'in': expected an integer >= 1, got {T!r}")
                    O = r.get("out")
                    if not _is_int(O) or O < 0:
                        raise _Skip(f"field 'out': expected an integer >= 0, got {O!r}")
                    if "hash_ids" not in r:
                        raise _Skip("field 'hash_ids': missing")
                    h, _ = _hash_list(r["hash_ids"], T, fb, hash_count)
                    if scope == "local" and h and (min(h) < 0 or max(h) >= 2**_NS_SHIFT):
                        raise _Skip(f"field 'hash_ids': local ids must lie in [0, 2**{_NS_SHIFT}) to be namespaced")
                except _Skip as e:
                    raise _Skip(f"{lab}: {e}") from None
            except _Skip as e:
                if strict:
                    raise ProductionTraceError(f"{f}: {e}") from None
                skipped.append((f, str(e).split(":")[0], str(e)))
                continue
            if agent and not subagents:
                continue
            m = r.get("model")
            mi = models.setdefault(m if isinstance(m, str) else "", len(models))
            rows.append((t, T, O, h, mi, agent, k, rec, sub, scope == "local"))
            last = max(last, t)
        ends[k] = last
    if S is None:  # sequential: S_0 = 0, S_k = S_{k-1} + (last request time of k-1) + gap
        S = np.zeros(C, np.float64)
        if C > 1:
            S[1:] = np.cumsum(ends[:-1] + float(gap))
    n = len(rows)
    conv = np.fromiter((x[6] for x in rows), np.int64, count=n)
    rel = np.fromiter((x[0] for x in rows), np.float64, count=n)
    time = S[conv] + rel if n else np.zeros(0)
    H_l = [x[3] for x in rows]
    rec = np.fromiter((x[7] for x in rows), np.int64, count=n)
    hs = _flatten(H_l, lambda i: f"{files[conv[i]]}: requests[{int(rec[i])}]")
    counts = np.fromiter(map(len, H_l), np.int64, count=n)
    local = np.fromiter((x[9] for x in rows), bool, count=n)
    ns = np.repeat(np.where(local, conv << _NS_SHIFT, 0), counts)
    hs = hs | ns
    off = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=off[1:])
    order = np.argsort(time, kind="stable")
    hs, off = _csr_take(off, hs, order)
    sub = np.fromiter((x[8] for x in rows), np.int32, count=n)[order]
    rec = rec[order]
    conv = conv[order]

    def where(r: int) -> str:
        s = int(sub[r])
        return f"{files[conv[r]]}: requests[{int(rec[r])}]" + (f".requests[{s}]" if s >= 0 else "")

    hs, rechained = _apply_chain(off, hs, chain, where)
    S_meta = S.tolist()
    return ProductionTrace(
        time=time[order],
        prompt_tokens=np.fromiter((x[1] for x in rows), np.int64, count=n)[order],
        output_tokens=np.fromiter((x[2] for x in rows), np.int64, count=n)[order],
        hash_offsets=off,
        hashes=hs,
        block_size=int(b),
        session=conv,
        agent=np.fromiter((x[5] for x in rows), np.int32, count=n)[order],
        model=np.fromiter((x[4] for x in rows), np.int32, count=n)[order],
        models=tuple(models),
        file_index=conv.astype(np.int32),
        record=rec,
        sub_record=sub,
        files=tuple(files),
        format="weka",
        session_source="file",
        rechained=rechained,
        n_partial_dropped=0,
        skipped=tuple(skipped),
        meta={
            "arrival": "starts" if starts is not None else arrival,
            "rate": rate,
            "span": span,
            "seed": seed,
            "gap": gap,
            "starts": S_meta,
            "subagents": subagents,
            "hash_count": hash_count,
            "chain": chain,
        },
    )


def _starts(arrival, C, rate, span, seed, starts, gap) -> np.ndarray | None:
    if starts is not None:
        s = np.asarray(starts, dtype=np.float64)
        if s.shape != (C,) or not np.all(np.isfinite(s)) or (C and s.min() < 0):
            raise ProductionTraceError(f"starts: expected {C} finite offsets >= 0 (one per file), got shape {s.shape}")
        return s
    if arrival not in _ARRIVALS:
        raise ProductionTraceError(f"arrival: expected one of {_ARRIVALS} (or starts=), got {arrival!r}")
    if arrival == "sequential":
        if not _is_num(gap) or gap < 0:
            raise ProductionTraceError(f"gap: expected a finite number >= 0 (s), got {gap!r}")
        return None
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        if not _is_num(rate) or rate <= 0:
            raise ProductionTraceError(f"rate: arrival='poisson' needs a rate > 0 (conversations/s), got {rate!r}")
        s = np.zeros(C, np.float64)
        if C > 1:
            s[1:] = np.cumsum(rng.exponential(1.0 / rate, C - 1))
        return s
    if not _is_num(span) or span < 0:
        raise ProductionTraceError(f"span: arrival='uniform' needs a span >= 0 (s), got {span!r}")
    return rng.uniform(0.0, float(span), C)


# --------------------------------------------------------------------------------------------------
# dispatcher
# --------------------------------------------------------------------------------------------------


def read_production(path, format: str = "auto", **kwargs) -> ProductionTrace:
    """Read a production trace: ``format`` ``"mooncake"`` (JSONL), ``"weka"`` (directory, ``.json`` file or
    list of files) or ``"auto"`` (a directory, a list or a ``.json`` file → WEKA; ``.jsonl`` → Mooncake;
    otherwise the first non-blank character decides: a line-delimited object with ``hash_ids`` → Mooncake).
    ``kwargs`` go to :func:`read_mooncake` / :func:`read_weka`."""
    if format == "mooncake":
        return read_mooncake(path, **kwargs)
    if format == "weka":
        return read_weka(path, **kwargs)
    if format != "auto":
        raise ProductionTraceError(f"format: expected 'auto', 'mooncake' or 'weka', got {format!r}")
    if not isinstance(path, str | os.PathLike):
        return read_weka(path, **kwargs)
    pp = Path(path)
    if pp.is_dir() or pp.suffix == ".json":
        return read_weka(pp, **kwargs)
    if pp.suffix == ".jsonl":
        return read_mooncake(pp, **kwargs)
    try:
        with open(pp, encoding="utf-8") as fh:
            first = fh.readline()
    except OSError as e:
        raise ProductionTraceError(f"{pp}: cannot open: {e}") from e
    try:
        d = json.loads(first)
    except json.JSONDecodeError:
        return read_weka(pp, **kwargs)
    if isinstance(d, dict) and "hash_ids" in d:
        return read_mooncake(pp, **kwargs)
    return read_weka(pp, **kwargs)
