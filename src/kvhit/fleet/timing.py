"""Per-request holds of a fleet from engine speeds: the timing options of :func:`kvhit.fleet.simulate.simulate_fleet`
as the CLI and the service give them (docs/peers.md, "kvhit's timing options").

Invariant. Request r (``T_r`` prompt tokens, ``O_r`` output tokens) has a prefill of
``pre_r = prefill_overhead_s + T_r / prefill_tokens_per_s`` seconds and holds its blocks for
``hold_r = pre_r + max(O_r − 1, 0) / decode_tokens_per_s`` (the first output token comes from the prefill, each later
one costs one decode step; without a decode speed the decode term is 0). With ``prefill_hold`` its prefill ends at
``pre_r`` after its start: its outstanding prefill tokens
leave the router's load then, its blocks at ``hold_r`` (Dynamo's ``MarkPrefillCompleted`` / ``Free``).
``hit_token_seconds`` (at most ``1 / prefill_tokens_per_s``) is passed through: the simulator shortens both holds by
``hit_token_seconds × hit tokens``, so with ``hit_token_seconds = 1 / prefill_tokens_per_s`` a request's prefill time
is that of its uncached tokens, and no hold is clipped at 0 beyond rounding (``hit tokens ≤ T_r``).
``decode_kv`` (no speed needed) says that a request's KV also holds the blocks of its first ``O_r − 1`` generated
tokens (``kv_tokens(T_r, O_r) // b`` blocks in all; the simulator's ``colocated`` mode): they are allocated at
admission with the prompt's, cached when the request finishes, and counted in the router's active blocks. It changes
the *stream* (its block ids), not the holds: whoever builds the stream reads it (on a block-id trace the generated
blocks get fresh ids no prompt shares, :meth:`kvhit.workload.production.ProductionTrace.to_block_requests`).

NOT modelled: batching (speeds are per request, not shared by the requests in
flight), decode blocks grown step by step (a request's blocks, decode ones included, are allocated at admission),
preemption.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FleetTiming"]


@dataclass(frozen=True)
class FleetTiming:
    """Engine speeds and router-timing options; :meth:`holds` turns them into ``simulate_fleet``'s arguments."""

    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    prefill_hold: bool = False
    hit_token_seconds: float = 0.0
    prefill_overhead_s: float = 0.0
    decode_kv: bool = False

    def __post_init__(self):
        if not isinstance(self.decode_kv, bool):
            raise ValueError(f"decode_kv: expected True or False, got {self.decode_kv!r}")
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name}: expected a finite number > 0, got {v!r}")
        ov = self.prefill_overhead_s
        if not (isinstance(ov, int | float) and math.isfinite(ov) and ov >= 0):
            raise ValueError(f"prefill_overhead_s: expected a finite number >= 0, got {ov!r}")
        hts = self.hit_token_seconds
        if not (isinstance(hts, int | float) and math.isfinite(hts) and hts >= 0):
            raise ValueError(f"hit_token_seconds: expected a finite number >= 0, got {hts!r}")
        p = self.prefill_tokens_per_s
        if p is None and (self.decode_tokens_per_s is not None or self.prefill_hold or hts > 0 or ov > 0):
            raise ValueError(
                "prefill_tokens_per_s: required by decode_tokens_per_s, prefill_hold, hit_token_seconds, "
                "prefill_overhead_s"
            )
        if p is not None and hts > 1.0 / p:
            raise ValueError(
                f"hit_token_seconds: at most 1/prefill_tokens_per_s = {1.0 / p:g} s (a cached token cannot save more "
                f"prefill than it costs), got {hts!r}"
            )
        if self.prefill_hold and self.decode_tokens_per_s is None:
            raise ValueError(
                "prefill_hold: needs decode_tokens_per_s (without decode time the prefill ends at the finish)"
            )

    @property
    def timed(self) -> bool:
        return self.prefill_tokens_per_s is not None

    def holds(self, prompt_tokens, output_tokens=None):
        """``(hold, prefill_hold, hit_token_seconds)`` for ``simulate_fleet``; ``(None, None, 0.0)`` untimed."""
        if self.prefill_tokens_per_s is None:
            return None, None, 0.0
        pre = float(self.prefill_overhead_s) + np.asarray(prompt_tokens, np.float64) / float(self.prefill_tokens_per_s)
        hold = pre
        if self.decode_tokens_per_s is not None:
            if output_tokens is None:
                raise ValueError("output_tokens: required by decode_tokens_per_s (the stream has no output lengths)")
            O = np.asarray(output_tokens, np.float64)
            if O.shape != pre.shape:
                raise ValueError(f"output_tokens: expected shape {pre.shape}, got {O.shape}")
            hold = pre + np.maximum(O - 1.0, 0.0) / float(self.decode_tokens_per_s)
        return hold, (pre if self.prefill_hold else None), float(self.hit_token_seconds)
