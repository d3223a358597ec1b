"""vLLM's prefix cache (the block pool of vLLM ≥ 0.24 and the 0.23 free-queue order).

* :mod:`~kvhit.sim.vllm.block` — the compiled block-pool simulator (the fast path);
  :mod:`~kvhit.sim.vllm.reference` — its slow, readable reference.
* :mod:`~kvhit.sim.vllm.curve` — every capacity's hit ratio in one pass (inclusion property of the block LRU).
* :mod:`~kvhit.sim.vllm.engine` — the step-wise :class:`~kvhit.sim.engine.Engine` (what conformance drives).
* :mod:`~kvhit.sim.vllm.blockids` — chained block ids of token content (vLLM's block hashes).
* :mod:`~kvhit.sim.vllm.mooncake` — token ids written as a Mooncake-style block-id trace (``trace chat --hash-only``).
"""
