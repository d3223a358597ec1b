"""The package layout of issue 21: data flows one way, nothing imports in a circle, old paths still import.

The contracts live in pyproject.toml (``[tool.importlinter]``) and are checked here with import-linter's own
engine, so ``make test`` (and ``make lint``) fail on an upward import or a new circle.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from kvhit import _compat

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 kept, 0 broken" in r.stdout


def test_contract_catches_an_upward_import(tmp_path):
    """Negative control: a copy of the package with one upward import (sim → service) must break the layers."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "kvhit", src / "kvhit", ignore=shutil.ignore_patterns("__pycache__"))
    p = src / "kvhit" / "sim" / "metrics.py"
    p.write_text(p.read_text() + "\nfrom kvhit.service import errors as _upward  # noqa: E402,F401\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    exe = Path(sys.executable).with_name("lint-imports")
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([str(exe), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0
    assert "kvhit.sim is not allowed to import kvhit.service" in r.stdout


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("kvhit.estimate_agentic", "kvhit.estimate.agentic"),
        ("kvhit.sim.block", "kvhit.sim.vllm.block"),
        ("kvhit.sim.fleet", "kvhit.fleet.simulate"),
        ("kvhit.hardware", "kvhit.plan.hardware"),
        ("kvhit.sim.engines.sglang", "kvhit.sim.sglang.engine"),
    ],
)
def test_old_paths_are_the_new_modules_with_a_deprecation_warning(old, new):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mod = importlib.import_module(old)
    assert any(issubclass(x.category, DeprecationWarning) and new in str(x.message) for x in w)
    if old in ("kvhit.estimate_agentic", "kvhit.hardware"):  # split later: names looked up in the new modules
        assert mod is not importlib.import_module(new)
        return
    assert mod is importlib.import_module(new)


@pytest.mark.parametrize(
    ("old", "names"),
    [
        ("kvhit.hardware", ("resolve_model", "ModelKV", "get_model", "list_models", "dtype_bytes", "HardwareError",
                            "blocks_from_gb", "kv_capacity_blocks", "Accelerator", "model_from_config")),
        ("kvhit.estimate_agentic", ("estimate_trace", "compound_poisson_cdf", "AgenticEstimate", "AgenticError")),
    ],
)  # fmt: skip
def test_old_paths_of_split_modules_keep_their_public_names(old, names):
    """A module split after the layout move: its old path still resolves every public name it had (in the module
    that now holds it), and an unknown name is refused."""
    sys.modules.pop(old, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mod = importlib.import_module(old)
    for n in names:
        got = getattr(mod, n)
        homes = [importlib.import_module(h) for h in _compat.SPLIT[old]]
        assert any(getattr(h, n, None) is got for h in homes), n
    assert set(names) <= set(dir(mod))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018


def test_old_public_names_of_modules_that_became_packages():
    from kvhit.estimate import estimate_engine
    from kvhit.estimate.engine import estimate_engine as new_est
    from kvhit.plan import make_workload
    from kvhit.plan.planner import make_workload as new_mw
    from kvhit.sim import simulate_content
    from kvhit.sim.content.lru import simulate_content as new_sc

    assert estimate_engine is new_est and make_workload is new_mw and simulate_content is new_sc
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        importlib.import_module("kvhit.estimate").nope  # noqa: B018


def test_lazy_name_wins_over_a_submodule_of_the_same_spelling():
    """``kvhit.workload.generate`` is the generator function even after the submodule of that name was imported
    by something else first (as the eager package had it; the README quickstart relies on it)."""
    code = (
        "import kvhit.sim.runner\n"
        "from kvhit.workload import generate\n"
        "import inspect; assert inspect.isfunction(generate), generate\n"
        "import sys; assert sys.modules['kvhit.workload.generate'].generate is generate\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
