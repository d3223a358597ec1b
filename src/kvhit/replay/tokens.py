"""What a replay sends: a trace turned into token-id prompts, deterministically.

A kvhit trace is a set of conversations; a production trace (Mooncake, WEKA) is a list of requests named by
chained block ids. Neither holds text, so a replay invents token ids, and it does so as a pure function of
the trace and a seed (same inputs ⇒ same ids, in every process):

* **chat traces** (kvhit Parquet: generated, ShareGPT, …): conversation ``c`` turn ``j`` appends new user
  tokens ``user_{c,j}`` to the history; the history is what a chat client keeps — every earlier prompt and
  what the server *returned* for it — so the prompt is built at send time from the previous response
  (:func:`chat_prompt`). ``user_{c,j}`` has ``T_j − T_{j−1} − resp_{j−1}`` tokens when the trace has token
  counts (``cum_tokens``, ``response_tokens``; at least 1), else ``Z_j · tokens_per_block`` (block counts
  only: generated traces). Its ids depend on ``(seed, c, j, position)`` only. An optional shared system
  prompt of ``system_prompt_tokens`` ids (the same for every conversation) opens turn 1 of each conversation.
* **block-id traces**: block id ``x`` becomes ``tokens_per_block`` ids that depend on ``(seed, x, position)``
  only — the same block id gives the same tokens wherever it appears, so the trace's prefix sharing survives
  whatever block size the server uses (a server block that straddles two trace blocks is shared exactly when
  both are). The partial tail after the last full block gets ids unique to the request. With
  ``tokens_per_block`` below the trace's block size, every length is scaled by the same factor (a way to fit
  a 512-token-block trace into a small model's context).

Token ids lie in ``[TOKEN_LO, vocab)`` (low ids, which tokenizers use for special tokens, are avoided).
Output lengths are the trace's ``response_tokens`` (or ``output_tokens``) capped at ``max_output``, or
``output_tokens`` when the trace has none; requests are sent with ``ignore_eos`` so the server generates
exactly that many.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TOKEN_LO", "ReplayPlan", "block_token_ids", "chat_prompt", "plan_from_production", "plan_from_trace"]

#: lowest token id a replay sends
TOKEN_LO = 1000

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_USER = np.uint64(0x7573657200000000)  # domain separation: "user"
_SYS = np.uint64(0x7379730000000000)  # "sys"
_TAIL = np.uint64(0x7461696C00000000)  # "tail"


def _fmix(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(33)
        x *= _M1
        x ^= x >> np.uint64(33)
        x *= _M2
        x ^= x >> np.uint64(33)
    return x


def _ids(key: np.ndarray, n: int, seed: int, vocab: int) -> np.ndarray:
    """``n`` token ids for each key (shape ``(len(key), n)``): a function of ``(seed, key, position)`` only."""
    key = np.asarray(key, np.uint64).reshape(-1, 1)
    pos = np.arange(n, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        x = _fmix(_fmix(key ^ (np.uint64(seed) * _GOLD)) + pos * _GOLD)
    span = np.uint64(vocab - TOKEN_LO)
    return (x % span + np.uint64(TOKEN_LO)).astype(np.int64)


def block_token_ids(block_ids, tokens_per_block: int, *, seed: int = 0, vocab: int = 32000) -> np.ndarray:
    """The token ids of a sequence of block ids, concatenated (same block id ⇒ same tokens)."""
    b = np.asarray(block_ids).astype(np.uint64)
    if b.size == 0:
        return np.zeros(0, np.int64)
    return _ids(b, tokens_per_block, seed, vocab).reshape(-1)


@dataclass(frozen=True)
class ReplayPlan:
    """Everything a replay sends, request by request in trace (arrival) order.

    ``conv``/``turn``: conversation (dense id) and turn (1-based) — for block-id traces the trace's session (or
    the request index) and 1; ``time``: arrival (s, trace time); ``new_ids``: tokens this turn adds (chat: the
    user turn; block-id traces: the whole prompt); ``max_tokens``: output length asked for; ``chat``: whether a
    prompt is history + previous response + ``new_ids`` (kvhit traces) or ``new_ids`` alone (block-id traces);
    ``prev``: the request whose prompt and response open this one (-1: none).
    """

    conv: np.ndarray
    turn: np.ndarray
    time: np.ndarray
    new_ids: list[np.ndarray]
    max_tokens: np.ndarray
    chat: bool
    prev: np.ndarray
    source: str
    notes: tuple[str, ...] = ()
    asked: np.ndarray | None = None  #: output lengths before ``max_output`` (for the cap note)

    @property
    def n(self) -> int:
        return int(self.conv.shape[0])

    def head(self, n: int) -> ReplayPlan:
        """The first ``n`` requests (whole conversations are not kept together: later turns are dropped)."""
        n = min(int(n), self.n)
        return ReplayPlan(
            self.conv[:n],
            self.turn[:n],
            self.time[:n],
            self.new_ids[:n],
            self.max_tokens[:n],
            self.chat,
            self.prev[:n],
            self.source,
            self.notes,
            None if self.asked is None else self.asked[:n],
        )

    def capped(self) -> int:
        """Requests whose trace output length was capped (``max_output``)."""
        return 0 if self.asked is None else int((self.asked > self.max_tokens).sum())

    def prompt_bound(self) -> np.ndarray:
        """Prompt length of each request if every response is as long as asked (chat: history + outputs)."""
        T = np.zeros(self.n, np.int64)
        for r in range(self.n):
            p = int(self.prev[r])
            base = T[p] + int(self.max_tokens[p]) if (self.chat and p >= 0) else 0
            T[r] = base + self.new_ids[r].shape[0]
        return T


def chat_prompt(prev_prompt: np.ndarray | None, prev_output: np.ndarray | None, new_ids: np.ndarray) -> np.ndarray:
    """A chat client's next prompt: the previous prompt, what the server returned for it, the new user turn."""
    parts = [a for a in (prev_prompt, prev_output) if a is not None]
    return np.concatenate([*(np.asarray(a, np.int64) for a in parts), np.asarray(new_ids, np.int64)])


def _prev_in_conv(conv: np.ndarray) -> np.ndarray:
    """For each row (in arrival order), the previous row of the same conversation, or -1."""
    prev = np.full(conv.shape[0], -1, np.int64)
    last: dict[int, int] = {}
    for r, c in enumerate(conv.tolist()):
        prev[r] = last.get(c, -1)
        last[c] = r
    return prev


def plan_from_trace(
    trace,
    *,
    tokens_per_block: int,
    output_tokens: int,
    max_output: int | None = None,
    system_prompt_tokens: int = 0,
    seed: int = 0,
    vocab: int = 32000,
) -> ReplayPlan:
    """A chat replay of a kvhit trace (see the module docstring for how user turns and outputs are sized)."""
    order = np.lexsort((trace["turn"], trace["time"]))  # arrival order; a conversation's turns in turn order
    conv = np.asarray(trace["conv"], np.int64)[order]
    turn = np.asarray(trace["turn"], np.int64)[order]
    time = np.asarray(trace["time"], np.float64)[order]
    _, dense = np.unique(conv, return_inverse=True)
    dense = dense.astype(np.int64)
    prev = _prev_in_conv(dense)
    has_tokens = "cum_tokens" in trace.cols and "response_tokens" in trace.cols
    if "response_tokens" in trace.cols:
        asked = np.maximum(np.asarray(trace["response_tokens"], np.int64)[order], 1)
    else:
        asked = np.full(conv.shape[0], int(output_tokens), np.int64)
    out = asked if max_output is None else np.minimum(asked, max_output)
    if has_tokens:
        T = np.asarray(trace["cum_tokens"], np.int64)[order]
        resp = np.asarray(trace["response_tokens"], np.int64)[order]
        prevT = np.where(prev >= 0, T[np.maximum(prev, 0)] + resp[np.maximum(prev, 0)], 0)
        user = np.maximum(T - prevT, 1)
        source = "tokens"
    else:
        user = np.asarray(trace["Z"], np.int64)[order] * int(tokens_per_block)
        source = "blocks"
    sys_ids = _ids(np.array([_SYS]), int(system_prompt_tokens), seed, vocab)[0] if system_prompt_tokens else None
    new_ids = []
    with np.errstate(over="ignore"):
        keys = _USER ^ ((dense.astype(np.uint64) << np.uint64(20)) | turn.astype(np.uint64))
    for r in range(conv.shape[0]):
        ids = _ids(keys[r : r + 1], int(user[r]), seed, vocab)[0]
        if sys_ids is not None and prev[r] < 0:
            ids = np.concatenate([sys_ids, ids])
        new_ids.append(ids)
    return ReplayPlan(dense, turn, time, new_ids, out, True, prev, source, (), asked)


def plan_from_production(
    pt,
    *,
    tokens_per_block: int | None = None,
    output_tokens: int = 16,
    max_output: int | None = None,
    seed: int = 0,
    vocab: int = 32000,
) -> ReplayPlan:
    """A replay of a production block-id trace (Mooncake, WEKA): each request's prompt is its block ids' tokens
    and a unique partial tail (see the module docstring)."""
    b = int(pt.block_size)
    k = int(tokens_per_block or b)
    n = pt.n_requests
    T = np.asarray(pt.prompt_tokens, np.int64)
    off = np.asarray(pt.hash_offsets, np.int64)
    hs = np.asarray(pt.hashes).astype(np.uint64)
    new_ids = []
    for r in range(n):
        full = hs[off[r] : off[r + 1]]
        rem = int(T[r]) - full.size * b
        tail = max(int(round(rem * k / b)), 0 if full.size else 1)
        head = block_token_ids(full, k, seed=seed, vocab=vocab)
        with np.errstate(over="ignore"):
            tkey = np.array([_TAIL ^ np.uint64(r)], np.uint64)
        new_ids.append(np.concatenate([head, _ids(tkey, tail, seed, vocab)[0]]) if tail else head)
    outs = np.asarray(pt.output_tokens, np.int64) if pt.output_tokens is not None else None
    if outs is None or (outs <= 0).all():
        asked = np.full(n, int(output_tokens), np.int64)
    else:
        asked = np.maximum(outs, 1)
    out = asked if max_output is None else np.minimum(asked, max_output)
    notes = []
    if k != b:
        notes.append(f"trace blocks of {b} tokens replayed as {k} tokens each (lengths scaled by {k}/{b})")
    conv = np.arange(n, dtype=np.int64)
    return ReplayPlan(
        conv,
        np.ones(n, np.int64),
        np.asarray(pt.time, np.float64),
        new_ids,
        out,
        False,
        np.full(n, -1, np.int64),
        "block-ids",
        tuple(notes),
        asked,
    )
