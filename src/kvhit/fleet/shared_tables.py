"""Moment tables shared across routings that differ in a few conversations (the KV-aware fleet curve under load).

:func:`kvhit.fleet.estimate.estimate_fleet_kv_curve` estimates one fragment trace per distinct routing where the
routing reads the capacity (llm-d under load: 14 routings among the ShareGPT benchmark's 1,000 capacities; Dynamo's
overlap destination: hundreds). Those routings differ only in the conversations where a stay decision flipped; every
other conversation has the same fragments in all of them, and a fragment's contribution to the window-exact
estimator's Φ tables (:func:`kvhit.estimate.engine.estimate_window`) depends on that fragment and the grid point
alone. So the tables of a routing are the sum over the *shared* fragments (computed once per distinct grid point t
over every routing, for one s-grid) plus the sum over its own fragments of the changed conversations.

Invariant: every table agrees with the table of the routing's whole fragment trace to rounding (the additions are
grouped differently: :func:`kvhit.estimate.displacement._phi_table_grouped`, and shared + own instead of one pass;
tested to 1e-12 relative, and the fleet curve to 1e-12 against the per-capacity estimate). Not bit for bit:
``estimate_fleet_kv_curve(..., bitwise=True)`` keeps today's kernel. Nothing is modelled here: the estimator's grids
and mathematics are those of :func:`~kvhit.estimate.engine.estimate_window`; a routing whose s-grid differs from the
first one's gets its whole table computed (still grouped)."""

from __future__ import annotations

import numpy as np

from kvhit.estimate.displacement import _phi_table_grouped
from kvhit.workload.trace import Trace

__all__ = ["SharedTables", "share_runs"]


def share_runs(trace: Trace, reps, max_changed: float = 0.2) -> list[list[int]]:
    """The routings ``reps`` (in the caller's order: ascending capacity) cut into consecutive runs that share
    tables: a run grows while the share of conversations whose replicas differ within it stays at or below
    ``max_changed`` (Dynamo's overlap destination changes a few conversations between neighbouring capacities,
    but two thirds of them over the whole curve; llm-d under load: one run)."""
    conv = trace.dense_conv().astype(np.int64)
    n_conv = int(conv.max()) + 1 if conv.size else 0
    runs: list[list[int]] = []
    first = differs = np.zeros(0, bool)  # the run's first routing and the rows where the run's routings differ
    for i, rep in enumerate(reps):
        rep = np.asarray(rep, np.int64)
        if runs:
            diff = differs | (rep != first)
            changed = np.zeros(n_conv, bool)
            changed[conv[diff]] = True
            if changed.mean() <= max_changed:
                runs[-1].append(i)
                differs = diff
                continue
        runs.append([i])
        first, differs = rep, np.zeros(rep.size, bool)
    return runs


def _select(ptr: np.ndarray, arrays, keep: np.ndarray):
    """The conversations ``keep`` (mask over ``ptr``'s conversations) of per-row arrays delimited by ``ptr``."""
    n = np.diff(ptr)
    rows = np.repeat(keep, n)
    new_ptr = np.concatenate([[0], np.cumsum(n[keep])]).astype(np.int64)
    return new_ptr, [np.ascontiguousarray(a[rows]) for a in arrays]


def _table(ptr, arrays, tg, sg):
    m = np.zeros((tg.size, sg.size))
    v = np.zeros((tg.size, sg.size))
    if ptr.size > 1:
        _phi_table_grouped(ptr, *arrays, tg, sg, m, v)
    return m, v


class SharedTables:
    """Tables for the routings ``reps`` (each a replica per row of ``trace``) of an ``R``-replica fleet:
    :meth:`for_routing` gives the ``tables`` callable :func:`kvhit.estimate.engine.estimate_window` takes."""

    def __init__(self, trace: Trace, reps, R: int):
        reps = np.asarray(reps, np.int64).reshape(len(reps), -1)
        self.R = int(R)
        self.conv = trace.dense_conv().astype(np.int64)
        n_conv = int(self.conv.max()) + 1 if self.conv.size else 0
        self.changed = np.zeros(n_conv, bool)
        self.changed[self.conv[(reps != reps[0]).any(axis=0)]] = True
        self.base = None  # (fragment ids, ptr, arrays) of the unchanged conversations' fragments
        self.sg = None
        self.cols: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    def for_routing(self, rep: np.ndarray):
        fids = np.unique(self.conv * self.R + np.asarray(rep, np.int64))  # the accounting's fragment order

        def tables(acc, tg, sg):
            arrays = (acc.offsets, acc.cum_new, acc.hist_all)
            if acc.conv_ptr.size - 1 != fids.size:  # not this routing's whole fragment trace
                return _table(acc.conv_ptr, arrays, tg, sg)
            shared = ~self.changed[fids // self.R]
            if self.base is None:
                self.base = (fids[shared], *_select(acc.conv_ptr, arrays, shared))
                self.sg = sg.copy()
            if not np.array_equal(sg, self.sg) or not np.array_equal(fids[shared], self.base[0]):
                return _table(acc.conv_ptr, arrays, tg, sg)
            missing = np.array(sorted({float(t) for t in tg} - self.cols.keys()))
            if missing.size:
                bm, bv = _table(self.base[1], self.base[2], missing, sg)
                for i, t in enumerate(missing):
                    self.cols[float(t)] = (bm[i], bv[i])
            own_ptr, own = _select(acc.conv_ptr, arrays, ~shared)
            m, v = _table(own_ptr, own, tg, sg)
            m += np.stack([self.cols[float(t)][0] for t in tg])
            v += np.stack([self.cols[float(t)][1] for t in tg])
            return m, v

        return tables
