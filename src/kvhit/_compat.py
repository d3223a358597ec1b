"""Old module paths (kvhit ≤ 0.1, before the layout of issue 21) kept importable for one release.

Each old path is an alias of the module that now holds the code — ``import kvhit.sim.block`` returns the very
module object ``kvhit.sim.vllm.block`` (so monkeypatching either patches both) and warns once with a
:class:`DeprecationWarning` naming the new path. Installed by ``import kvhit``; removed in the next release.

Old modules that became packages of the same name (``kvhit.estimate``, ``kvhit.plan``, ``kvhit.plots``,
``kvhit.sim.content``) re-export their old public names from the package instead (lazily, PEP 562).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings

#: old module path → new module path
MOVED: dict[str, str] = {
    "kvhit.compute": "kvhit.plan.compute",
    "kvhit.displacement": "kvhit.estimate.displacement",
    "kvhit.estimate_agentic": "kvhit.estimate.agentic",
    "kvhit.estimate_fleet": "kvhit.fleet.estimate",
    "kvhit.estimate_sglang": "kvhit.estimate.sglang",
    "kvhit.estimate_sglang_agentic": "kvhit.estimate.sglang_agentic",
    "kvhit.estimate_tiers": "kvhit.estimate.tiers",
    "kvhit.fleet_plot": "kvhit.plots.fleet",
    "kvhit.hardware": "kvhit.plan.hardware",
    "kvhit.hashing": "kvhit.workload.hashing",
    "kvhit.intmap": "kvhit.workload.intmap",
    "kvhit.plan_fleet": "kvhit.fleet.plan",
    "kvhit.plan_sglang": "kvhit.plan.sglang",
    "kvhit.plan_tiers": "kvhit.plan.tiers",
    "kvhit.sim.block": "kvhit.sim.vllm.block",
    "kvhit.sim.block_reference": "kvhit.sim.vllm.reference",
    "kvhit.sim.blockcurve": "kvhit.sim.vllm.curve",
    "kvhit.sim.blockids": "kvhit.sim.vllm.blockids",
    "kvhit.sim.engines.sglang": "kvhit.sim.sglang.engine",
    "kvhit.sim.engines.vllm": "kvhit.sim.vllm.engine",
    "kvhit.sim.fleet": "kvhit.fleet.simulate",
    "kvhit.sim.fleet_reference": "kvhit.fleet.reference",
    "kvhit.sim.radix": "kvhit.sim.sglang.radix",
    "kvhit.sim.radixrun": "kvhit.sim.sglang.run",
    "kvhit.sim.reference": "kvhit.sim.content.reference",
    "kvhit.sim.routers": "kvhit.fleet.routers",
    "kvhit.sim.stackdist": "kvhit.sim.content.stackdist",
    "kvhit.sim.streams": "kvhit.sim.sglang.streams",
    "kvhit.theory": "kvhit.estimate.theory",
    "kvhit.tiers_plot": "kvhit.plots.tiers",
}


#: old paths of modules later split in several (issue 21's "one concept per file"): the old path is a module that
#: looks each name up in these, in order — no longer the very module object, so monkeypatch the new module instead
SPLIT: dict[str, tuple[str, ...]] = {
    "kvhit.estimate_agentic": (
        "kvhit.estimate.agentic",
        "kvhit.estimate.agentic_displacement",
        "kvhit.estimate.agentic_footprint",
    ),
    "kvhit.hardware": ("kvhit.plan.hardware", "kvhit.plan.model_kv", "kvhit.plan.model_config"),
}


def _split_module(old: str) -> types.ModuleType:
    """A module whose attributes are those of :data:`SPLIT`'s modules for ``old`` (first found wins)."""
    homes = SPLIT[old]
    mod = types.ModuleType(old, f"Deprecated: {old}'s names now live in {', '.join(homes)}.")

    def __getattr__(name: str):
        for h in homes:
            m = importlib.import_module(h)
            if hasattr(m, name):
                return getattr(m, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({n for h in homes for n in dir(importlib.import_module(h))})

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    mod.__dir__ = __dir__  # type: ignore[method-assign]
    return mod


class _AliasFinder:
    """A meta path finder and loader (the protocols, without importing ``importlib.abc``: ``import kvhit`` stays
    cheap) that resolves an old module path to its new module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return None  # a placeholder module; exec_module swaps in the real one

    def exec_module(self, module) -> None:
        old = module.__name__
        new = MOVED[old]
        warnings.warn(
            f"{old} moved to {new} (issue 21 layout); the old path is removed in the next release",
            DeprecationWarning,
            stacklevel=3,
        )
        sys.modules[old] = _split_module(old) if old in SPLIT else importlib.import_module(new)


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.append(_AliasFinder())


class _LazyPackage(types.ModuleType):
    """A package whose lazily exported names win over its submodules of the same spelling, as they did when the
    package imported them eagerly (``kvhit.workload.generate`` is the function, not the module): the import system
    binds a submodule as an attribute of its package on first import, and that binding is declined here."""

    def __setattr__(self, attr: str, value) -> None:
        lazy = self.__dict__.get("_lazy_names", ())
        if attr in lazy and isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{attr}":
            return
        super().__setattr__(attr, value)


def lazy_exports(module_name: str, names: dict[str, str]):
    """A PEP 562 ``__getattr__`` for a package that re-exports ``names`` (public name → defining module) lazily.
    A name spelled like one of the package's submodules still means the exported object (:class:`_LazyPackage`)."""
    pkg = sys.modules[module_name]
    pkg._lazy_names = frozenset(names)
    pkg.__class__ = _LazyPackage

    def __getattr__(attr: str):
        target = names.get(attr)
        if target is None:
            raise AttributeError(f"module {module_name!r} has no attribute {attr!r}")
        value = getattr(importlib.import_module(target), attr)
        setattr(sys.modules[module_name], attr, value)
        return value

    return __getattr__
