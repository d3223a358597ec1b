"""Outputs people can trust: figures are byte-reproducible and every written file follows the umask."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from kvhit.plots import plot_curves, plot_fig2
from kvhit.workload import WorkloadSpec, generate


def _curves():
    N = np.geomspace(64, 50_000, 50).astype(np.int64)
    return {
        "Algorithm 1 (content LRU)": (N, 1 - np.exp(-N / 2e4)),
        "estimate: vLLM ≥ 0.24": (N, 1 - np.exp(-N / 2.1e4)),
    }


def _draw(prefix):
    return plot_curves(
        _curves(), prefix, h_max=0.9, bytes_per_block=18 << 20, model="Qwen3-8B", budget_N=2275, N_min=300
    )


def test_svg_and_png_are_byte_identical_across_runs(tmp_path):
    a = _draw(tmp_path / "a")
    b = _draw(tmp_path / "b")
    for pa, pb in zip(a, b, strict=True):
        assert open(pa, "rb").read() == open(pb, "rb").read(), pa
    svg = open(a[1], encoding="utf-8").read()
    assert "<dc:date>" not in svg  # no creation date
    assert "Qwen3-8B" in svg  # the model behind the GiB axis is named (text kept as a comment beside its path)


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_written_files_follow_the_umask(tmp_path, umask):
    sp = WorkloadSpec.scm(1.0, 0.5, x=2, y=1, mean_w=10.0)
    tr = generate(sp, 0, n_conversations=50)
    old = os.umask(umask)
    try:
        paths = [tr.write(tmp_path / "t.parquet"), *plot_fig2(tr, tmp_path / "fig2"), *_draw(tmp_path / "c")]
    finally:
        os.umask(old)
    for p in paths:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o666 & ~umask, p
    assert not list(tmp_path.glob("*.tmp"))  # no temporary left behind
