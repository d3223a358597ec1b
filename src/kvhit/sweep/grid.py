"""The grid file of ``kvhit sweep``: reading, validation, expansion into tasks, and the seed policy.

A grid file is TOML with three tables (all keys optional except one capacity axis)::

    [sweep]
    compute = "simulate"      # estimate | simulate | curve   (default: simulate)
    seed = 0                  # grid seed (default 0)
    replications = 1          # rows per point, each with its own seed (default 1)
    retries = 2               # further attempts of a point that raised (default 2)
    model = "qwen3-8b"        # model preset (or config.json) behind hbm_gb (default qwen3-8b)
    block_size = 128          # tokens per block of spec workloads and of the hbm_gb conversion (default 128)
    conversations = 20000     # spec workloads: conversations per replication (default 20,000)
    estimates = false         # simulate/curve: also the estimator's h beside the simulated one (default false)
    tier = "native"           # with a dram_gb axis: native | simple | lmcache | hicache (default native)

    [workloads.chat]          # any number; default: one workload "sharegpt" (the bundled ShareGPT trace)
    sharegpt = true           # or: spec = "scm.toml" (plus spec flags: lam0, p, x_mean, …), trace = "t.parquet",
                              # or blocks_trace = "mooncake.jsonl" (a production trace, WEKA .json file or dir)

    [axes]                    # every combination is a point
    engine = ["content", "vllm", "vllm-0.23"]   # default ["vllm"]; also sglang (simulate/curve, N·b tokens)
    hbm_gb = [10, 20, 40]     # KV GiB of `model` (or N = [...] blocks): exactly one capacity axis
    lam0 = [0.5, 1.0, 2.0]    # conversations/s (spec and ShareGPT workloads; trace files keep their arrivals)
    replicas = [1, 2, 4]      # fleet: R replicas behind `router` (simulate/estimate, trace/ShareGPT workloads)
    router = ["round-robin", "session"]
    dram_gb = [0, 64, 256]    # host tier behind the GPU (sweep.tier: native | simple | lmcache | hicache)

With a ``dram_gb`` axis a point is :func:`kvhit.service.tiers` (``sweep.tier``, default native; vLLM for
native/simple/lmcache, SGLang for hicache — the engine axis is then left out; ``estimate`` uses the two-tier
estimator, ``estimate = "only"``). What each point computes otherwise: ``estimate`` →
:func:`kvhit.service.estimate` (spec: mean-field eq. (32), and the engine-aware estimate when an engine axis is
given) or :func:`kvhit.service.trace_estimate` (ShareGPT/trace:
the engine-aware estimator; with replicas/router axes :func:`kvhit.service.fleet_estimate_curve`, the fleet
estimate at every capacity of the grid in one call); ``simulate`` → :func:`kvhit.service.simulate` (or
:func:`kvhit.service.fleet_simulate` with replicas/router axes); ``curve`` → :func:`kvhit.service.curve` at the
capacities of the grid, one pass per (workload, λ0, replication) for every engine and capacity at once.

Seed policy (invariant): replication ``r`` of a point gets the seed :func:`derive_seed` (grid seed, workload, λ0,
r) — a hash, so it does not depend on the order of the axes, which worker ran the point, or when. The seed
deliberately does not depend on the engine or the capacity: every engine and capacity of one (workload, λ0,
replication) sees the same sampled trace (common random numbers), so differences between engines are paired. A
ShareGPT workload with an explicit ``seed`` uses ``seed + r`` (as ``kvhit simulate`` does).

NOT done here: computing anything (:mod:`.compute`), running (:mod:`.backends`), storing (:mod:`.store`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AXES",
    "ENGINES",
    "ROUTERS",
    "Grid",
    "GridError",
    "Task",
    "Workload",
    "derive_seed",
    "load_grid",
    "point_id",
]

COMPUTES = ("estimate", "simulate", "curve")
ENGINES = ("content", "vllm", "vllm-0.23", "sglang")
ROUTERS = ("round-robin", "random", "session", "sticky", "least-loaded", "dynamo", "llm-d", "sglang")
#: axes in the order of the result columns
AXES = ("engine", "N", "hbm_gb", "dram_gb", "lam0", "replicas", "router")
TIERS = ("native", "simple", "lmcache", "hicache")
SPEC_KEYS = ("lam0", "p", "mean_turns", "x_mean", "y_mean", "w_mean", "w_dist", "w_cv")
SHAREGPT_KEYS = ("seed", "warmup", "measured", "w_mean")
MAX_POINTS = 10_000_000


class GridError(ValueError):
    """A grid file the sweep refuses; ``str(e)`` is one line naming the file and the field."""


@dataclass(frozen=True)
class Workload:
    """One workload of a grid file: its name, kind (``sharegpt``, ``spec`` or ``trace``), file and options."""

    name: str
    kind: str  #: sharegpt | spec | trace
    path: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    block_size: int = 128
    digest: str = ""  #: sha256 of the file's bytes (spec/trace), part of the grid fingerprint


@dataclass(frozen=True)
class Task:
    """One unit of work: the points of one service call (estimate/curve: all capacities [and engines] of one
    combination of the other axes; simulate: one point) for one replication."""

    task_id: str
    compute: str
    workload: str
    lam0: float | None
    replication: int
    seed: int
    points: tuple[dict, ...]  #: coordinates of each point, with ``point_id``
    shipped: str  #: the shipped workload the task reads (:func:`shipped_key`)


@dataclass
class Grid:
    """A parsed, validated grid file: workloads, axes, what each point computes, seed and replications."""

    path: Path
    compute: str
    seed: int
    replications: int
    retries: int
    model: str
    block_size: int
    conversations: int
    workloads: dict[str, Workload]
    axes: dict[str, list]
    bytes_per_block: int = 0
    estimates: bool = False
    tier: str = "native"

    def points(self) -> list[dict]:
        """Every point (combination of axis values, per workload), in a fixed order, with its ``point_id``."""
        out = []
        names = [a for a in AXES if a in self.axes]
        for wname, wl in self.workloads.items():
            for combo in itertools.product(*(self.axes[a] for a in names)):
                c: dict[str, Any] = {"workload": wname, **dict(zip(names, combo, strict=True))}
                if "dram_gb" in c:  # the tier's engine
                    c["engine"] = "sglang" if self.tier == "hicache" else "vllm"
                elif self.compute != "estimate" or wl.kind != "spec":
                    c.setdefault("engine", "vllm")  # a spec's estimate without engines: the mean-field h
                if "hbm_gb" in c:
                    c["N"] = self.blocks(c["hbm_gb"], wl.block_size)
                c["point_id"] = point_id(c)
                out.append(c)
        return out

    def blocks(self, gib: float, block_size: int) -> int:
        """KV blocks of ``gib`` GiB of the grid's model (:func:`kvhit.plan.hardware.blocks_from_bytes`)."""
        from kvhit.plan import hardware, model_config

        model = model_config.resolve_model(self.model)
        return max(1, int(hardware.blocks_from_bytes(hardware.gb_to_bytes(gib), model.bytes_per_block(block_size))))

    def tasks(self) -> list[Task]:
        """The points grouped into service calls, times the replications (see :class:`Task`)."""
        groups: dict[tuple, list[dict]] = {}
        for p in self.points():
            if self.compute == "simulate" or "dram_gb" in p:
                key = (p["point_id"],)
            else:  # all capacities (curve: and engines) of one combination of the other axes: one service call
                drop = {"N", "hbm_gb", "point_id"} | ({"engine"} if self.compute == "curve" else set())
                key = tuple(sorted((k, str(v)) for k, v in p.items() if k not in drop))
            groups.setdefault(key, []).append(p)
        tasks = []
        for pts in groups.values():
            p0 = pts[0]
            wl = self.workloads[p0["workload"]]
            for r in range(self.replications):
                seed = workload_seed(self.seed, wl, p0.get("lam0"), r)
                tid = hashlib.blake2b(
                    json.dumps([sorted(x["point_id"] for x in pts), r]).encode(), digest_size=8
                ).hexdigest()
                key = shipped_key(p0["workload"], p0.get("lam0"), r, wl.kind)
                tasks.append(Task(tid, self.compute, p0["workload"], p0.get("lam0"), r, seed, tuple(pts), key))
        return tasks

    def fingerprint(self) -> str:
        """What the results of a point depend on besides its coordinates: settings and workload contents. A
        ``--resume`` into a directory of another fingerprint is refused; adding axis values is allowed."""
        d = {
            "compute": self.compute,
            "seed": self.seed,
            "model": self.model,
            "block_size": self.block_size,
            "conversations": self.conversations,
            "estimates": self.estimates,
            "tier": self.tier,
            "workloads": {
                n: {"kind": w.kind, "options": w.options, "digest": w.digest, "block_size": w.block_size}
                for n, w in sorted(self.workloads.items())
            },
        }
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def shipped_key(workload: str, lam0: float | None, replication: int, kind: str) -> str:
    """ShareGPT traces are built per (λ0, replication); specs and trace files are shipped once each."""
    if kind == "sharegpt":
        return f"{workload}|lam0={lam0!r}|r={replication}"
    return workload


def point_id(coords: dict) -> str:
    """A stable id of a point's coordinates (16 hex digits)."""
    c = {k: v for k, v in coords.items() if k != "point_id"}
    return hashlib.blake2b(json.dumps(c, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def derive_seed(grid_seed: int, *parts: Any) -> int:
    """A 63-bit seed from the grid seed and coordinates: ``blake2b`` of their canonical JSON, independent of
    the order in which points run and of the worker."""
    h = hashlib.blake2b(json.dumps([grid_seed, *parts], sort_keys=True, default=str).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big") & (2**63 - 1)


def workload_seed(grid_seed: int, wl: Workload, lam0: float | None, r: int) -> int:
    """The seed of replication ``r`` of a workload at λ0: a hash of the grid seed, the workload, λ0 and r (a
    ShareGPT workload's own ``seed`` option plus r), independent of worker and order."""
    if wl.kind == "sharegpt" and "seed" in wl.options:
        return int(wl.options["seed"]) + r
    return derive_seed(grid_seed, wl.name, lam0, r)


# -- reading and validation --------------------------------------------------------------------------------------


def load_grid(path: str | Path) -> Grid:
    """Read and validate a grid file; every refusal is a :class:`GridError` naming the file and the field."""
    path = Path(path)
    where = str(path)

    def fail(msg: str) -> None:
        raise GridError(f"{where}: {msg}")

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GridError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise GridError(f"{where}: is a directory, expected a grid TOML file") from None
    except UnicodeDecodeError as e:
        raise GridError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise GridError(f"{where}: invalid TOML: {e}") from None
    _unknown(data, ("sweep", "workloads", "axes"), "", fail)
    sw = _table(data.get("sweep", {}), "sweep", fail)
    _unknown(
        sw,
        ("compute", "seed", "replications", "retries", "model", "block_size", "conversations", "estimates", "tier"),
        "sweep.",
        fail,
    )
    compute = sw.get("compute", "simulate")
    if compute not in COMPUTES:
        fail(f"sweep.compute: must be one of {', '.join(COMPUTES)} (got {compute!r})")
    seed = _int(sw.get("seed", 0), "sweep.seed", 0, 2**63 - 1, fail)
    reps = _int(sw.get("replications", 1), "sweep.replications", 1, 10_000, fail)
    retries = _int(sw.get("retries", 2), "sweep.retries", 0, 100, fail)
    block_size = _int(sw.get("block_size", 128), "sweep.block_size", 1, 2**16, fail)
    conversations = _int(sw.get("conversations", 20_000), "sweep.conversations", 1, 10**8, fail)
    estimates = sw.get("estimates", False)
    if not isinstance(estimates, bool):
        fail(f"sweep.estimates: must be true or false (got {estimates!r})")
    model = sw.get("model", "qwen3-8b")
    if not isinstance(model, str) or not model:
        fail(f"sweep.model: must be a model preset name or a config.json path (got {model!r})")

    workloads = _workloads(data.get("workloads"), path.parent, block_size, fail)
    axes = _axes(_table(data.get("axes", {}), "axes", fail), fail)
    grid = Grid(path, compute, seed, reps, retries, model, block_size, conversations, workloads, axes)
    grid.estimates = estimates
    grid.tier = sw.get("tier", "native")
    if grid.tier not in TIERS:
        fail(f"sweep.tier: must be one of {', '.join(TIERS)} (got {grid.tier!r})")
    if "tier" in sw and "dram_gb" not in axes:
        fail("sweep.tier: applies to a dram_gb axis (none given)")
    _check_combinations(grid, fail)
    _check_combinations(grid, fail)
    from kvhit.plan import model_config

    try:  # always: an unknown model is refused before any point runs, whichever capacity axis is given
        m = model_config.resolve_model(model if not model.endswith(".json") else str(path.parent / model))
    except (ValueError, OSError) as e:
        fail(f"sweep.model: {e}")
    if "hbm_gb" in axes or "dram_gb" in axes:
        grid.model = m.name if not model.endswith(".json") else str(path.parent / model)
        grid.bytes_per_block = m.bytes_per_block(block_size)
    n = len(workloads) * math.prod(len(v) for v in axes.values())
    if n * reps > MAX_POINTS:
        fail(f"axes: {n:,} points × {reps} replications exceed {MAX_POINTS:,} rows; split the grid")
    return grid


def _unknown(d: dict, allowed: tuple[str, ...], prefix: str, fail) -> None:
    for k in d:
        if k not in allowed:
            fail(f"{prefix}{k}: unknown field (allowed: {', '.join(allowed)})")


def _table(v: Any, name: str, fail) -> dict:
    if not isinstance(v, dict):
        fail(f"{name}: must be a table")
    return v


def _int(v: Any, name: str, lo: int, hi: int, fail) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        fail(f"{name}: must be an integer (got {v!r})")
    if not lo <= v <= hi:
        fail(f"{name}: must be in [{lo:,}, {hi:,}] (got {v:,})")
    return v


def _num(v: Any, name: str, fail, *, lo: float = 0.0, hi: float = 2**40, open_lo: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        fail(f"{name}: must be a finite number (got {v!r})")
    if (v <= lo if open_lo else v < lo) or v > hi:
        fail(f"{name}: must be in {'(' if open_lo else '['}{lo:g}, {hi:g}] (got {v!r})")
    return float(v)


def _digest(p: Path, name: str, fail, allow_dir: bool = False) -> str:
    try:
        h = hashlib.sha256()
        files = sorted(f for f in p.rglob("*") if f.is_file()) if allow_dir and p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(p) if f != p else f.name).encode())
            with f.open("rb") as fh:
                for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    h.update(chunk)
        return h.hexdigest()
    except FileNotFoundError:
        fail(f"{name}: {p}: no such file")
    except IsADirectoryError:
        fail(f"{name}: {p}: is a directory, expected a file")
    except PermissionError:
        fail(f"{name}: {p}: permission denied")
    return ""


def _workloads(raw: Any, base: Path, block_size: int, fail) -> dict[str, Workload]:
    if raw is None:
        return {"sharegpt": Workload("sharegpt", "sharegpt", block_size=block_size)}
    _table(raw, "workloads", fail)
    if not raw:
        fail("workloads: empty; name at least one workload (or leave the table out for ShareGPT)")
    out = {}
    for name, w in raw.items():
        where = f"workloads.{name}"
        _table(w, where, fail)
        kinds = [k for k in ("sharegpt", "spec", "trace", "blocks_trace") if k in w]
        if len(kinds) != 1:
            fail(
                f"{where}: give exactly one of sharegpt = true, spec = FILE, trace = FILE, blocks_trace = FILE|DIR "
                f"(got {kinds or 'none'})"
            )
        kind = kinds[0]
        opts = {k: v for k, v in w.items() if k != kind}
        if kind == "sharegpt":
            if w["sharegpt"] is not True:
                fail(f"{where}.sharegpt: must be true (got {w['sharegpt']!r})")
            _unknown(opts, SHAREGPT_KEYS, where + ".", fail)
            if "seed" in opts:
                _int(opts["seed"], where + ".seed", 0, 2**62, fail)
            if "warmup" in opts:
                _int(opts["warmup"], where + ".warmup", 0, 10**7, fail)
            if "measured" in opts:
                _int(opts["measured"], where + ".measured", 1, 10**7, fail)
            if "w_mean" in opts:
                _num(opts["w_mean"], where + ".w_mean", fail)
            out[name] = Workload(name, kind, None, opts, block_size)
            continue
        if not isinstance(w[kind], str) or not w[kind]:
            fail(f"{where}.{kind}: must be a file path (got {w[kind]!r})")
        p = Path(w[kind])
        p = p if p.is_absolute() else base / p
        digest = _digest(p, f"{where}.{kind}", fail, allow_dir=kind == "blocks_trace")
        if kind == "spec":
            _unknown(opts, SPEC_KEYS, where + ".", fail)
            from kvhit.service import InputError, SpecFields, build, load_spec

            try:  # validated once here, with the service's own spec reader
                load_spec(build(SpecFields, spec=p, **opts))
            except InputError as e:
                fail(f"{where}: {e}")
            out[name] = Workload(name, kind, p, opts, block_size, digest)
        elif kind == "trace":
            _unknown(opts, (), where + ".", fail)
            bs = _trace_block_size(p, where, fail)
            out[name] = Workload(name, kind, p, {}, bs, digest)
        else:  # a production block-id trace at its own arrival times (Mooncake .jsonl, WEKA .json file or dir)
            _unknown(opts, (), where + ".", fail)
            from kvhit.service import InputError
            from kvhit.service.inputs import read_blocks_trace

            try:
                pt = read_blocks_trace(p, "sequential", None, None, 0)
            except InputError as e:
                fail(f"{where}.blocks_trace: {e}")
            out[name] = Workload(name, kind, p, {}, int(pt.block_size), digest)
    return out


def _trace_block_size(p: Path, where: str, fail) -> int:
    from kvhit.service import InputError
    from kvhit.service.inputs import read_trace

    try:
        tr = read_trace(p, f"{where}.trace")
    except InputError as e:
        fail(str(e))
    return int(tr.block_size or 128)


def _axes(ax: dict, fail) -> dict[str, list]:
    _unknown(ax, AXES, "axes.", fail)
    out: dict[str, list] = {}
    for k, v in ax.items():
        if not isinstance(v, list) or not v:
            fail(f"axes.{k}: must be a non-empty list of values (got {v!r})")
        if len(set(map(repr, v))) != len(v):
            fail(f"axes.{k}: repeated value")
        name = f"axes.{k}"
        if k == "engine":
            for e in v:
                if e not in ENGINES:
                    fail(f"{name}: unknown engine {e!r} (known: {', '.join(ENGINES)})")
        elif k == "router":
            for e in v:
                if e not in ROUTERS:
                    fail(f"{name}: unknown router {e!r} (known: {', '.join(ROUTERS)})")
        elif k in ("N",):
            v = [_int(x, name, 1, 2**40, fail) for x in v]
        elif k == "replicas":
            v = [_int(x, name, 1, 4096, fail) for x in v]
        elif k == "hbm_gb":
            v = [_num(x, name, fail, hi=2**20) for x in v]
        elif k == "dram_gb":
            v = [_num(x, name, fail, hi=2**20, open_lo=False) for x in v]
        elif k == "lam0":
            v = [_num(x, name, fail, hi=1e9) for x in v]
        out[k] = list(v)
    if ("N" in out) == ("hbm_gb" in out):
        fail("axes: give exactly one capacity axis, N (blocks) or hbm_gb (GiB of sweep.model)")
    return out


def _check_combinations(g: Grid, fail) -> None:
    engines = g.axes.get("engine", ["vllm"])
    fleet = "replicas" in g.axes or "router" in g.axes
    kinds = {w.kind for w in g.workloads.values()}
    if fleet:
        if g.compute == "curve":
            fail("axes.replicas/router: fleets have no one-pass curve; set sweep.compute = 'simulate' or 'estimate'")
        if g.compute == "estimate" and "blocks_trace" in kinds:
            fail(
                "axes.replicas/router: a blocks_trace fleet's estimate is a mean of exact replays per capacity; "
                "set sweep.compute = 'simulate' (with estimates = true)"
            )
        bad = [e for e in engines if e not in ("vllm", "vllm-0.23")]
        if bad:
            fail(f"axes.engine: a fleet's replicas are vllm or vllm-0.23 (got {bad[0]!r})")
        if "spec" in kinds:
            fail("axes.replicas/router: fleets replay a trace; spec workloads are not supported (use a trace)")
    if "dram_gb" in g.axes:
        if "engine" in g.axes:
            fail(f"axes.engine: with dram_gb the engine is the tier's (sweep.tier = {g.tier!r}); leave engine out")
        if fleet:
            fail("axes.dram_gb: host tiers behind a fleet are not modelled; drop replicas/router or dram_gb")
        if "spec" in kinds:
            fail("axes.dram_gb: host tiers replay a trace; spec workloads are not supported (use a trace)")
        if g.compute == "curve":
            fail("axes.dram_gb: no one-pass curve over host tiers; set sweep.compute = 'simulate' or 'estimate'")
        if g.compute == "estimate" and g.tier == "hicache":
            fail("sweep.tier: hicache has no two-tier estimator; set sweep.compute = 'simulate'")
    if "lam0" in g.axes and kinds & {"trace", "blocks_trace"}:
        name = next(n for n, w in g.workloads.items() if w.kind in ("trace", "blocks_trace"))
        fail(f"axes.lam0: a trace file has fixed arrival times; workload {name!r} cannot vary λ0")
    if "lam0" in g.axes:
        for n, w in g.workloads.items():
            if "lam0" in w.options:
                fail(f"workloads.{n}.lam0: also an axis; give λ0 in one place")
    if "blocks_trace" in kinds and "content" in engines:
        fail("axes.engine: content (Algorithm 1) needs conversations; a blocks_trace workload has requests only")
    if g.compute == "estimate":
        if "sglang" in engines:
            fail("axes.engine: sglang has no estimator; use sweep.compute = 'simulate' or 'curve'")
        if "content" in engines and kinds & {"sharegpt", "trace"}:
            fail("axes.engine: the trace estimator covers vllm and vllm-0.23; content needs a spec workload")
