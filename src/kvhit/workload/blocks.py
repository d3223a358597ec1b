"""Block accounting: per-turn token counts (p_j, r_j) → KV block increments Z_j and history sizes R_j.

For one conversation with prompt tokens p_j (chat template included) and response tokens r_j, j = 1..M, the
turn-j prompt holds

    T_j = Σ_{l<j} (p_l + r_l) + p_j          (T_0 := 0, r_0 := 0)

tokens: the whole history plus the new prompt (the prefix property of :mod:`kvhit.workload.tokenize`). With
block size b (128 in App. E) two accountings are stored in a trace:

(a) The paper's rule (App. E, Fig. 2 caption; the practical MCM of App. C.2) — columns ``Z`` and ``R``::

        Z_j = ⌈(tail_{j−1} + r_{j−1} + p_j) / b⌉,      R_j = Z_1 + … + Z_j      (eq. (4))

    where tail_{j−1} = T_{j−1} mod b is the number of tokens in the partially filled last block of the
    turn-(j−1) prompt (tail_0 = 0). Those tokens sit in an unhashable block, so at turn j they cannot be
    reused and are prefilled again, together with the turn-(j−1) response and the turn-j prompt, starting at
    the block boundary b·⌊T_{j−1}/b⌋. When T_{j−1} is an exact multiple of b the last block of the turn-(j−1)
    prompt is full (hashable), the tail is 0 and nothing is prefilled twice. Equivalently::

        Z_j = ⌈T_j / b⌉ − ⌊T_{j−1} / b⌋,
        R_j = ⌈T_j / b⌉ + #{l < j : T_l mod b ≠ 0},

    i.e. R_j counts the physical blocks of the current prompt plus one stale unhashable tail block per earlier
    turn whose prompt ended mid-block (the paper conservatively assumes one per completed turn: R_j − 1
    hashable history blocks at a revisit, eq. (28)). The tail of this rule's own block layout is the same
    number: the turn-(j−1) increment starts at a block boundary and ends at token T_{j−1}. Z_j ≥ 1 always
    (p_j ≥ 1).

(b) Exact token accounting — columns ``cum_tokens`` (T_j), ``R_full`` = ⌊T_j / b⌋ (full, hashable blocks of
    the turn-j prompt: what a prefix cache can reuse at turn j+1) and ``R_phys`` = ⌈T_j / b⌉ (physical blocks
    the turn-j prompt occupies).

Optional token ids: ``new_tokens`` of turn j = ids T_{j−1}..T_j = response_{j−1} ids + prompt_j ids (their
concatenation over 1..j is the turn-j prompt), ``response_ids`` = response_j ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["BLOCK_RULE", "BlockError", "block_accounting", "block_accounting_reference", "turn_index"]

BLOCK_RULE = "paper-tail: Z_j = ceil((T_{j-1} mod b + r_{j-1} + p_j)/b) = ceil(T_j/b) - floor(T_{j-1}/b)"


class BlockError(ValueError):
    """Invalid input to block accounting; the message names the field."""


def turn_index(M: np.ndarray) -> np.ndarray:
    """1-based turn index of every row of the flattened (conversation-major) layout with turn counts ``M``."""
    M = np.asarray(M, dtype=np.int64)
    starts = np.cumsum(M) - M
    return np.arange(int(M.sum()), dtype=np.int64) - np.repeat(starts, M) + 1


def block_accounting(
    M: Sequence[int] | np.ndarray,
    prompt_tokens: Sequence[int] | np.ndarray,
    response_tokens: Sequence[int] | np.ndarray,
    block_size: int = 128,
) -> dict[str, np.ndarray]:
    """Rule (a) and rule (b) of the module docstring for many conversations at once (vectorized).

    Args:
        M: turn counts M_i (≥ 1).
        prompt_tokens, response_tokens: p_j and r_j flattened conversation-major (length Σ M_i).
        block_size: b.

    Returns columns (all int64, length Σ M_i): ``Z``, ``R`` (rule (a)), ``cum_tokens`` (T_j), ``R_full``,
    ``R_phys`` (rule (b)), ``tail_prev`` (tail_{j−1}), ``prompt_tokens``, ``response_tokens``.
    """
    b = int(block_size)
    if b < 1 or b != block_size:
        raise BlockError(f"block_size must be an integer ≥ 1, got {block_size!r}")
    M = np.asarray(M, dtype=np.int64)
    p = np.asarray(prompt_tokens, dtype=np.int64)
    r = np.asarray(response_tokens, dtype=np.int64)
    n = int(M.sum())
    if (M < 1).any():
        raise BlockError("M: every conversation needs at least one turn")
    if p.shape != (n,) or r.shape != (n,):
        raise BlockError(f"prompt_tokens/response_tokens: expected {n} entries (Σ M), got {p.size}/{r.size}")
    if (p < 1).any():
        raise BlockError(f"prompt_tokens: every prompt needs ≥ 1 token (row {int(np.argmax(p < 1))})")
    if (r < 0).any():
        raise BlockError(f"response_tokens: negative count (row {int(np.argmax(r < 0))})")
    starts = np.cumsum(M) - M
    first = np.zeros(n, dtype=bool)
    first[starts] = True
    # T_j = Σ_{l≤j}(p_l + r_l) − r_j within each conversation
    cs = np.cumsum(p + r)
    base = np.repeat(cs[starts] - (p + r)[starts], M)
    T = cs - base - r
    T_prev = np.where(first, 0, np.concatenate([[0], T[:-1]]))
    Z = -(-T // b) - T_prev // b
    cZ = np.cumsum(Z)
    R = cZ - np.repeat(cZ[starts] - Z[starts], M)
    return {
        "Z": Z,
        "R": R,
        "cum_tokens": T,
        "R_full": T // b,
        "R_phys": -(-T // b),
        "tail_prev": T_prev % b,
        "prompt_tokens": p,
        "response_tokens": r,
    }


def block_accounting_reference(p: Sequence[int], r: Sequence[int], block_size: int = 128) -> dict[str, list[int]]:
    """Slow, literal reference for ONE conversation (tests): walks the turns with an explicit tail counter."""
    b = int(block_size)
    tail, resp_prev, T = 0, 0, 0
    out: dict[str, list[int]] = {"Z": [], "R": [], "cum_tokens": [], "R_full": [], "R_phys": []}
    R = 0
    for pj, rj in zip(p, r, strict=True):
        new = tail + resp_prev + pj
        Zj = (new + b - 1) // b
        R += Zj
        T += resp_prev + pj
        out["Z"].append(Zj)
        out["R"].append(R)
        out["cum_tokens"].append(T)
        out["R_full"].append(T // b)
        out["R_phys"].append((T + b - 1) // b)
        tail = new % b  # tokens in the partial last block of the increment, which starts at a block boundary
        resp_prev = rj
    return out
