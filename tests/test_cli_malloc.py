"""The CLI's allocator setting (kvhit.cli._malloc): freed large arrays are reused instead of faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvhit.cli._malloc import keep_freed_memory

_PROBE = """
import resource, sys
import ctypes
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
if sys.argv[1] == "keep":
    from kvhit.cli._malloc import keep_freed_memory
    assert keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    p = libc.malloc(80 << 20)  # above glibc's default mmap threshold (≤ 32 MB), as numba's and Arrow's buffers are
    ctypes.memset(p, 1, 80 << 20)
    libc.free(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt only")
def test_freed_arrays_are_reused_not_faulted_again():
    # 10 × 80 MB = 205k 4 KiB pages with glibc's defaults (each buffer a fresh mmap); with the setting the heap's
    # pages are faulted once and reused
    default, keep = _faults("default"), _faults("keep")
    assert default > 150_000
    assert keep < 0.3 * default


def test_opt_out_keeps_glibc_defaults(monkeypatch):
    monkeypatch.setenv("KVHIT_MALLOC", "system")
    assert keep_freed_memory() is False
