"""Write requests as a Mooncake-style block-id trace: the chained vLLM block hashes of their token ids, no tokens.

Invariant: request r's ``hash_ids`` are the low 63 bits (Mooncake ids are ≥ 0) of the ⌈T_r/b⌉ chained block
hashes of :func:`kvhit.sim.vllm.blockids.hashes_from_token_ids` — the ⌊T_r/b⌋ full blocks, then, when b ∤ T_r,
the partial block hashed with its tail padded by −1 (an id no full block of real token ids has), which
:func:`kvhit.workload.production.read_mooncake` drops as it does for Mooncake's own files. So reading the file
back at block size b gives the block simulator the same stream (masked to 63 bits) as the token ids.
Not modelled: responses (``output_length`` is 0), per-request extra keys (LoRA, cache salt).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from kvhit.sim.vllm.blockids import hashes_from_token_ids
from kvhit.workload.trace import file_mode

__all__ = ["write_mooncake"]


def write_mooncake(path: str | Path, ids: list[np.ndarray], times: np.ndarray, block_size: int) -> Path:
    """Write ``{"timestamp" (ms), "input_length", "output_length": 0, "hash_ids"}`` per request, one JSON line
    each, atomically (a temporary file renamed into place)."""
    b = int(block_size)
    padded = [q if q.size % b == 0 else np.concatenate([q, np.full(b - q.size % b, -1, np.int32)]) for q in ids]
    off, hs = hashes_from_token_ids(padded, b)
    hs = np.asarray(hs).view(np.int64) & np.int64(0x7FFFFFFFFFFFFFFF)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r, q in enumerate(ids):
                rec = {
                    "timestamp": int(round(float(times[r]) * 1000)),
                    "input_length": int(q.size),
                    "output_length": 0,
                    "hash_ids": hs[off[r] : off[r + 1]].tolist(),
                }
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        os.chmod(tmp, file_mode())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
