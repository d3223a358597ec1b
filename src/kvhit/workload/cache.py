"""Tokenize every recovered conversation of a ShareGPT source on all cores, cached as Parquet.

:func:`tokenize_conversations` runs the chat template + tokenizer of :mod:`kvhit.workload.tokenize` over a
list of conversations with a ``multiprocessing`` pool (chunks of conversations, one tokenizer per worker).
:func:`load_tokenized` adds a Parquet cache of the result for ALL recovered conversations of a file, so that
sampling, block accounting (any block size) and timing afterwards cost milliseconds.

Cache location: the ``cache_dir`` argument, else ``$KVHIT_CACHE_DIR``, else ``~/.cache/kvhit``; files
``<dir>/sharegpt/tok-<key>.parquet``. The key hashes

* the input file's identity: size, mtime (ns) and SHA-256 of its first and last MiB (path-independent),
* the tokenizer's ``name`` (for Qwen3: a digest of the rank file), the template id,
* whether token ids are stored, ``strict``, and :data:`CACHE_VERSION` (bumped whenever this code's output
changes).

The block size is NOT part of the key: the cache holds token counts, from which blocks of any size are
computed (:mod:`kvhit.workload.blocks`). Writes are atomic (temporary file + ``os.replace``); an unreadable
cache file is ignored and rewritten.

Parquet layout: one row per turn — ``conv`` (int32, index into the kept conversations), ``turn`` (int32),
``prompt_tokens``, ``response_tokens`` (int32) and, with ids, ``prompt_ids``/``response_ids``
(``large_list<int32>``); conversation ids, record indices, the :class:`~kvhit.workload.sharegpt.ReadReport`
and the tokenizer/template ids are JSON in the schema metadata under ``kvhit``.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.workload.sharegpt import Conversation, load_sharegpt
from kvhit.workload.tokenize import QWEN3_TEMPLATE, ChatTemplate, Tokenizer, _encoder, boundary_merges, get_tokenizer
from kvhit.workload.trace import _META_KEY, list_column, write_table_atomic

__all__ = [
    "CACHE_VERSION",
    "CacheError",
    "TokenizedCorpus",
    "resolve_cache_dir",
    "file_identity",
    "load_tokenized",
    "tokenize_conversations",
]

CACHE_VERSION = 1

Progress = Callable[[int, int], None]


class CacheError(ValueError):
    """A bad cache directory or cache request."""


@dataclass
class TokenizedCorpus:
    """Per-turn token counts of conversations (flattened conversation-major).

    ``M[i]`` turns of conversation i; its rows are ``offsets[i]:offsets[i+1]`` of ``prompt_tokens`` (p_j) and
    ``response_tokens`` (r_j); ``prompt_ids``/``response_ids`` per row when kept.
    """

    ids: list[str]
    records: np.ndarray
    M: np.ndarray
    prompt_tokens: np.ndarray
    response_tokens: np.ndarray
    prompt_ids: list[np.ndarray] | None = None
    response_ids: list[np.ndarray] | None = None
    tokenizer: str = ""
    template: str = ""
    boundary_merges: int = 0
    read_report: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)  # path, hit, seconds

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.M)]).astype(np.int64)

    @property
    def n_conversations(self) -> int:
        return int(self.M.size)


# ------------------------------------------------------------------------------------------------------------
# Parallel tokenization
# ------------------------------------------------------------------------------------------------------------

_W: dict[str, Any] = {}


def _init_worker(tok_bytes: bytes, template: ChatTemplate, keep_ids: bool) -> None:
    _W["tok"] = pickle.loads(tok_bytes)
    _W["tpl"] = template
    _W["keep"] = keep_ids


def _work(chunk: list[tuple[str | None, tuple[tuple[str, str], ...]]]):
    return _tokenize_chunk(chunk, _W["tok"], _W["tpl"], _W["keep"])


def _tokenize_chunk(chunk, tok: Tokenizer, tpl: ChatTemplate, keep_ids: bool):
    enc = _encoder(tok, tpl)
    ps, rs, pids, rids = [], [], [], []
    merges = 0
    for system, turns in chunk:
        tt = enc.conversation(system, turns, keep_ids)
        ps.append(tt.prompt)
        rs.append(tt.response)
        if keep_ids:
            pids.extend(tt.prompt_ids)
            rids.extend(tt.response_ids)
        merges += boundary_merges(turns, tok, tpl)
    p = np.concatenate(ps) if ps else np.zeros(0, np.int64)
    r = np.concatenate(rs) if rs else np.zeros(0, np.int64)
    return p, r, (pids if keep_ids else None), (rids if keep_ids else None), merges


def _n_processes(processes: int | None) -> int:
    if processes is not None:
        return max(1, int(processes))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def tokenize_conversations(
    conversations: Sequence[Conversation],
    tokenizer: Tokenizer | str | Callable | None = None,
    *,
    template: ChatTemplate = QWEN3_TEMPLATE,
    keep_ids: bool = False,
    processes: int | None = None,
    chunk_size: int = 256,
    progress: Progress | None = None,
) -> TokenizedCorpus:
    """Per-turn prompt/response token counts (and ids) of ``conversations`` using every core.

    Runs in-process when ``processes == 1``, when there are few conversations, or when the tokenizer cannot be
    pickled (e.g. a lambda); otherwise a ``multiprocessing`` pool (fork where available) over chunks of
    ``chunk_size`` conversations. ``progress(done, total)`` is called with conversation counts.
    """
    tok = get_tokenizer(tokenizer)
    items = [(c.system, c.turns) for c in conversations]
    total = len(items)
    chunks = [items[i : i + chunk_size] for i in range(0, total, chunk_size)]
    nproc = min(_n_processes(processes), max(1, len(chunks)))
    try:
        tok_bytes = pickle.dumps(tok)
    except Exception:  # noqa: BLE001 - unpicklable user callable: stay in-process
        tok_bytes = None
    results = []
    done = 0
    if progress is not None:
        progress(0, total)
    if nproc <= 1 or tok_bytes is None or total < 2 * chunk_size:
        for ch in chunks:
            results.append(_tokenize_chunk(ch, tok, template, keep_ids))
            done += len(ch)
            if progress is not None:
                progress(done, total)
    else:
        if isinstance(tok, Tokenizer) and hasattr(tok, "encoding"):
            tok.encoding  # noqa: B018 - build once in the parent: forked workers inherit it
        method = "fork" if "fork" in mp.get_all_start_methods() else None
        ctx = mp.get_context(method)
        with ctx.Pool(nproc, initializer=_init_worker, initargs=(tok_bytes, template, keep_ids)) as pool:
            for ch, res in zip(chunks, pool.imap(_work, chunks), strict=True):
                results.append(res)
                done += len(ch)
                if progress is not None:
                    progress(done, total)
    M = np.array([len(t) for _, t in items], dtype=np.int64)
    p = np.concatenate([x[0] for x in results]) if results else np.zeros(0, np.int64)
    r = np.concatenate([x[1] for x in results]) if results else np.zeros(0, np.int64)
    pids = rids = None
    if keep_ids:
        pids = [a for x in results for a in x[2]]
        rids = [a for x in results for a in x[3]]
    return TokenizedCorpus(
        ids=[c.id for c in conversations],
        records=np.array([c.record for c in conversations], dtype=np.int64),
        M=M,
        prompt_tokens=p.astype(np.int64),
        response_tokens=r.astype(np.int64),
        prompt_ids=pids,
        response_ids=rids,
        tokenizer=tok.name,
        template=template.id,
        boundary_merges=int(sum(x[4] for x in results)),
    )


# ------------------------------------------------------------------------------------------------------------
# Cache
# ------------------------------------------------------------------------------------------------------------


def resolve_cache_dir(path: str | Path | None = None) -> Path:
    """The cache directory: ``path``, else ``$KVHIT_CACHE_DIR``, else ``~/.cache/kvhit``."""
    if path is None:
        path = os.environ.get("KVHIT_CACHE_DIR") or Path.home() / ".cache" / "kvhit"
    return Path(path).expanduser()


def file_identity(path: str | Path, sample: int = 1 << 20) -> dict[str, Any]:
    """Size, mtime (ns) and SHA-256 of the first and last ``sample`` bytes of a file."""
    path = Path(path)
    st = path.stat()
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(sample)).hexdigest()
        f.seek(max(0, st.st_size - sample))
        tail = hashlib.sha256(f.read(sample)).hexdigest()
    return {"size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns), "head": head, "tail": tail}


def _cache_key(ident: dict, tok: Tokenizer, template: ChatTemplate, keep_ids: bool, strict: bool) -> str:
    blob = json.dumps(
        {
            "file": ident,
            "tokenizer": tok.name,
            "template": template.id,
            "ids": bool(keep_ids),
            "strict": bool(strict),
            "version": CACHE_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _write_cache(path: Path, corpus: TokenizedCorpus, meta: dict[str, Any]) -> None:
    import pyarrow as pa

    M = corpus.M
    n = int(M.sum())
    conv = np.repeat(np.arange(M.size, dtype=np.int32), M)
    turn = (np.arange(n) - np.repeat(np.cumsum(M) - M, M) + 1).astype(np.int32)
    arrays = {
        "conv": pa.array(conv),
        "turn": pa.array(turn),
        "prompt_tokens": pa.array(corpus.prompt_tokens.astype(np.int32)),
        "response_tokens": pa.array(corpus.response_tokens.astype(np.int32)),
    }
    for name, seq in (("prompt_ids", corpus.prompt_ids), ("response_ids", corpus.response_ids)):
        if seq is not None:
            arrays[name] = list_column(seq)
    write_table_atomic(pa.table(arrays), path, meta)


def _read_cache(path: Path, keep_ids: bool) -> TokenizedCorpus | None:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        meta = json.loads(table.schema.metadata[_META_KEY])
        if meta.get("version") != CACHE_VERSION:
            return None
        M = np.asarray(meta["M"], dtype=np.int64)
        p = table.column("prompt_tokens").to_numpy().astype(np.int64)
        r = table.column("response_tokens").to_numpy().astype(np.int64)
        if p.size != int(M.sum()) or r.size != p.size or len(meta["ids"]) != M.size:
            return None
        pids = rids = None
        if keep_ids:
            lists = []
            for name in ("prompt_ids", "response_ids"):
                col = table.column(name).combine_chunks()
                offs = col.offsets.to_numpy()
                flat = col.values.to_numpy()
                lists.append([flat[offs[i] : offs[i + 1]] for i in range(len(offs) - 1)])
            pids, rids = lists
    except Exception:  # noqa: BLE001 - any unreadable/corrupt cache file is simply recomputed
        return None
    return TokenizedCorpus(
        ids=list(meta["ids"]),
        records=np.asarray(meta["records"], dtype=np.int64),
        M=M,
        prompt_tokens=p,
        response_tokens=r,
        prompt_ids=pids,
        response_ids=rids,
        tokenizer=meta["tokenizer"],
        template=meta["template"],
        boundary_merges=int(meta.get("boundary_merges", 0)),
        read_report=meta["read_report"],
    )


def load_tokenized(
    path: str | Path | None = None,
    *,
    tokenizer: Tokenizer | str | Callable | None = None,
    template: ChatTemplate = QWEN3_TEMPLATE,
    keep_ids: bool = False,
    strict: bool = False,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    processes: int | None = None,
    progress: Progress | None = None,
) -> TokenizedCorpus:
    """Read a ShareGPT source (default: the bundled file), tokenize ALL kept conversations and cache the
    result.

    A cache hit skips reading and tokenizing. ``corpus.cache`` records the cache file, whether it was a
    hit and the seconds spent; ``corpus.read_report`` is the
    :class:`~kvhit.workload.sharegpt.ReadReport` as a dict.
    """
    from kvhit.workload.sharegpt import default_path

    t0 = time.perf_counter()
    src = default_path() if path is None else Path(path)
    if not src.is_file():
        raise CacheError(f"{src}: no such file")
    tok = get_tokenizer(tokenizer)
    cpath: Path | None = None
    if use_cache:
        d = resolve_cache_dir(cache_dir)
        key = _cache_key(file_identity(src), tok, template, keep_ids, strict)
        cpath = d / "sharegpt" / f"tok-{key}.parquet"
        if cpath.is_file():
            hit = _read_cache(cpath, keep_ids)
            if hit is not None:
                hit.cache = {"path": str(cpath), "hit": True, "seconds": time.perf_counter() - t0}
                return hit
    convs, rep = load_sharegpt(src, strict=strict)
    corpus = tokenize_conversations(
        convs, tok, template=template, keep_ids=keep_ids, processes=processes, progress=progress
    )
    corpus.read_report = rep.to_dict()
    if cpath is not None:
        meta = {
            "version": CACHE_VERSION,
            "source": str(src),
            "ids": corpus.ids,
            "records": corpus.records.tolist(),
            "M": corpus.M.tolist(),
            "tokenizer": corpus.tokenizer,
            "template": corpus.template,
            "boundary_merges": corpus.boundary_merges,
            "read_report": corpus.read_report,
        }
        try:
            _write_cache(cpath, corpus, meta)
        except OSError as e:
            raise CacheError(
                f"{cpath}: cannot write the token cache ({e}); pass use_cache=False or another cache_dir"
            ) from None
    corpus.cache = {"path": str(cpath) if cpath else None, "hit": False, "seconds": time.perf_counter() - t0}
    return corpus
