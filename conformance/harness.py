"""The conformance harness shared by every check: the case loop, the first difference, the shrinker, the summary.

A check is an *adapter*: ``gen_case(rng)`` (a random case), ``compare(case) -> (requests compared, first
difference or None)`` (kvhit's model and the engine's own code driven side by side) and ``smaller(case)`` (the
candidate cases one step smaller, for the shrinker). :func:`run` draws ``cases`` cases from ``seed``, counts the
mismatching ones, shrinks the first to a minimal case and prints it (a negative control's first mismatching case is
printed as found), appends a JSON summary line, and returns the
exit status: 0 when the outcome is the expected one — no mismatch, or (``--expect-mismatch``, a negative control)
at least one.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def add_common_args(ap: argparse.ArgumentParser) -> None:
    """``--cases``, ``--seed``, ``--expect-mismatch`` and ``--json``: the same on every check."""
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expect-mismatch", action="store_true", help="negative control: succeed only on a mismatch")
    ap.add_argument("--json", help="append a JSON summary line to this file")


def first_difference(
    ours: Sequence[tuple], theirs: Sequence[tuple], fields: Sequence[str], ours_label: str, theirs_label: str
) -> str | None:
    """The first event whose tuples differ, naming the field (``fields[k]`` for position k), or None."""
    for i, (x, y) in enumerate(zip(ours, theirs, strict=False)):
        if x != y:
            k = next(j for j in range(len(fields)) if x[j] != y[j])
            return f"event {i} ({y[0]} r{y[1]}): {fields[k]} differs\n  {ours_label}: {x[k]}\n  {theirs_label}: {y[k]}"
    if len(ours) != len(theirs):
        return f"event count differs: {ours_label} {len(ours)}, {theirs_label} {len(theirs)}"
    return None


def shrink(case: Any, mismatches: Callable[[Any], bool], smaller: Callable[[Any], list]) -> Any:
    """Greedy delta debugging: move to the first smaller candidate that still mismatches, until none does.
    A candidate on which the comparison raises is not a witness (a case the generator would not make)."""

    def bad(c) -> bool:
        try:
            return mismatches(c)
        except Exception:
            return False

    changed = True
    while changed:
        changed = False
        for c in smaller(case):
            if bad(c):
                case, changed = c, True
                break
    return case


def drop_one(case: Any, field: str) -> list:
    """Candidates with one request removed (``field`` holds the requests; ``times``/``hold`` follow)."""
    from dataclasses import replace

    reqs = getattr(case, field)
    out = []
    if getattr(case, "hold", None) is not None:
        out.append(replace(case, times=None, hold=None))
    n = len(reqs)
    for i in range(n):
        keep = [j for j in range(n) if j != i]
        out.append(
            replace(
                case,
                **{field: tuple(reqs[j] for j in keep)},
                times=None if case.times is None else tuple(case.times[j] for j in keep),
                hold=None if case.hold is None else tuple(case.hold[j] for j in keep),
            )
        )
    return out


def run(
    args: argparse.Namespace,
    *,
    gen_case: Callable[[np.random.Generator], Any],
    compare: Callable[[Any], tuple[int, str | None]],
    smaller: Callable[[Any], list],
    title: str,
    summary: dict,
) -> int:
    """The case loop (see the module docstring); ``title`` starts the printed line, ``summary`` the JSON line."""
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    compared = mismatching = 0
    first = None
    for _ in range(args.cases):
        case = gen_case(rng)
        n, diff = compare(case)
        compared += n
        if diff is not None:
            mismatching += 1
            first = first if first is not None else case
    secs = round(time.perf_counter() - t0, 1)
    label = "negative control " if args.expect_mismatch else ""
    print(f"{label}{title}: {args.cases} cases, {compared} requests, {mismatching} mismatching cases ({secs} s)")
    if first is not None and args.expect_mismatch:
        # a negative control is expected to mismatch: its first difference is shown as found (shrinking it cost
        # most of make conformance's time on the SGLang lines, and a control's minimal case proves nothing more)
        print("first mismatching case:\n" + first.show())
        print(compare(first)[1])
    elif first is not None:
        small = shrink(first, lambda c: compare(c)[1] is not None, smaller)
        print("minimal mismatching case:\n" + small.show())
        print(compare(small)[1])
    if args.json:
        line = {
            **summary,
            "cases": args.cases,
            "seed": args.seed,
            "requests": compared,
            "mismatching_cases": mismatching,
            "negative_control": args.expect_mismatch,
            "seconds": secs,
        }
        with open(args.json, "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0 if (mismatching > 0) == args.expect_mismatch else 1
