"""The multi-turn conversation model (MCM) as a specification (paper §2, App. B.2).

A :class:`WorkloadSpec` is: Poisson conversation arrivals at rate ``lam0`` (λ0, conversations per second); a turn
count ``M`` (:class:`~kvhit.workload.dists.IntDist`); per-turn block increments ``Z_j ≥ 1`` (an
:class:`Increments` model); and the prompt interarrival distribution ``W ~ F``
(:class:`~kvhit.workload.dists.Interarrival`). The history after the turn-j prompt is R_j = Z_1 + … + Z_j (eq. (4)).

Increment models:

* :class:`IIDIncrements` — Z_j i.i.d. across turns;
* :class:`TurnDependent` — Z_j ~ G_j independent, the last G repeating for later turns;
* :class:`PromptResponse` — prompt blocks X_j and response blocks Y_j with Z_1 = X_1, Z_j = Y_{j−1} + X_j
  (App. B.2), X and Y each i.i.d. across turns;
* :class:`EmpiricalConversations` — whole per-conversation sequences (Z_1, …, Z_M) resampled from a set, so any
  dependence across turns (and between M and the Z's) is kept. The turn count then comes from the sequences.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.workload.dists import (
    Exponential,
    FinitePMF,
    Geometric,
    IntDist,
    Interarrival,
    SpecError,
    check_keys,
    int_dist_from_dict,
    interarrival_from_dict,
    num,
)

__all__ = [
    "Increments",
    "IIDIncrements",
    "TurnDependent",
    "PromptResponse",
    "EmpiricalConversations",
    "WorkloadSpec",
    "increments_from_dict",
]


class Increments:
    """Per-turn block increments Z_j ≥ 1 (Assumption B.2).

    ``mean_Z(j)`` gives E[Z_j] for turn indices ``j ≥ 1`` (a numpy array); ``stationary_from`` is a turn index J0
    such that E[Z_j] = ``mean_Z_tail`` for every j ≥ J0 (the theory uses it to sum infinite series in closed form).
    ``sample(rng, M)`` draws, for conversations with turn counts ``M``, the flattened Z sequence.
    """

    joint: bool = False  #: True when M is drawn jointly with the Z's (then the spec's turn distribution is unused)
    stationary_from: int = 1
    mean_Z_tail: float = math.nan

    def mean_Z(self, j: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, M: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError


def _ragged_turn_index(M: np.ndarray) -> np.ndarray:
    """Turn indices 1..M_i for every conversation, flattened."""
    M = np.asarray(M, dtype=np.int64)
    total = int(M.sum())
    starts = np.repeat(np.cumsum(M) - M, M)
    return np.arange(total, dtype=np.int64) - starts + 1


@dataclass(frozen=True)
class IIDIncrements(Increments):
    """Z_j i.i.d. ~ ``z`` for every turn."""

    z: IntDist

    @property
    def stationary_from(self) -> int:  # type: ignore[override]
        return 1

    @property
    def mean_Z_tail(self) -> float:  # type: ignore[override]
        return self.z.mean

    def mean_Z(self, j):
        return np.full(np.shape(j), self.z.mean)

    def sample(self, rng, M):
        return self.z.sample(rng, int(np.sum(M)))

    def to_dict(self):
        return {"kind": "iid", "z": self.z.to_dict()}


@dataclass(frozen=True)
class TurnDependent(Increments):
    """Z_j ~ ``dists[j−1]`` independently; turns beyond ``len(dists)`` use the last one."""

    dists: tuple[IntDist, ...]

    def __post_init__(self):
        if len(self.dists) == 0:
            raise SpecError("increments.dists: at least one distribution is needed")

    @property
    def stationary_from(self) -> int:  # type: ignore[override]
        return len(self.dists)

    @property
    def mean_Z_tail(self) -> float:  # type: ignore[override]
        return self.dists[-1].mean

    def mean_Z(self, j):
        means = np.array([d.mean for d in self.dists])
        idx = np.minimum(np.asarray(j, dtype=np.int64), len(self.dists)) - 1
        return means[idx]

    def sample(self, rng, M):
        j = _ragged_turn_index(M)
        out = np.empty(j.size, dtype=np.int64)
        idx = np.minimum(j, len(self.dists)) - 1
        for k, d in enumerate(self.dists):  # one vectorized draw per distinct distribution
            sel = np.flatnonzero(idx == k)
            out[sel] = d.sample(rng, sel.size)
        return out

    def to_dict(self):
        return {"kind": "turn_dependent", "dists": [d.to_dict() for d in self.dists]}


@dataclass(frozen=True)
class PromptResponse(Increments):
    """Prompt blocks X_j ~ ``x`` and response blocks Y_j ~ ``y``, i.i.d.; Z_1 = X_1 and Z_j = Y_{j−1} + X_j
    (App. B.2). In the SCM with E[X] = k and E[Y] = m, R̄_j = jk + (j−1)m."""

    x: IntDist
    y: IntDist

    @property
    def stationary_from(self) -> int:  # type: ignore[override]
        return 2

    @property
    def mean_Z_tail(self) -> float:  # type: ignore[override]
        return self.x.mean + self.y.mean

    def mean_Z(self, j):
        j = np.asarray(j)
        return np.where(j <= 1, self.x.mean, self.x.mean + self.y.mean)

    def sample_xy(self, rng, M) -> tuple[np.ndarray, np.ndarray]:
        n = int(np.sum(M))
        return self.x.sample(rng, n), self.y.sample(rng, n)

    @staticmethod
    def z_from_xy(X: np.ndarray, Y: np.ndarray, M: np.ndarray) -> np.ndarray:
        j = _ragged_turn_index(M)
        Yprev = np.concatenate([[0], Y[:-1]])
        return X + np.where(j > 1, Yprev, 0)

    def sample(self, rng, M):
        X, Y = self.sample_xy(rng, M)
        return self.z_from_xy(X, Y, M)

    def to_dict(self):
        return {"kind": "prompt_response", "x": self.x.to_dict(), "y": self.y.to_dict()}


class EmpiricalConversations(Increments):
    """Whole conversations (Z_1, …, Z_M) resampled uniformly from a set of observed sequences.

    The turn count is the length of the drawn sequence, so any dependence across turns and between M and the Z's
    is preserved; :class:`WorkloadSpec` takes M's distribution from here.
    """

    joint = True

    def __init__(self, sequences) -> None:
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
        if not seqs:
            raise SpecError("increments.sequences: at least one conversation is needed")
        for i, s in enumerate(seqs):
            if s.ndim != 1 or s.size == 0:
                raise SpecError(f"increments.sequences[{i}]: must be a non-empty list of integers")
            if (s < 1).any():
                raise SpecError(f"increments.sequences[{i}]: every Z_j must be ≥ 1")
        self.sequences = seqs
        self._lengths = np.array([s.size for s in seqs], dtype=np.int64)
        self._flat = np.concatenate(seqs)
        self._offsets = np.concatenate([[0], np.cumsum(self._lengths)])

    @property
    def turns(self) -> FinitePMF:
        return FinitePMF.from_samples(self._lengths)

    @property
    def stationary_from(self) -> int:  # type: ignore[override]
        return int(self._lengths.max())

    @property
    def mean_Z_tail(self) -> float:  # type: ignore[override]
        return 0.0

    def mean_Z(self, j):
        """E[Z_j; M ≥ j] / P(M ≥ j) — the mean increment among conversations that reach turn j."""
        j = np.atleast_1d(np.asarray(j, dtype=np.int64))
        out = np.zeros(j.shape)
        for k, jj in enumerate(j):
            vals = [s[jj - 1] for s in self.sequences if s.size >= jj]
            out[k] = float(np.mean(vals)) if vals else 0.0
        return out

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` conversations: returns (M, Z flattened)."""
        idx = rng.integers(0, len(self.sequences), size=n)
        M = self._lengths[idx]
        starts = self._offsets[idx]
        pos = np.repeat(starts, M) + _ragged_turn_index(M) - 1
        return M, self._flat[pos]

    def sample(self, rng, M):
        raise SpecError("EmpiricalConversations draws M jointly with Z; use draw()")

    def to_dict(self):
        return {"kind": "empirical_conversations", "sequences": [s.tolist() for s in self.sequences]}


def increments_from_dict(d: dict[str, Any], where: str = "increments") -> Increments:
    """Build an :class:`Increments` from a mapping: ``{kind="iid", z=...}``, ``{kind="turn_dependent",
    dists=[...]}``, ``{kind="prompt_response", x=..., y=...}``, ``{kind="empirical_conversations",
    sequences=[[...], ...]}``; each inner distribution as in :func:`~kvhit.workload.dists.int_dist_from_dict`."""
    if not isinstance(d, dict) or "kind" not in d:
        raise SpecError(f"{where}: expected a table with a 'kind' key, got {d!r}")
    kind = d["kind"]
    if not isinstance(kind, str):
        raise SpecError(f"{where}.kind: expected a string, got {kind!r}")
    keys = {
        "iid": ("kind", "z"),
        "turn_dependent": ("kind", "dists"),
        "prompt_response": ("kind", "x", "y"),
        "empirical_conversations": ("kind", "sequences"),
    }
    if kind in keys:
        check_keys(d, keys[kind], where)
    try:
        if kind == "iid":
            return IIDIncrements(int_dist_from_dict(d["z"], f"{where}.z"))
        if kind == "turn_dependent":
            return TurnDependent(tuple(int_dist_from_dict(x, f"{where}.dists[{i}]") for i, x in enumerate(d["dists"])))
        if kind == "prompt_response":
            return PromptResponse(int_dist_from_dict(d["x"], f"{where}.x"), int_dist_from_dict(d["y"], f"{where}.y"))
        if kind == "empirical_conversations":
            return EmpiricalConversations(d["sequences"])
    except KeyError as e:
        raise SpecError(f"{where}: missing field {e.args[0]!r} for kind {kind!r}") from None
    raise SpecError(f"{where}: unknown kind {kind!r} (iid, turn_dependent, prompt_response, empirical_conversations)")


@dataclass(frozen=True)
class WorkloadSpec:
    """The MCM: λ0, M, {Z_j}, F (paper §2).

    Attributes:
        lam0: conversation arrival rate λ0 (> 0, conversations per second).
        turns: distribution of the turn count M (ignored when ``increments.joint``; see :attr:`M`).
        increments: the block-increment model.
        interarrival: the prompt interarrival distribution F.
        name: a label for reports.
    """

    lam0: float
    turns: IntDist | None
    increments: Increments
    interarrival: Interarrival
    name: str = ""

    def __post_init__(self) -> None:
        lam = float(self.lam0)
        if not math.isfinite(lam) or lam <= 0:
            raise SpecError(f"lam0 must be a finite rate > 0 conversations/s, got {self.lam0!r}")
        if not isinstance(self.increments, Increments):
            raise SpecError("increments must be an Increments model")
        if not self.increments.joint and not isinstance(self.turns, IntDist):
            raise SpecError("turns: a turn-count distribution is required (unless increments are empirical)")
        if not isinstance(self.interarrival, Interarrival):
            raise SpecError("interarrival must be an Interarrival distribution")
        if not math.isfinite(self.interarrival.mean):
            raise SpecError("interarrival: F must have a finite mean")

    @property
    def M(self) -> IntDist:
        """The turn-count distribution actually used (from the sequences for empirical conversations)."""
        if self.increments.joint:
            return self.increments.turns  # type: ignore[attr-defined]
        return self.turns  # type: ignore[return-value]

    def with_lam0(self, lam0: float) -> WorkloadSpec:
        return WorkloadSpec(lam0, self.turns, self.increments, self.interarrival, self.name)

    def with_interarrival(self, interarrival: Interarrival) -> WorkloadSpec:
        return WorkloadSpec(self.lam0, self.turns, self.increments, interarrival, self.name)

    @classmethod
    def scm(
        cls,
        lam0: float,
        p: float,
        *,
        x: IntDist | int = 1,
        y: IntDist | int = 1,
        mean_w: float = 1.0,
        name: str = "SCM",
    ) -> WorkloadSpec:
        """The stochastic conversation model of App. B.2: geometric turns with continuation ``p``, i.i.d. prompt
        and response blocks (means k = E[X], m = E[Y]), exponential interarrivals with mean ``mean_w``."""
        xd = int_dist_from_dict(x, "x") if not isinstance(x, IntDist) else x
        yd = int_dist_from_dict(y, "y") if not isinstance(y, IntDist) else y
        return cls(lam0, Geometric(p), PromptResponse(xd, yd), Exponential(mean_w), name)

    # -- serialization ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"lam0": float(self.lam0), "name": self.name}
        if self.turns is not None:
            d["turns"] = self.turns.to_dict()
        d["increments"] = self.increments.to_dict()
        d["interarrival"] = self.interarrival.to_dict()
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "spec") -> WorkloadSpec:
        if not isinstance(d, dict):
            raise SpecError(f"{where}: expected a table")
        check_keys(d, ("lam0", "name", "turns", "increments", "interarrival"), where)
        for key in ("lam0", "increments", "interarrival"):
            if key not in d:
                raise SpecError(f"{where}: missing field {key!r}")
        lam0 = num(d, "lam0", where)
        if "name" in d and not isinstance(d["name"], str):
            raise SpecError(f"{where}.name: expected a string, got {d['name']!r}")
        inc = increments_from_dict(d["increments"], f"{where}.increments")
        turns = int_dist_from_dict(d["turns"], f"{where}.turns") if "turns" in d else None
        w = interarrival_from_dict(d["interarrival"], f"{where}.interarrival")
        return cls(lam0, turns, inc, w, str(d.get("name", "")))

    @classmethod
    def from_toml(cls, path: str | Path) -> WorkloadSpec:
        """Read a spec from a TOML file (see ``docs/spec.md`` / ``examples/*.toml``)."""
        path = Path(path)
        try:
            with path.open("rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise SpecError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise SpecError(f"{path}: is a directory, expected a TOML file") from None
        except UnicodeDecodeError as e:
            raise SpecError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        except tomllib.TOMLDecodeError as e:
            raise SpecError(f"{path}: invalid TOML: {e}") from None
        try:
            return cls.from_dict(data, where=str(path))
        except ValueError as e:  # SpecError included: every message names the file
            if str(path) in str(e):
                raise
            raise SpecError(f"{path}: {e}") from None
