"""Chat logs → kvhit traces with a model's own tokenizer and chat template (:func:`build_chat_trace`).

The steps, one module each: :mod:`kvhit.workload.chat_log` reads the log into requests (messages, tools,
timestamps, conversation ids), :mod:`kvhit.workload.chat_model` renders each request with the model directory's
chat template and tokenizes it, :mod:`kvhit.workload.chat_thread` finds the request each continues, and
:func:`trace_from_prompts` builds the trace.

Invariant. Request j of a trace conversation is the request whose prompt extends request j−1's prompt:
``new_tokens`` of turn j are the ids after the previous turn's prompt, so the turn-j prompt is the concatenation
of ``new_tokens`` of turns 1..j (the trace invariant of :mod:`kvhit.workload.trace`).

Time and conversations
----------------------
Timestamps (``timestamp``, ``created``, ``created_at``, ``time``, ``request_time``, ``arrival_time``: seconds,
milliseconds or microseconds since the epoch, told apart by magnitude, or ISO 8601) become arrival times,
relative to the first request. A request log without any timestamp is spaced ``spacing`` seconds apart in
file order; a log where only some lines carry one is refused. A conversation file without per-message
timestamps starts each conversation at its record's timestamp (when every record has one) or at Poisson(``lam0``)
arrivals, with exponential(``gap``) gaps between turns, from ``numpy.random.default_rng(seed)``.

Models. A log naming several models is refused unless ``model=`` selects one (the others are counted in the
report): one trace is one model's tokens.

Not modelled: multimodal content, ``continue_final_message``, ``documents`` (RAG) inputs, per-request
``chat_template_kwargs`` (e.g. ``enable_thinking``: the template's default is used), and the responses a
request log does not carry (a request log's trace has no ``response_tokens``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.workload.chat_log import ChatError, ChatLog, ChatRequest, read_chat_log
from kvhit.workload.chat_model import ChatModel, load_chat_model, render_prompt, tokenize_requests
from kvhit.workload.chat_thread import thread_requests

__all__ = ["ChatTraceReport", "build_chat_trace", "trace_from_prompts"]


@dataclass
class ChatTraceReport:
    """What :func:`build_chat_trace` read and made."""

    source: str
    shape: str
    formats: dict[str, int]
    model_dir: str
    tokenizer_fingerprint: str
    model: str | None
    n_requests: int
    n_other_models: dict[str, int]
    n_conversations: int
    threading: dict[str, int]
    prompt_tokens: int
    timestamps: str
    piece_memo: bool
    seconds: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _arrivals(log: ChatLog, reqs: list[ChatRequest], spacing: float, lam0: float, gap: float, seed: int) -> tuple:
    have = [r.time is not None for r in reqs]
    if all(have):
        t = np.array([r.time for r in reqs], np.float64)
        return t - t.min(), "log"
    if log.shape == "requests":
        if any(have):
            r = reqs[have.index(False)]
            raise ChatError(f"{log.path}:{r.line}: no timestamp, but other lines of the log carry one")
        return np.arange(len(reqs), dtype=np.float64) * float(spacing), f"file order, {spacing:g} s apart"
    # conversations: record timestamps (when every record has one) or Poisson conversation arrivals; exponential
    # gaps between turns
    rng = np.random.default_rng(seed)
    firsts = [i for i, r in enumerate(reqs) if i == 0 or r.conversation != reqs[i - 1].conversation]
    known = all(reqs[i].time is not None for i in firsts)
    t = np.zeros(len(reqs))
    start = 0.0
    for i, r in enumerate(reqs):
        if i == 0 or r.conversation != reqs[i - 1].conversation:
            if known:
                t[i] = float(r.time)  # type: ignore[arg-type]
            else:
                start += rng.exponential(1.0 / lam0)
                t[i] = start
        else:
            t[i] = t[i - 1] + rng.exponential(gap)
    if known:
        return t - t.min(), f"record timestamps, exponential gaps of mean {gap:g} s between turns, seed {seed}"
    return t, f"Poisson conversations at {lam0:g}/s, exponential gaps of mean {gap:g} s, seed {seed}"


def _render_all(model: ChatModel, log: ChatLog) -> list[str]:
    import jinja2

    texts = []
    for r in log.requests:
        try:
            texts.append(render_prompt(model, r.messages, r.tools))
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ChatError(f"{log.path}:{r.line}: the chat template of {model.path} fails to render ({msg})") from None
    return texts


def build_chat_trace(
    log_path: str | Path,
    model_dir: str | Path,
    *,
    block_size: int = 16,
    model: str | None = None,
    spacing: float = 1.0,
    lam0: float = 1.0,
    gap: float = 60.0,
    seed: int = 0,
    memo: bool = True,
):
    """Read a chat log, render and tokenize every request with the model directory, thread the requests and
    build the trace (token ids kept in ``new_tokens``). Returns ``(trace, report, ids, times)``: ``ids[r]`` the
    full prompt of trace row r and ``times`` its arrival (rows in trace order)."""
    import time as _t

    from kvhit.workload.blocks import BLOCK_RULE

    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ChatError(f"--block-size: expected a positive integer, got {block_size!r}")
    if not (spacing >= 0 and math.isfinite(spacing)):
        raise ChatError(f"--spacing: expected a finite number ≥ 0, got {spacing!r}")
    if not (lam0 > 0 and math.isfinite(lam0)) or not (gap >= 0 and math.isfinite(gap)):
        raise ChatError("--lam0 must be > 0 and --gap ≥ 0")
    secs: dict[str, float] = {}
    t0 = _t.perf_counter()
    cm = load_chat_model(model_dir)
    log = read_chat_log(log_path)
    secs["read"] = _t.perf_counter() - t0
    names: dict[str, int] = {}
    for r in log.requests:
        names[r.model or ""] = names.get(r.model or "", 0) + 1
    if model is None:
        named = sorted(k for k in names if k)
        if len(named) > 1:
            raise ChatError(
                f"{log.path}: requests for {len(named)} models ({', '.join(named[:4])}"
                f"{', …' if len(named) > 4 else ''}); choose one with --model (one trace is one model's tokens)"
            )
        keep = np.arange(len(log.requests))
        others: dict[str, int] = {}
    else:
        keep = np.array([i for i, r in enumerate(log.requests) if r.model == model], np.int64)
        others = {k or "(none)": v for k, v in names.items() if k != model}
        if not keep.size:
            raise ChatError(f"{log.path}: no request for model {model!r} (models: {', '.join(sorted(names))})")
    # arrivals from the whole log (a filtered request keeps its place on the log's time axis)
    times, tsource = _arrivals(log, log.requests, spacing, lam0, gap, seed)
    reqs = [log.requests[i] for i in keep]
    times = times[keep] - times[keep].min()
    order = np.argsort(times, kind="stable")
    reqs = [reqs[i] for i in order]
    times = times[order]
    t1 = _t.perf_counter()
    sub = ChatLog(log.path, log.shape, reqs, log.formats)
    texts = _render_all(cm, sub)
    secs["render"] = _t.perf_counter() - t1
    t1 = _t.perf_counter()
    ids, used_memo = tokenize_requests(cm, texts, memo=memo)
    del texts
    secs["tokenize"] = _t.perf_counter() - t1
    for r, q in zip(reqs, ids, strict=True):
        if q.size == 0:
            raise ChatError(f"{log.path}:{r.line}: the rendered prompt has no tokens")
    t1 = _t.perf_counter()
    th = thread_requests(ids, [r.conversation for r in reqs])
    n = len(reqs)
    counts: dict[str, int] = {}
    for x in th.reason:
        counts[x] = counts.get(x, 0) + 1
    secs["thread"] = _t.perf_counter() - t1
    meta = {
        "source": f"chat:{log.path}",
        "block_size": int(block_size),
        "block_rule": BLOCK_RULE,
        "tokenizer": f"{cm.path} (tokenizer.json, {cm.fingerprint})",
        "template": "chat_template of the model directory (apply_chat_template rendering, add_generation_prompt)",
        "model": model or next((k for k in names if k), None),
        "timestamps": tsource,
        "threading": counts,
    }
    tr, perm = trace_from_prompts(ids, times, th.parent, block_size, meta, where=log.path)
    full = [ids[i] for i in perm]
    C = tr.n_conversations
    rep = ChatTraceReport(
        source=log.path,
        shape=log.shape,
        formats=log.formats,
        model_dir=cm.path,
        tokenizer_fingerprint=cm.fingerprint,
        model=meta["model"],
        n_requests=n,
        n_other_models=others,
        n_conversations=C,
        threading=counts,
        prompt_tokens=int(sum(q.size for q in ids)),
        timestamps=tsource,
        piece_memo=used_memo,
        seconds=secs,
    )
    return tr, rep, full, times[perm]


def trace_from_prompts(
    ids: list[np.ndarray], times: np.ndarray, parent: np.ndarray, block_size: int, meta: dict, where: str = "trace"
):
    """The kvhit trace of requests given in arrival order with their full prompts ``ids`` and the request each
    continues (``parent``, −1 for a conversation's first turn; a parent's prompt must be a proper prefix).
    Returns ``(trace, perm)``: trace row i is request ``perm[i]``."""
    from kvhit.workload.blocks import block_accounting
    from kvhit.workload.trace import Trace

    n = len(ids)
    parent = np.asarray(parent, np.int64)
    times = np.asarray(times, np.float64)
    conv = np.full(n, -1, np.int64)
    turn = np.zeros(n, np.int64)
    C = 0
    for r in range(n):
        p = parent[r]
        if p < 0:
            conv[r], turn[r] = C, 1
            C += 1
        else:
            conv[r], turn[r] = conv[p], turn[p] + 1
    M = np.bincount(conv, minlength=C)[conv]
    plen = np.array([q.size for q in ids], np.int64)
    prev_len = np.where(parent >= 0, plen[np.maximum(parent, 0)], 0)
    new_tokens = [q[int(k) :] for q, k in zip(ids, prev_len, strict=True)]
    cm_order = np.lexsort((turn, conv))
    Mc = np.bincount(conv, minlength=C)
    acc = block_accounting(Mc, (plen - prev_len)[cm_order], np.zeros(n, np.int64), block_size)
    inv = np.empty(n, np.int64)
    inv[cm_order] = np.arange(n)
    conv_arrival = np.zeros(C)
    conv_arrival[conv[turn == 1]] = times[turn == 1]
    cols = {
        "conv": conv,
        "conv_arrival": conv_arrival[conv],
        "turn": turn,
        "time": times,
        "M": M,
        "Z": acc["Z"][inv],
        "R": acc["R"][inv],
        "prompt_tokens": plen - prev_len,
        "cum_tokens": plen,
        "R_full": plen // block_size,
        "R_phys": -(-plen // block_size),
    }
    tr = Trace.from_columns(cols, dict(meta, block_size=int(block_size)), {"new_tokens": new_tokens}, where=where)
    return tr, np.lexsort((turn, conv, times))
