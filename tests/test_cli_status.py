"""Issue 21: a cold ShareGPT tokenization (``kvhit trace sharegpt``, minutes with ``--token-ids`` on a loaded
machine) is never silent — where stderr is not a terminal (a pipe, a log) it writes status lines there; a warm
cache writes none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sharegpt(tmp_path: Path, out: str) -> subprocess.CompletedProcess:
    args = ["trace", "sharegpt", "--source", "tests/data/sharegpt_small.jsonl", "--warmup", "1", "--measured", "1"]
    args += ["--token-ids", "--cache-dir", str(tmp_path / "cache"), "-o", str(tmp_path / out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "kvhit.cli", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300
    )


def test_cold_tokenization_writes_status_lines_on_a_pipe(tmp_path):
    cold = _sharegpt(tmp_path, "a.parquet")
    assert cold.returncode == 0, cold.stderr
    status = [ln for ln in cold.stderr.splitlines() if ln.startswith("tokenizing ShareGPT")]
    assert status, cold.stderr
    assert "(0%)" in status[0] and "(100%)" in status[-1]
    assert "wrote" in cold.stdout  # the report stays on stdout
    warm = _sharegpt(tmp_path, "b.parquet")
    assert warm.returncode == 0 and "tokenizing ShareGPT" not in warm.stderr
