"""The estimator registry of the paper's LLM-serving experiments (App. E) and the ingredient columns.

Estimators
----------
A registry (:data:`ESTIMATORS`) of named callables ``(trace, measured_mask, N, lam0, mu_F) -> float``:
``measured_mask`` is the row mask of the measured conversations' turns submitted inside the window. The
defaults all use eq. (38)–(39) with the paper's accounting (Â_R, Â_H^hash, Ê[B] of eq. (35)–(37) over the
measured conversations, ``block="paper"``; unscaled λ0 = the setting's λ0; threshold N):

* ``prior``: F(t) = 1 − exp(−t/μ_F), the target;
* ``posterior``: exponential with the realized mean μ̂_F of the gaps observed in the window (App. E);
* ``empirical``: F̂ = the empirical CDF of the gaps observed in the window (eq. (38)).

and the engine-aware estimators of :mod:`kvhit.estimate.engine` (docs/estimators.md), each registered with the actual
it predicts (:data:`ESTIMATOR_TARGETS`), fed the empirical F̂ of the realized eq. (80) gaps of the measured
conversations (:func:`kvhit.estimate.accounting.engine_accounting`) and the setting's λ0 (nothing fitted to the
actuals):

* ``engine:<e>`` / ``engine:<e>:token`` (e = ``vllm``, ``vllm-0.23``): :func:`kvhit.estimate.engine.estimate_engine`
  with the engine's block accounting, finite N, tail-first partial prefix hits and Gaussian fluctuations of the
  displacement (Lemma D.1), block-weighted h (vs actual ``<e>``) or vLLM's token hit ratio (vs ``<e>:token``);
* ``window:<e>`` / ``window:<e>:token``: :func:`kvhit.estimate.engine.estimate_window`, the same model on the rows the
  window counts, with the warm-up transient (no conversation before the system origin t = 0);
* ``engine:content``, ``window:content`` and ``finite`` (:func:`kvhit.estimate.engine.estimate_finite`, the
  finite-capacity estimator of the paper's model): Algorithm 1, vs actual ``alg1``.

Add an estimator with :func:`register_estimator` (or pass ``estimators=`` to
:func:`kvhit.experiments.paper.run_experiments`).

Ingredients
-----------
With ``Setting.ingredients`` every run also evaluates, for each vLLM engine and both metrics, the estimate as the
ingredients are added one by one (:data:`INGREDIENT_COLUMNS`, :func:`ingredient_estimates`): eq. (39) as
published → (a) engine block accounting → (c) finite N (own size in the threshold) → (b) tail-first partial
prefix hits → (d) fluctuations → (e) the window transient;
:func:`kvhit.experiments.paper.summarize` reports each column's signed error
against the simulated engine on every grid point (``summary["ingredients"]``).

Invariant: an estimator is a function of (trace, measured rows, N, λ0, μ_F) only: nothing is fitted to the
actuals. Estimates of one (trace, mask) pair are memoized by identity and cleared after each run.

NOT modelled here: the actuals (the simulators, :mod:`kvhit.experiments.paper_runs`) and the statistics over
seeds (:mod:`kvhit.experiments.paper`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kvhit.estimate.accounting import engine_accounting
from kvhit.estimate.engine import estimate_engine, estimate_finite, estimate_window
from kvhit.estimate.mean_field import estimate
from kvhit.estimate.trace_stats import EstimateError, trace_moments
from kvhit.experiments.paper_setting import ExperimentError
from kvhit.workload.dists import EmpiricalW, Exponential
from kvhit.workload.trace import Trace, Window

__all__ = [
    "Estimator",
    "ESTIMATORS",
    "ESTIMATOR_TARGETS",
    "PAPER_ESTIMATORS",
    "register_estimator",
    "engine_estimator",
    "window_estimator",
    "finite_estimator",
    "measured_window",
    "INGREDIENT_COLUMNS",
    "INGREDIENT_LABELS",
    "ingredient_estimates",
    "ENGINE_TARGET",
    "observed_gaps",
]


#: ``(trace, measured_mask, N, lam0, mu_F) -> ĥ``; ``measured_mask`` selects the rows (turns) of the measured
#: conversations submitted inside the window.
Estimator = Callable[[Trace, np.ndarray, int, float, float], float]


def observed_gaps(trace: Trace, measured_mask: np.ndarray) -> np.ndarray:
    """The prompt interarrival gaps observed in the window: time of turn j+1 − time of turn j for consecutive
    turns of one conversation that are both in ``measured_mask`` (gaps ending after the window are
    censored)."""
    m = np.asarray(measured_mask)
    if m.dtype != bool or m.shape != (trace.n_turns,):
        raise ExperimentError(
            f"measured_mask: expected a boolean row mask of shape ({trace.n_turns},), got {m.dtype} {m.shape}"
        )
    idx = np.flatnonzero(m)
    c, tu, t = trace["conv"][idx], trace["turn"][idx], trace["time"][idx]
    o = np.lexsort((tu, c))
    c, tu, t = c[o], tu[o], t[o]
    same = (c[1:] == c[:-1]) & (tu[1:] == tu[:-1] + 1)
    return (t[1:] - t[:-1])[same]


def _moments(trace: Trace, measured_mask: np.ndarray):
    return trace_moments(trace, rows=measured_mask, block="paper")


def _est(trace, mask, N, lam0, F) -> float:
    return float(estimate(_moments(trace, mask), N, lam0, F, practical=True).h)


def prior_estimator(trace: Trace, measured_mask: np.ndarray, N: int, lam0: float, mu_F: float) -> float:
    """eq. (38)–(39) with the target F(t) = 1 − exp(−t/μ_F) (App. E's prior estimator)."""
    return _est(trace, measured_mask, N, lam0, Exponential(float(mu_F)))


def posterior_estimator(trace: Trace, measured_mask: np.ndarray, N: int, lam0: float, mu_F: float) -> float:
    """eq. (38)–(39) with F^post(t) = 1 − exp(−t/μ̂_F), μ̂_F the mean observed gap in the window (App. E)."""
    W = observed_gaps(trace, measured_mask)
    if W.size == 0:
        raise EstimateError("no interarrival gap observed in the window")
    return _est(trace, measured_mask, N, lam0, Exponential(float(W.mean())))


def empirical_estimator(trace: Trace, measured_mask: np.ndarray, N: int, lam0: float, mu_F: float) -> float:
    """eq. (38)–(39) with F̂ the empirical CDF of the gaps observed in the window."""
    return _est(trace, measured_mask, N, lam0, EmpiricalW(observed_gaps(trace, measured_mask)))


# ---- engine-aware estimators (kvhit.estimate.engine, docs/estimators.md) -------------------------------------------

#: |estimate − simulated engine hit ratio| the engine-aware estimators aim at on the Experiment 1 and 2 grids.
ENGINE_TARGET = 0.005

#: Cumulative ingredients of the engine estimate (:func:`ingredient_estimates`), in the order they are added.
#: (b) tail-first partial prefix hits is added after (c): a partial hit is defined by the finite threshold
#: (block i of a history survives iff D + i + 1 ≤ C), so it does not exist without (c).
INGREDIENT_COLUMNS = ("paper", "a", "a+c", "a+b+c", "a+b+c+d", "window")
INGREDIENT_LABELS = {
    "paper": "eq. (39) as published (paper accounting, mean field, N ≫ own size)",
    "a": "+ (a) engine block accounting (E_B, A, hit weights, capacity offset of the engine)",
    "a+c": "+ (c) finite N: the history's own size in its threshold (all or nothing)",
    "a+b+c": "+ (b) tail-first freeing: partial prefix hits",
    "a+b+c+d": "+ (d) fluctuations of the displacement (Gaussian, Lemma D.1)",
    "window": "+ (e) the window transient: the counted rows, their own gaps, no conversation before t = 0",
}

_MEMO: dict[str, Any] = {"trace": None, "mask": None, "vals": {}}


def _memo(trace: Trace, mask: np.ndarray, key: tuple, fn: Callable[[], Any]) -> Any:
    """Per-process memo of the estimates of one (trace, measured mask) pair (identity), so that the ingredient
    table and the registered estimators share every computation; reset when another trace or mask comes."""
    if _MEMO["trace"] is not trace or _MEMO["mask"] is not mask:
        _MEMO.update(trace=trace, mask=mask, vals={})
    vals = _MEMO["vals"]
    if key not in vals:
        vals[key] = fn()
    return vals[key]


def _memo_clear() -> None:
    _MEMO.update(trace=None, mask=None, vals={})


def _check_mask(trace: Trace, measured_mask: np.ndarray) -> np.ndarray:
    m = np.asarray(measured_mask)
    if m.dtype != bool or m.shape != (trace.n_turns,):
        raise ExperimentError(
            f"measured_mask: expected a boolean row mask of shape ({trace.n_turns},), got {m.dtype} {m.shape}"
        )
    if not m.any():
        raise ExperimentError("measured_mask: selects no row")
    return m


def measured_window(trace: Trace, measured_mask: np.ndarray) -> Window:
    """App. E's window from the measured rows: from the first to the last arrival of a measured conversation,
    counting the turns of every conversation inside it (= ``Window.warmup_conversations(trace, n_warm)`` when
    the measured conversations are the ones after the n_warm-th arrival)."""
    m = _check_mask(trace, measured_mask)
    arr = np.asarray(trace["conv_arrival"], dtype=float)[m]
    return Window(float(arr.min()), float(arr.max()), 0)


def _metric_key(engine: str, metric: str) -> str:
    return engine if metric == "blocks" else f"{engine}:token"


def _accounting(trace: Trace, mask: np.ndarray, engine: str, metric: str):
    return _memo(
        trace,
        mask,
        ("acc", engine, metric),
        lambda: engine_accounting(trace, engine=engine, metric=metric, rows=_check_mask(trace, mask)),
    )


def _ingredient(trace: Trace, mask: np.ndarray, N: int, lam0: float, engine: str, metric: str, col: str) -> float:
    """One column of :data:`INGREDIENT_COLUMNS` (memoized); F̂ = the empirical CDF of the measured
    conversations' realized gaps (``EngineAccounting.W``), λ0 as given."""
    N, lam0 = int(N), float(lam0)
    if col == "paper":
        key: tuple = ("paper", N, lam0)

        def fn() -> float:
            return float(estimate(trace_moments(trace, rows=_check_mask(trace, mask)), N, lam0, "empirical").h)

    elif col == "window":
        key = ("window", engine, metric, N, lam0)

        def fn() -> float:
            win = measured_window(trace, mask)
            return float(estimate_window(trace, N, lam0, window=win, engine=engine, metric=metric, origin=0.0).h)

    else:
        kw = {
            "a": dict(finite=False, partial=False, fluctuations=False),
            "a+c": dict(finite=True, partial=False, fluctuations=False),
            "a+b+c": dict(finite=True, partial=True, fluctuations=False),
            "a+b+c+d": dict(finite=True, partial=True, fluctuations=True),
        }
        if col not in kw:
            raise ExperimentError(f"column: unknown ingredient column {col!r} (one of {INGREDIENT_COLUMNS})")
        key = (col, engine, metric, N, lam0)

        def fn() -> float:
            acc = _accounting(trace, mask, engine, metric)
            return float(estimate_engine(acc, N, lam0, "empirical", **kw[col]).h)

    return _memo(trace, mask, key, fn)


def ingredient_estimates(
    trace: Trace,
    measured_mask: np.ndarray,
    N: int,
    lam0: float,
    engine: str,
    metric: str = "blocks",
    columns: Iterable[str] = INGREDIENT_COLUMNS,
) -> dict[str, float]:
    """The engine's hit-ratio estimate as the ingredients of docs/estimators.md are added cumulatively
    (:data:`INGREDIENT_COLUMNS`): ``paper`` = eq. (35)–(39) on the measured conversations; ``a`` =
    :func:`kvhit.estimate.engine.estimate_engine` with ``finite=False, fluctuations=False`` (eq. (38)–(39) with the
    engine's E_B, A, hit weights and capacity N − cap_offset); ``a+c`` own size in the threshold; ``a+b+c``
    tail-first partial prefix hits; ``a+b+c+d`` Gaussian fluctuations (Lemma D.1); ``window`` =
    :func:`kvhit.estimate.engine.estimate_window` over App. E's window (:func:`measured_window`, origin t = 0).
    F̂ is the empirical CDF of the measured conversations' realized gaps (eq. (80)), λ0 the setting's rate.

    Args:
        engine: ``"vllm"``, ``"vllm-0.23"`` (or ``"content"``, Algorithm 1).
        metric: ``"blocks"`` (block-weighted h, eq. (6)) or ``"tokens"`` (vLLM's token hit ratio).
    """
    if metric not in ("blocks", "tokens"):
        raise ExperimentError(f"metric: expected 'blocks' or 'tokens', got {metric!r}")
    return {c: _ingredient(trace, measured_mask, N, lam0, engine, metric, c) for c in columns}


def _engine_est(trace, measured_mask, N, lam0, mu_F, *, engine: str, metric: str) -> float:
    if engine == "content":
        acc = _accounting(trace, measured_mask, "content", "blocks")
        return _memo(
            trace,
            measured_mask,
            ("engine-content", int(N), float(lam0)),
            lambda: float(estimate_engine(acc, int(N), float(lam0), "empirical").h),
        )
    return _ingredient(trace, measured_mask, N, lam0, engine, metric, "a+b+c+d")


def _window_est(trace, measured_mask, N, lam0, mu_F, *, engine: str, metric: str) -> float:
    return _ingredient(trace, measured_mask, N, lam0, engine, metric, "window")


def _finite_est(trace, measured_mask, N, lam0, mu_F) -> float:
    return float(estimate_finite(trace, int(N), float(lam0), rows=_check_mask(trace, measured_mask)).h)


def engine_estimator(engine: str, metric: str = "blocks") -> Estimator:
    """The stationary engine-aware estimator :func:`kvhit.estimate.engine.estimate_engine` (engine accounting, finite
    N, tail-first partial hits, fluctuations) as an :data:`Estimator` (picklable)."""
    if metric not in ("blocks", "tokens"):
        raise ExperimentError(f"metric: expected 'blocks' or 'tokens', got {metric!r}")
    return functools.partial(_engine_est, engine=engine, metric=metric)


def window_estimator(engine: str, metric: str = "blocks") -> Estimator:
    """The window-exact engine estimator :func:`kvhit.estimate.engine.estimate_window` over App. E's window
    (:func:`measured_window`; system origin t = 0) as an :data:`Estimator` (picklable)."""
    if metric not in ("blocks", "tokens"):
        raise ExperimentError(f"metric: expected 'blocks' or 'tokens', got {metric!r}")
    return functools.partial(_window_est, engine=engine, metric=metric)


def finite_estimator() -> Estimator:
    """:func:`kvhit.estimate.engine.estimate_finite`: the paper's model with each history's own size R_{i,j} in its
    threshold (the issue's finite-capacity estimator of Algorithm 1)."""
    return _finite_est


#: The estimator registry (name → callable). The paper's two are ``prior`` and ``posterior``.
ESTIMATORS: dict[str, Estimator] = {
    "prior": prior_estimator,
    "posterior": posterior_estimator,
    "empirical": empirical_estimator,
}
#: Estimators the paper's reported error bounds refer to.
PAPER_ESTIMATORS = ("prior", "posterior")
#: estimator name → the actual (key of :func:`actuals`) it predicts. Estimators without a target (the paper's)
#: are compared with every actual; targeted ones with their own only, against :data:`ENGINE_TARGET`.
ESTIMATOR_TARGETS: dict[str, str] = {}


def register_estimator(name: str, fn: Estimator, *, target: str | None = None, replace_existing: bool = False) -> None:
    """Add ``fn`` to :data:`ESTIMATORS` (it is then run at every point). ``target``: the actual it predicts
    (e.g. ``"vllm"``, ``"vllm:token"``, ``"alg1"``); it is then compared with that actual only (and checked
    against :data:`ENGINE_TARGET`), and skipped by settings that do not produce that actual. Register at import
    time of a module that the worker processes import too (or before :func:`run_experiments` with the default
    ``fork`` start)."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ExperimentError(f"estimator name: expected a non-empty string without '/', got {name!r}")
    if not callable(fn):
        raise ExperimentError(f"estimator {name!r}: not callable")
    if target is not None and (not isinstance(target, str) or not target or "/" in target):
        raise ExperimentError(f"estimator {name!r}: target must be an actual's key, got {target!r}")
    if name in ESTIMATORS and not replace_existing:
        raise ExperimentError(f"estimator {name!r} is already registered (pass replace_existing=True)")
    ESTIMATORS[name] = fn
    ESTIMATOR_TARGETS.pop(name, None)
    if target is not None:
        ESTIMATOR_TARGETS[name] = target


for _e in ("vllm-0.23", "vllm"):
    for _m in ("blocks", "tokens"):
        register_estimator(f"engine:{_metric_key(_e, _m)}", engine_estimator(_e, _m), target=_metric_key(_e, _m))
        register_estimator(f"window:{_metric_key(_e, _m)}", window_estimator(_e, _m), target=_metric_key(_e, _m))
register_estimator("engine:content", engine_estimator("content"), target="alg1")
register_estimator("window:content", window_estimator("content"), target="alg1")
register_estimator("finite", finite_estimator(), target="alg1")
del _e, _m
