"""Trace generator: a :class:`~kvhit.workload.spec.WorkloadSpec` + a seed → a :class:`~kvhit.workload.trace.Trace`.

Conversations arrive as a Poisson process of rate λ0 (§2). Conversation i draws its turn count M_i, its
increments Z_{i,1..M_i} and M_i − 1 interarrival gaps W ~ F; turn j is submitted at
arrival_i + W_{i,1} + … + W_{i,j−1}. All draws come from one ``numpy.random.Generator`` seeded with ``seed``, in a
fixed order, so a (spec, seed, size) triple reproduces the trace bit for bit.
"""

from __future__ import annotations

import numpy as np

from kvhit.workload.dists import SpecError
from kvhit.workload.spec import EmpiricalConversations, PromptResponse, WorkloadSpec, _ragged_turn_index
from kvhit.workload.trace import Trace

__all__ = ["generate", "trace_from_conversations"]


def generate(
    spec: WorkloadSpec,
    seed: int,
    *,
    n_conversations: int | None = None,
    horizon: float | None = None,
    start: float = 0.0,
    max_turns: int | None = None,
) -> Trace:
    """Generate a trace of ``n_conversations`` conversations, or of all conversations arriving in
    ``[start, start + horizon)``. Every turn of every generated conversation is included (the measurement
    window, not the generator, decides what is counted).

    Args:
        spec: the workload model.
        seed: seed of the random generator (required: results are reproducible bit for bit).
        n_conversations: number of conversations (exclusive with ``horizon``).
        horizon: length of the arrival period in seconds.
        start: time of the arrival process origin.
        max_turns: optional cap on M (draws above it are truncated), useful for heavy-tailed pmfs.
    """
    if (n_conversations is None) == (horizon is None):
        raise SpecError("give exactly one of n_conversations or horizon")
    rng = np.random.default_rng(seed)
    lam0 = float(spec.lam0)
    if n_conversations is not None:
        n = int(n_conversations)
        if n < 1:
            raise SpecError(f"n_conversations must be ≥ 1, got {n_conversations!r}")
        arrivals = start + np.cumsum(rng.exponential(1.0 / lam0, size=n))
    else:
        if not horizon or horizon <= 0:
            raise SpecError(f"horizon must be > 0 seconds, got {horizon!r}")
        n = int(rng.poisson(lam0 * horizon))
        arrivals = start + np.sort(rng.uniform(0.0, horizon, size=n))
        if n == 0:
            raise SpecError("no conversation arrived within the horizon; lengthen it")

    inc = spec.increments
    if isinstance(inc, EmpiricalConversations):
        M, Z = inc.draw(rng, n)
    else:
        M = spec.M.sample(rng, n).astype(np.int64)
        if max_turns is not None:
            M = np.minimum(M, int(max_turns))
        if isinstance(inc, PromptResponse):
            X, Y = inc.sample_xy(rng, M)
            Z = inc.z_from_xy(X, Y, M)
        else:
            Z = inc.sample(rng, M)
    if (M < 1).any():
        raise SpecError("turn distribution produced M < 1")
    if (Z < 1).any():
        raise SpecError("increment distribution produced Z_j < 1")

    cols = _timed_columns(rng, M, Z, arrivals, spec.interarrival)
    meta = {
        "source": "synthetic",
        "seed": int(seed),
        "lam0": lam0,
        "spec": spec.to_dict()
        if not isinstance(inc, EmpiricalConversations)
        else {"lam0": lam0, "increments": "empirical"},
        "n_conversations": n,
    }
    return Trace.from_columns(cols, meta, where="generated trace")


def _timed_columns(rng, M, Z, arrivals, interarrival) -> dict[str, np.ndarray]:
    """Rows for conversations with turn counts ``M``, flattened increments ``Z`` and arrival times: draws one
    interarrival gap per non-first turn from ``interarrival`` (in row order)."""
    M = np.asarray(M, dtype=np.int64)
    Z = np.asarray(Z, dtype=np.int64)
    total = int(M.sum())
    if Z.shape != (total,):
        raise SpecError(f"Z has {Z.size} entries, expected sum(M) = {total}")
    conv = np.repeat(np.arange(M.size, dtype=np.int64), M)
    turn = _ragged_turn_index(M)
    W = interarrival.sample(rng, total)  # one gap per row; the gap before turn 1 is discarded
    if (W < 0).any() or not np.isfinite(W).all():
        raise SpecError("interarrival distribution produced a negative or non-finite gap")
    W = np.where(turn == 1, 0.0, W)
    conv_start = np.cumsum(M) - M
    cumW = np.cumsum(W)
    offset = cumW - np.repeat(cumW[conv_start], M)
    arrival_rows = np.repeat(np.asarray(arrivals, dtype=float), M)
    cumZ = np.cumsum(Z)
    R = cumZ - np.repeat(cumZ[conv_start] - Z[conv_start], M)
    return {
        "conv": conv,
        "conv_arrival": arrival_rows,
        "turn": turn.astype(np.int32),
        "time": arrival_rows + offset,
        "M": np.repeat(M, M).astype(np.int32),
        "Z": Z,
        "R": R.astype(np.int64),
    }


def trace_from_conversations(
    M,
    Z,
    *,
    lam0: float,
    interarrival,
    seed: int,
    extra: dict[str, np.ndarray] | None = None,
    lists: dict[str, list] | None = None,
    meta: dict | None = None,
    start: float = 0.0,
) -> Trace:
    """Put given conversations on a time axis: Poisson(λ0) arrivals in the given order, then W ~ ``interarrival``
    between consecutive turns. ``M`` are turn counts, ``Z`` the flattened increments (conversation-major, turn
    order), ``extra``/``lists`` more per-row columns in the same row order (e.g. token counts, token ids).
    Reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    M = np.asarray(M, dtype=np.int64)
    if M.size == 0 or (M < 1).any():
        raise SpecError("every conversation needs at least one turn")
    lam0 = float(lam0)
    if not np.isfinite(lam0) or lam0 <= 0:
        raise SpecError(f"lam0 must be > 0, got {lam0!r}")
    arrivals = start + np.cumsum(rng.exponential(1.0 / lam0, size=M.size))
    cols = _timed_columns(rng, M, Z, arrivals, interarrival)
    cols.update(extra or {})
    m = {
        "seed": int(seed),
        "lam0": lam0,
        "interarrival": interarrival.to_dict() if not hasattr(interarrival, "samples") else interarrival.describe(),
        "n_conversations": int(M.size),
    }
    m.update(meta or {})
    return Trace.from_columns(cols, m, lists, where="trace")
