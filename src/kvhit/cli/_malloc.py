"""Allocator settings for the batch commands (glibc only): keep freed memory for reuse instead of returning it.

A curve over 10⁷ turns allocates and frees hundreds of 80 MB arrays one after another. glibc serves every
allocation above its mmap threshold (at most 32 MB by default) with a fresh ``mmap`` and unmaps it on ``free``, so
each new buffer (numba's and Arrow's; NumPy's own large arrays are advised into huge pages) is faulted in 4 KiB page
by 4 KiB page again: 1.4·10⁶ minor page faults and ~13 s of system time for
``kvhit curve --points 1000`` on the 10⁷-turn trace of docs/large-traces.md (about a quarter of its CPU time on
this project's 2-core VM). With the mmap threshold and the trim threshold raised to 2 GiB − 1, large arrays come
from the heap and freed ones are reused in place: 3.3·10⁵ faults and ~4 s of system time there, for a peak RSS
larger by the heap's fragmentation (2.45 → 2.80 GB on that trace; same output byte for byte).

Invariant: only the process's allocator parameters change (``mallopt``), never a result. Applied by the CLI to
every command except ``kvhit serve`` (a long-running server should give memory back); set ``KVHIT_MALLOC=system``
to keep glibc's defaults. Library code never calls this: a host application owns its allocator.
NOT done: anything on a C library other than glibc (musl, macOS, Windows) — there it is a no-op.
"""

from __future__ import annotations

import os
import sys

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_LIMIT = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to 2 GiB − 1 for this process; True when both were applied."""
    if os.environ.get("KVHIT_MALLOC", "") == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _LIMIT)) and bool(mallopt(_M_TRIM_THRESHOLD, _LIMIT))
