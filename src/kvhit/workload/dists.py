"""Distributions of the multi-turn conversation model (MCM, paper §2 and App. B.2).

Three families appear in the model:

* integer distributions on {1, 2, …} for the turn count ``M`` and the per-turn block increments ``Z_j``
  (:class:`IntDist` and subclasses);
* the prompt interarrival distribution ``F`` of ``W`` on [0, ∞) (:class:`Interarrival` and subclasses), with the
  integral ∫₀ᵗ F̄(u) du = E[min(W, t)] that enters the displacement curve d(t) (eq. (15), (29)) computed in closed
  form wherever the family allows it.

Every random draw takes a ``numpy.random.Generator`` so results are reproducible bit for bit from a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "SpecError",
    "IntDist",
    "Constant",
    "Geometric",
    "FinitePMF",
    "ScipyInt",
    "Interarrival",
    "Exponential",
    "Deterministic",
    "GammaW",
    "LogNormalW",
    "ScipyW",
    "EmpiricalW",
    "int_dist_from_dict",
    "interarrival_from_dict",
]


def _special():
    """``scipy.special``, imported on first use (the CLI's cold start does not pay for scipy)."""
    from scipy import special

    return special


class SpecError(ValueError):
    """An invalid workload specification; the message names the offending field."""


def check_keys(d: dict[str, Any], allowed: set[str] | tuple[str, ...], where: str) -> None:
    """Refuse keys a table does not define (a typo must not be silently ignored); names file/section/key."""
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise SpecError(f"{where}: unknown key(s) {unknown} (expected {sorted(allowed)})")


def num(d: dict[str, Any], key: str, where: str) -> float:
    """A number field of a table: booleans and strings are refused, not coerced (``true`` is not 1.0)."""
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        raise SpecError(f"{where}.{key}: expected a number, got {v!r}")
    return float(v)


def integer(d: dict[str, Any], key: str, where: str) -> int:
    """An integer field of a table: booleans and fractional numbers are refused, not truncated."""
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise SpecError(f"{where}.{key}: expected an integer, got {v!r}")
    return int(v)


_INT_KEYS = {
    "constant": ("kind", "value"),
    "geometric": ("kind", "p", "mean"),
    "pmf": ("kind", "values", "probs"),
    "empirical": ("kind", "samples"),
    "scipy": ("kind", "name", "args", "kwds", "shift"),
}
_W_KEYS = {
    "exponential": ("kind", "mean"),
    "deterministic": ("kind", "value"),
    "gamma": ("kind", "shape", "mean"),
    "lognormal": ("kind", "mean", "cv", "mu", "sigma"),
    "scipy": ("kind", "name", "args", "kwds"),
    "empirical": ("kind", "samples"),
}


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{name} must be a finite number > 0, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------------------
# Integer distributions on {1, 2, ...}
# ---------------------------------------------------------------------------------------------------------------


class IntDist:
    """An integer distribution supported on {1, 2, …} (turn count M, block increment Z_j).

    Subclasses give ``pmf``/``sf`` on integer arrays, moments and sampling. ``max_value`` is the largest value with
    positive probability (``math.inf`` when unbounded).
    """

    max_value: float = math.inf

    def pmf(self, k: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sf_ge(self, k: np.ndarray) -> np.ndarray:
        """P(X ≥ k) for integer ``k`` (this is S_k of eq. (7) when X = M)."""
        raise NotImplementedError

    @property
    def mean(self) -> float:
        raise NotImplementedError

    @property
    def second_moment(self) -> float:
        raise NotImplementedError

    @property
    def var(self) -> float:
        return self.second_moment - self.mean**2

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(IntDist):
    """X = ``value`` with probability one."""

    value: int

    def __post_init__(self) -> None:
        if int(self.value) != self.value or self.value < 1:
            raise SpecError(f"constant value must be an integer ≥ 1, got {self.value!r}")
        object.__setattr__(self, "max_value", int(self.value))

    def pmf(self, k):
        return (np.asarray(k) == self.value).astype(float)

    def sf_ge(self, k):
        return (np.asarray(k) <= self.value).astype(float)

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def second_moment(self) -> float:
        return float(self.value) ** 2

    def sample(self, rng, size):
        return np.full(size, int(self.value), dtype=np.int64)

    def to_dict(self):
        return {"kind": "constant", "value": int(self.value)}


@dataclass(frozen=True)
class Geometric(IntDist):
    """Geometric on {1, 2, …}: P(X = k) = p^(k−1)(1 − p), so P(X ≥ k) = p^(k−1) and E[X] = 1/(1 − p).

    For the turn count this is the SCM of App. B.2: after each turn the conversation continues with probability
    ``p`` (``h_max = p``, App. B.3). Construct from a mean with :meth:`from_mean`.
    """

    p: float

    def __post_init__(self) -> None:
        if not (0.0 <= float(self.p) < 1.0):
            raise SpecError(f"geometric continuation probability p must be in [0, 1), got {self.p!r}")

    @classmethod
    def from_mean(cls, mean: float) -> Geometric:
        mean = float(mean)
        if not math.isfinite(mean) or mean < 1:
            raise SpecError(f"geometric mean must be ≥ 1, got {mean!r}")
        return cls(1.0 - 1.0 / mean)

    def pmf(self, k):
        k = np.asarray(k, dtype=float)
        return np.where(k >= 1, self.p ** np.maximum(k - 1, 0) * (1 - self.p), 0.0)

    def sf_ge(self, k):
        k = np.asarray(k, dtype=float)
        return np.where(k <= 1, 1.0, self.p ** np.maximum(k - 1, 0))

    @property
    def mean(self) -> float:
        return 1.0 / (1.0 - self.p)

    @property
    def second_moment(self) -> float:
        q = 1.0 - self.p
        return (1.0 + self.p) / q**2

    def sample(self, rng, size):
        return rng.geometric(1.0 - self.p, size=size).astype(np.int64)

    def to_dict(self):
        return {"kind": "geometric", "p": float(self.p)}


@dataclass(frozen=True)
class FinitePMF(IntDist):
    """A finite pmf on positive integers; :meth:`from_samples` gives the empirical distribution."""

    values: tuple[int, ...]
    probs: tuple[float, ...]
    _v: np.ndarray = field(init=False, repr=False, compare=False)
    _p: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        v = np.asarray(self.values)
        p = np.asarray(self.probs, dtype=float)
        if v.ndim != 1 or v.shape != p.shape or v.size == 0:
            raise SpecError("pmf 'values' and 'probs' must be non-empty lists of equal length")
        if not np.all(np.equal(np.mod(v, 1), 0)) or np.any(v < 1):
            raise SpecError("pmf 'values' must be integers ≥ 1")
        if np.any(p < 0) or not np.isfinite(p).all() or p.sum() <= 0:
            raise SpecError("pmf 'probs' must be finite, ≥ 0 and not all zero")
        order = np.argsort(v, kind="stable")
        v = v[order].astype(np.int64)
        p = p[order] / p.sum()
        uniq, inv = np.unique(v, return_inverse=True)
        p = np.bincount(inv, weights=p)
        object.__setattr__(self, "_v", uniq)
        object.__setattr__(self, "_p", p)
        object.__setattr__(self, "values", tuple(int(x) for x in uniq))
        object.__setattr__(self, "probs", tuple(float(x) for x in p))
        object.__setattr__(self, "max_value", int(uniq[-1]))

    @classmethod
    def from_samples(cls, samples) -> FinitePMF:
        s = np.asarray(samples)
        if s.size == 0:
            raise SpecError("empirical distribution needs at least one sample")
        vals, counts = np.unique(s, return_counts=True)
        return cls(tuple(int(x) for x in vals), tuple(float(c) for c in counts))

    def pmf(self, k):
        k = np.asarray(k)
        idx = np.searchsorted(self._v, k)
        idx_c = np.minimum(idx, self._v.size - 1)
        return np.where(self._v[idx_c] == k, self._p[idx_c], 0.0)

    def sf_ge(self, k):
        k = np.asarray(k)
        tail = np.concatenate([np.cumsum(self._p[::-1])[::-1], [0.0]])
        return tail[np.searchsorted(self._v, k, side="left")]

    @property
    def mean(self) -> float:
        return float(self._v @ self._p)

    @property
    def second_moment(self) -> float:
        return float((self._v.astype(float) ** 2) @ self._p)

    def sample(self, rng, size):
        return rng.choice(self._v, size=size, p=self._p).astype(np.int64)

    def to_dict(self):
        return {"kind": "pmf", "values": list(self.values), "probs": list(self.probs)}


@dataclass(frozen=True)
class ScipyInt(IntDist):
    """Any frozen ``scipy.stats`` discrete distribution, shifted by ``shift`` so that its support is in {1, 2, …}.

    Example: ``ScipyInt(stats.poisson(3.0), shift=1)`` is 1 + Poisson(3).
    """

    frozen: Any
    shift: int = 0

    def __post_init__(self) -> None:
        if not hasattr(self.frozen, "pmf") or not hasattr(self.frozen, "rvs"):
            raise SpecError("ScipyInt needs a frozen scipy.stats discrete distribution")
        lo, hi = self.frozen.support()
        if lo + self.shift < 1:
            raise SpecError(f"distribution support starts at {lo + self.shift}, must be ≥ 1 (use shift=)")
        if not math.isfinite(self.frozen.mean()):
            raise SpecError("distribution must have a finite mean")
        object.__setattr__(self, "max_value", hi + self.shift if math.isfinite(hi) else math.inf)

    def pmf(self, k):
        return self.frozen.pmf(np.asarray(k) - self.shift)

    def sf_ge(self, k):
        return self.frozen.sf(np.asarray(k) - self.shift - 1)

    @property
    def mean(self) -> float:
        return float(self.frozen.mean()) + self.shift

    @property
    def second_moment(self) -> float:
        m = float(self.frozen.mean())
        return float(self.frozen.var()) + (m + self.shift) ** 2

    def sample(self, rng, size):
        return (np.asarray(self.frozen.rvs(size=size, random_state=rng)) + self.shift).astype(np.int64)

    def to_dict(self):
        return {
            "kind": "scipy",
            "name": self.frozen.dist.name,
            "args": list(self.frozen.args),
            "kwds": dict(self.frozen.kwds),
            "shift": self.shift,
        }


def int_dist_from_dict(d: dict[str, Any] | int, where: str) -> IntDist:
    """Build an :class:`IntDist` from a TOML/JSON mapping; ``where`` names the field for error messages.

    Forms: an integer (constant); ``{kind="constant", value=k}``; ``{kind="geometric", p=...}`` or
    ``{kind="geometric", mean=...}``; ``{kind="pmf", values=[...], probs=[...]}``; ``{kind="empirical",
    samples=[...]}``; ``{kind="scipy", name="poisson", args=[3.0], shift=1}``.
    """
    if isinstance(d, bool):
        raise SpecError(f"{where}: expected an integer or a table, got a boolean")
    if isinstance(d, int | np.integer):
        try:
            return Constant(int(d))
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
    if not isinstance(d, dict) or "kind" not in d:
        raise SpecError(f"{where}: expected an integer or a table with a 'kind' key, got {d!r}")
    kind = d["kind"]
    if not isinstance(kind, str):
        raise SpecError(f"{where}.kind: expected a string, got {kind!r}")
    if kind in _INT_KEYS:
        check_keys(d, _INT_KEYS[kind], where)
    try:
        if kind == "constant":
            return Constant(integer(d, "value", where))
        if kind == "geometric":
            if "p" in d and "mean" in d:
                raise SpecError("give p or mean, not both")
            if "p" in d:
                return Geometric(num(d, "p", where))
            return Geometric.from_mean(num(d, "mean", where))
        if kind == "pmf":
            return FinitePMF(tuple(d["values"]), tuple(d["probs"]))
        if kind == "empirical":
            return FinitePMF.from_samples(d["samples"])
        if kind == "scipy":
            from scipy import stats  # lazy: scipy.stats costs ~1 s of import for every command

            dist = getattr(stats, d["name"])
            shift = integer(d, "shift", where) if "shift" in d else 0
            return ScipyInt(dist(*d.get("args", []), **d.get("kwds", {})), shift)
    except KeyError as e:
        raise SpecError(f"{where}: missing field {e.args[0]!r} for kind {kind!r}") from None
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
    except (TypeError, AttributeError) as e:
        raise SpecError(f"{where}: {e}") from None
    raise SpecError(f"{where}: unknown kind {kind!r} (constant, geometric, pmf, empirical, scipy)")


# ---------------------------------------------------------------------------------------------------------------
# Prompt interarrival distributions W ~ F on [0, ∞)
# ---------------------------------------------------------------------------------------------------------------


class Interarrival:
    """The prompt interarrival distribution F of W (Assumption B.4).

    ``int_sf(t)`` is ∫₀ᵗ F̄(u) du = E[min(W, t)], the integral in d(t) (eq. (15)) and d_prac(t) (eq. (29)).
    It is exact for every family here except :class:`ScipyW`, which uses adaptive quadrature.
    """

    name = "interarrival"

    def cdf(self, t):
        raise NotImplementedError

    def sf(self, t):
        return 1.0 - self.cdf(t)

    def int_sf(self, t):
        raise NotImplementedError

    @property
    def mean(self) -> float:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} (mean {self.mean:.4g} s)"


@dataclass(frozen=True)
class Exponential(Interarrival):
    """W ~ Exp with mean ``mean``: ∫₀ᵗ F̄ = μ(1 − e^(−t/μ))."""

    mean_: float
    name = "exponential"

    def __post_init__(self):
        _check_positive("exponential mean", self.mean_)

    @property
    def mean(self) -> float:
        return float(self.mean_)

    def cdf(self, t):
        t = np.asarray(t, dtype=float)
        return np.where(t > 0, -np.expm1(-np.maximum(t, 0) / self.mean_), 0.0)

    def int_sf(self, t):
        t = np.maximum(np.asarray(t, dtype=float), 0.0)
        return -self.mean_ * np.expm1(-t / self.mean_)

    def sample(self, rng, size):
        return rng.exponential(self.mean_, size=size)

    def to_dict(self):
        return {"kind": "exponential", "mean": float(self.mean_)}


@dataclass(frozen=True)
class Deterministic(Interarrival):
    """W = ``value`` exactly: ∫₀ᵗ F̄ = min(t, value). (Not Lipschitz; the theorems need Assumption B.4, the
    formulas are still well defined.)"""

    value: float
    name = "deterministic"

    def __post_init__(self):
        v = float(self.value)
        if not math.isfinite(v) or v < 0:
            raise SpecError(f"deterministic interarrival must be finite and ≥ 0, got {self.value!r}")

    @property
    def mean(self) -> float:
        return float(self.value)

    def cdf(self, t):
        return (np.asarray(t, dtype=float) >= self.value).astype(float)

    def int_sf(self, t):
        return np.clip(np.asarray(t, dtype=float), 0.0, self.value)

    def sample(self, rng, size):
        return np.full(size, float(self.value))

    def to_dict(self):
        return {"kind": "deterministic", "value": float(self.value)}


GAMMA_MAX_SHAPE = 1e6  #: shape k = 1/cv² bound of :class:`GammaW`


@dataclass(frozen=True)
class GammaW(Interarrival):
    """Gamma with shape k and the given mean (scale θ = mean/k).

    E[min(W, t)] = t·F̄(t) + kθ·P(Gamma(k+1, θ) ≤ t), exact.
    """

    shape: float
    mean_: float
    name = "gamma"

    def __post_init__(self):
        _check_positive("gamma shape", self.shape)
        _check_positive("gamma mean", self.mean_)
        if self.shape > GAMMA_MAX_SHAPE:  # cv < 0.001: the CDF's numerics break down; W is deterministic there
            raise SpecError(
                f"gamma shape must be ≤ {GAMMA_MAX_SHAPE:g} (coefficient of variation ≥ 0.001), got {self.shape!r}; "
                "use a deterministic interarrival for cv = 0"
            )

    @property
    def mean(self) -> float:
        return float(self.mean_)

    @property
    def scale(self) -> float:
        return self.mean_ / self.shape

    def cdf(self, t):
        t = np.maximum(np.asarray(t, dtype=float), 0.0)
        return _special().gammainc(self.shape, t / self.scale)

    def int_sf(self, t):
        t = np.maximum(np.asarray(t, dtype=float), 0.0)
        x = t / self.scale
        return t * _special().gammaincc(self.shape, x) + self.mean_ * _special().gammainc(self.shape + 1, x)

    def sample(self, rng, size):
        return rng.gamma(self.shape, self.scale, size=size)

    def to_dict(self):
        return {"kind": "gamma", "shape": float(self.shape), "mean": float(self.mean_)}


@dataclass(frozen=True)
class LogNormalW(Interarrival):
    """Log-normal with log-scale parameters (mu, sigma).

    E[min(W, t)] = t·F̄(t) + e^(mu+sigma²/2)·Φ((ln t − mu − sigma²)/sigma), exact.
    Use :meth:`from_mean_cv` to set it from a mean and a coefficient of variation.
    """

    mu: float
    sigma: float
    name = "lognormal"

    def __post_init__(self):
        _check_positive("lognormal sigma", self.sigma)
        if not math.isfinite(self.mu):
            raise SpecError("lognormal mu must be finite")

    @classmethod
    def from_mean_cv(cls, mean: float, cv: float) -> LogNormalW:
        _check_positive("lognormal mean", mean)
        _check_positive("lognormal cv", cv)
        s2 = math.log1p(cv * cv)
        return cls(math.log(mean) - s2 / 2, math.sqrt(s2))

    @property
    def mean(self) -> float:
        return math.exp(self.mu + self.sigma**2 / 2)

    def cdf(self, t):
        t = np.asarray(t, dtype=float)
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(t, 0.0)) - self.mu) / self.sigma
        return _special().ndtr(z)

    def int_sf(self, t):
        t = np.maximum(np.asarray(t, dtype=float), 0.0)
        with np.errstate(divide="ignore"):
            lt = np.log(t)
        return t * _special().ndtr(-(lt - self.mu) / self.sigma) + self.mean * _special().ndtr(
            (lt - self.mu - self.sigma**2) / self.sigma
        )

    def sample(self, rng, size):
        return rng.lognormal(self.mu, self.sigma, size=size)

    def to_dict(self):
        return {"kind": "lognormal", "mu": float(self.mu), "sigma": float(self.sigma)}


@dataclass(frozen=True)
class ScipyW(Interarrival):
    """Any frozen ``scipy.stats`` continuous distribution supported on [0, ∞) with a finite mean.

    ∫₀ᵗ F̄ by Gauss–Legendre quadrature on pieces between ~210 quantiles of F (tabulated once), so every piece
    is well resolved at any scale of t and a vector of t costs a few vectorized ``sf`` calls.
    """

    frozen: Any
    name = "scipy"

    def __post_init__(self):
        if not hasattr(self.frozen, "cdf") or not hasattr(self.frozen, "rvs"):
            raise SpecError("ScipyW needs a frozen scipy.stats continuous distribution")
        lo, _ = self.frozen.support()
        if lo < 0:
            raise SpecError(f"interarrival distribution must be supported on [0, ∞); support starts at {lo}")
        m = float(self.frozen.mean())
        if not math.isfinite(m):
            raise SpecError("interarrival distribution must have a finite mean")

    @property
    def mean(self) -> float:
        return float(self.frozen.mean())

    def cdf(self, t):
        return self.frozen.cdf(np.asarray(t, dtype=float))

    _GL_X, _GL_W = np.polynomial.legendre.leggauss(24)

    def _table(self):
        """Breakpoints at quantiles of F and the cumulative ∫₀^q F̄ at each (24-point Gauss–Legendre per piece)."""
        cached = self.__dict__.get("_tab")
        if cached is not None:
            return cached
        probs = np.concatenate(
            [
                [1e-12, 1e-9, 1e-6, 1e-4],
                np.linspace(0.005, 0.995, 199),
                [1 - 1e-4, 1 - 1e-6, 1 - 1e-9, 1 - 1e-12],
            ]
        )
        qs = np.unique(self.frozen.ppf(probs))
        qs = np.concatenate([[0.0], qs[np.isfinite(qs) & (qs > 0)]])
        pieces = self._gl(qs[:-1], qs[1:])
        tab = (qs, np.concatenate([[0.0], np.cumsum(pieces)]))
        object.__setattr__(self, "_tab", tab)
        return tab

    def _gl(self, a, b):
        half = (np.asarray(b) - np.asarray(a)) / 2
        mid = (np.asarray(b) + np.asarray(a)) / 2
        u = mid[..., None] + half[..., None] * self._GL_X
        return half * (self.frozen.sf(u) @ self._GL_W)

    def int_sf(self, t):
        """∫₀ᵗ F̄ = E[min(W, t)], vectorized: a precomputed table over ~210 quantile pieces plus one Gauss–Legendre
        piece up to t (relative error ≲ 1e-9 for smooth F). Beyond the 1 − 1e-12 quantile F̄ < 1e-12, so the last
        piece's error there is below 1e-12·(t − q) in absolute terms."""
        t = np.asarray(t, dtype=float)
        flat = np.maximum(t.ravel(), 0.0)
        qs, cum = self._table()
        k = np.clip(np.searchsorted(qs, flat, side="right") - 1, 0, qs.size - 1)
        out = cum[k] + self._gl(qs[k], flat)
        return out.reshape(t.shape) if t.ndim else float(out[0])

    def sample(self, rng, size):
        return np.asarray(self.frozen.rvs(size=size, random_state=rng), dtype=float)

    def to_dict(self):
        return {
            "kind": "scipy",
            "name": self.frozen.dist.name,
            "args": list(self.frozen.args),
            "kwds": dict(self.frozen.kwds),
        }

    def describe(self) -> str:
        return f"scipy.{self.frozen.dist.name} (mean {self.mean:.4g} s)"


class EmpiricalW(Interarrival):
    """The empirical distribution F̂ of observed interarrival samples (eq. (38) uses it).

    F̂(t) = #{w_i ≤ t}/n and ∫₀ᵗ (1 − F̂) = (1/n)·Σ min(w_i, t), evaluated exactly from sorted samples and their
    prefix sums (a piecewise-linear function of t).
    """

    name = "empirical"

    def __init__(self, samples) -> None:
        w = np.asarray(samples, dtype=float).ravel()
        if w.size == 0:
            raise SpecError("empirical interarrival needs at least one sample")
        if not np.isfinite(w).all() or (w < 0).any():
            raise SpecError("empirical interarrival samples must be finite and ≥ 0")
        self._w = np.sort(w)
        self._cs = np.concatenate([[0.0], np.cumsum(self._w)])

    @property
    def samples(self) -> np.ndarray:
        return self._w

    @property
    def mean(self) -> float:
        return float(self._cs[-1] / self._w.size)

    def cdf(self, t):
        return np.searchsorted(self._w, np.asarray(t, dtype=float), side="right") / self._w.size

    def int_sf(self, t):
        t = np.maximum(np.asarray(t, dtype=float), 0.0)
        k = np.searchsorted(self._w, t, side="right")  # samples ≤ t contribute themselves, others contribute t
        return (self._cs[k] + t * (self._w.size - k)) / self._w.size

    def sample(self, rng, size):
        return rng.choice(self._w, size=size, replace=True)

    def to_dict(self):
        return {"kind": "empirical", "samples": self._w.tolist()}

    def __repr__(self) -> str:
        return f"EmpiricalW(n={self._w.size}, mean={self.mean:.4g})"


def interarrival_from_dict(d: dict[str, Any], where: str = "interarrival") -> Interarrival:
    """Build an :class:`Interarrival` from a mapping: ``{kind="exponential", mean=135}``, ``{kind="deterministic",
    value=...}``, ``{kind="gamma", shape=..., mean=...}``, ``{kind="lognormal", mean=..., cv=...}`` or
    ``{kind="lognormal", mu=..., sigma=...}``, ``{kind="scipy", name="weibull_min", args=[1.5], kwds={scale=100}}``,
    ``{kind="empirical", samples=[...]}``."""
    if not isinstance(d, dict) or "kind" not in d:
        raise SpecError(f"{where}: expected a table with a 'kind' key, got {d!r}")
    kind = d["kind"]
    if not isinstance(kind, str):
        raise SpecError(f"{where}.kind: expected a string, got {kind!r}")
    if kind in _W_KEYS:
        check_keys(d, _W_KEYS[kind], where)
    try:
        if kind == "exponential":
            return Exponential(num(d, "mean", where))
        if kind == "deterministic":
            return Deterministic(num(d, "value", where))
        if kind == "gamma":
            return GammaW(num(d, "shape", where), num(d, "mean", where))
        if kind == "lognormal":
            if "cv" in d or "mean" in d:
                if "mu" in d or "sigma" in d:
                    raise SpecError("give mean and cv, or mu and sigma, not both")
                return LogNormalW.from_mean_cv(num(d, "mean", where), num(d, "cv", where))
            return LogNormalW(num(d, "mu", where), num(d, "sigma", where))
        if kind == "scipy":
            from scipy import stats  # lazy: scipy.stats costs ~1 s of import for every command

            dist = getattr(stats, d["name"])
            return ScipyW(dist(*d.get("args", []), **d.get("kwds", {})))
        if kind == "empirical":
            return EmpiricalW(d["samples"])
    except KeyError as e:
        raise SpecError(f"{where}: missing field {e.args[0]!r} for kind {kind!r}") from None
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None
    except (TypeError, AttributeError) as e:
        raise SpecError(f"{where}: {e}") from None
    raise SpecError(f"{where}: unknown kind {kind!r} (exponential, deterministic, gamma, lognormal, scipy, empirical)")
