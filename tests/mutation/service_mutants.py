"""Hand-made mutation pass over the service layer (``src/kvhit/service``, plus the two planted ``plan.py`` bugs of
issue 10): plant one bug at a time in a copy of
``src``, run the CLI tests against it, and report which planted bugs no test notices (survivors).

Run (minutes; not part of ``make test``)::

    .venv/bin/python tests/mutation/service_mutants.py            # all mutants
    .venv/bin/python tests/mutation/service_mutants.py 3 7        # some of them

Each mutant is (file, the exact source text, its replacement, what the bug means). A mutant whose text is not
found is reported as ``stale`` (the code moved on): update the list rather than ignoring it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = [
    "tests/test_service.py",
    "tests/test_cli_numbers.py",
    "tests/test_cli_refusals.py",
    "tests/test_cli.py",
    "tests/test_cli_property.py",
    "tests/test_readme.py::test_every_option_states_unit_range_and_default",
]

MUTANTS: list[tuple[str, str, str, str]] = [
    # the two planted bugs issue 10 reports the whole suite missed (library, pinned now by tests/test_cli_numbers.py)
    (
        "plan/planner.py",
        "p.verify = _verify(wl, cap.N, p.h_at_capacity)",
        "p.verify = _verify(wl, cap.N // 2, p.h_at_capacity)",
        "issue 10: verify simulates at half the planned capacity",
    ),
    (
        "plan/planner.py",
        "p.saved_prefill_tokens_per_s = p.h_at_capacity * wl.lam0 * wl.prompt_tokens_per_conv",
        "p.saved_prefill_tokens_per_s = p.h_at_capacity * wl.prompt_tokens_per_conv",
        "issue 10: prefill saved without λ0",
    ),
    ("service/base.py", "    if need > have:", "    if need > have * 1000:", "memory check a thousand times too lax"),
    ("service/base.py", "return x if math.isfinite(x) else None", "return x", "NaN/inf leak into JSON"),
    (
        "service/base.py",
        "where = model.flag(field) if field else model.__name__",
        "where = field or model.__name__",
        "errors name the field, not the flag",
    ),
    ("service/spec.py", "cv = 1.0 if req.w_cv is None else req.w_cv", "cv = 1.0", "--w-cv ignored"),
    (
        "service/spec.py",
        "        if self.spec is not None:\n            raise InputError(",
        "        if False:\n            raise InputError(",
        "--trace with --spec accepted",
    ),
    (
        "service/simulate.py",
        "n_warm = req.warmup if req.warmup is not None else max(1, conversations // 5)",
        "n_warm = req.warmup if req.warmup is not None else max(1, conversations // 4)",
        "spec warm-up 25% not 20%",
    ),
    (
        "service/simulate.py",
        "tr = generate(sp, req.seed + r,",
        "tr = generate(sp, req.seed,",
        "replications reuse one seed",
    ),
    (
        "service/simulate.py",
        'weighting = req.weighting or "practical"',
        'weighting = req.weighting or "base"',
        "default weighting base",
    ),
    (
        "service/simulate.py",
        '"h": hp if practical else hb,',
        '"h": hb if practical else hp,',
        "estimate beside the wrong metric",
    ),
    (
        "service/simulate.py",
        "_add_engine_estimates(est, sp, Ns, req.policy, req.engine, req.block_size or 128)",
        "_add_engine_estimates(est, sp, Ns, req.policy, req.engine, req.block_size or 64)",
        "engine estimate at b=64 (equivalent: a sampled spec has T_j = R_j·b − 1, so ⌊T/b⌋, ⌈T/b⌉ do not depend on b)",
    ),
    (
        "service/simulate.py",
        'production_rows(pt, Ns, ["vllm", "vllm-0.23"], warmup_time=req.warmup_time)',
        'production_rows(pt, Ns, ["vllm", "vllm-0.23"], warmup_time=None)',
        "--warmup-time ignored on production traces",
    ),
    (
        "service/inputs.py",
        'n_warm = warmup if warmup is not None else int(tr.meta.get("n_warm", 0))',
        "n_warm = warmup if warmup is not None else 0",
        "trace's n_warm ignored",
    ),
    (
        "service/inputs.py",
        "    if n_warm >= tr.n_conversations:",
        "    if n_warm > tr.n_conversations:",
        "warm-up of the whole trace accepted",
    ),
    ("service/plan.py", 'return metric or "tokens"', 'return metric or "blocks"', "vLLM plans in blocks by default"),
    (
        "service/plan.py",
        '"gain": res.h_at_capacity - h_other',
        '"gain": h_other - res.h_at_capacity',
        "gain sign flipped",
    ),
    (
        "service/plan.py",
        "lam0 = req.lam0 if req.trace is not None else None",
        "lam0 = None",
        "--lam0 with --trace ignored",
    ),
    (
        "service/plan.py",
        '        check_capacity_memory(cap.N, "--gpu" if req.accelerator else "--kv-gb")\n',
        "",
        "plan capacity memory unchecked",
    ),
    (
        "service/kv.py",
        "return 0.9 if self.gpu_memory_utilization is None else self.gpu_memory_utilization",
        "return 0.8 if self.gpu_memory_utilization is None else self.gpu_memory_utilization",
        "util default 0.8",
    ),
    (
        "service/kv.py",
        "        if self.gpu_memory_utilization is not None and self.accelerator is None:\n",
        "        if False:\n",
        "--gpu-memory-utilization with --kv-gb accepted",
    ),
    (
        "service/kv.py",
        "out.N, out.kv_gib, out.accelerator = c.N, c.kv_gib, c.accelerator",
        "out.N, out.kv_gib, out.accelerator = c.N - 1, c.kv_gib, c.accelerator",
        "N off by one",
    ),
    (
        "service/estimate.py",
        "est = spec_estimates(sp, req.N, True)",
        "est = spec_estimates(sp, req.N, False)",
        "h = base instead of practical",
    ),
    (
        "service/estimate.py",
        'e[f"h_engine_{metric}"] = float(v)',
        'e[f"h_engine_{metric}"] = float(v) * 0.999',
        "engine estimate scaled",
    ),
    (
        "service/curve.py",
        "np.unique(np.geomspace(n_min, hi, points).astype(np.int64))",
        "np.unique(np.linspace(n_min, hi, points).astype(np.int64))",
        "linear grid",
    ),
    (
        "service/curve.py",
        '            raise InputError(f"--policies: unknown {bad} (content, vllm, vllm-0.23)")',
        "            pass",
        "unknown policy accepted here",
    ),
    (
        "service/traces.py",
        "mask = conv_ids >= n_warm if n_warm > 0",
        "mask = conv_ids > n_warm if n_warm > 0",
        "stats skip one conversation too many",
    ),
    (
        "service/traces.py",
        '    check_output_file(req.out, "--out")\n    if (req.conversations',
        "    if (req.conversations",
        "generate -o not checked first",
    ),
    ("service/traces.py", "    if n_warm >= n_conv:", "    if n_warm > n_conv:", "stats warm-up of the whole trace"),
    (
        "service/runs.py",
        "N_is_paper_default=N == PAPER_N",
        "N_is_paper_default=True",
        "demo always claims the paper's N",
    ),
    ("service/runs.py", '    check_output_dir(req.out, "--out")\n', "", "reproduce -o checked after computing"),
    (
        "service/io.py",
        "        Path(tmp).unlink(missing_ok=True)\n        raise",
        "        raise",
        "temporary left on error",
    ),
    ("service/io.py", "    return base & ~mask", "    return 0o600", "umask ignored"),
    ("service/io.py", "        if t.is_dir():\n", "        if False:\n", "output path that is a directory accepted"),
    (
        "service/errors.py",
        'return "; ".join(parts) if parts else "invalid input"',
        'return "\\n".join(parts) if parts else "invalid input"',
        "multi-line errors",
    ),
    (
        "service/common.py",
        "Capacity = Annotated[int, Field(ge=1, le=MAX_N)]",
        "Capacity = Annotated[int, Field(ge=0, le=MAX_N)]",
        "capacity 0 accepted",
    ),
    (
        "service/errors.py",
        "    except OverflowError as e:",
        "    except ArithmeticError as e:\n        raise\n    except OverflowError as e:",
        "overflow becomes a traceback",
    ),
]


def run(i: int, m: tuple[str, str, str, str], py: str) -> tuple[str, float, str]:
    fname, old, new, what = m
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "src"
        shutil.copytree(ROOT / "src", src)
        f = src / "kvhit" / fname
        text = f.read_text()
        if old not in text:
            return "stale", 0.0, ""
        f.write_text(text.replace(old, new, 1))
        env = dict(os.environ, PYTHONPATH=str(src), NUMBA_CACHE_DIR=str(ROOT / ".numba_cache"), MPLBACKEND="Agg")
        t0 = time.perf_counter()
        p = subprocess.run(
            [py, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p", "no:cacheprovider", *TESTS],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        first = next((ln for ln in p.stdout.splitlines() if ln.startswith("FAILED")), "")
        return ("killed" if p.returncode != 0 else "SURVIVED"), time.perf_counter() - t0, first


def main(argv: list[str]) -> int:
    which = [int(a) for a in argv] or list(range(len(MUTANTS)))
    survivors = 0
    for i in which:
        status, secs, first = run(i, MUTANTS[i], sys.executable)
        survivors += status == "SURVIVED"
        print(f"{i:2d} {status:8s} {secs:6.1f}s  {MUTANTS[i][0]:20s} {MUTANTS[i][3]}  {first[:90]}", flush=True)
    print(f"{len(which)} mutants, {survivors} survived")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
