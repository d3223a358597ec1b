"""SGLang's radix cache (0.5.23 ``RadixCache`` + ``TokenToKVPoolAllocator``).

* :mod:`~kvhit.sim.sglang.radix` — the compiled radix-tree model (its tree: :mod:`~kvhit.sim.sglang.radix_tree`, its
  request-level kernel: :mod:`~kvhit.sim.sglang.radix_kernel`); :mod:`~kvhit.sim.sglang.run` — trace runs on it.
* :mod:`~kvhit.sim.sglang.engine` — the step-wise :class:`~kvhit.sim.engine.Engine`.
* :mod:`~kvhit.sim.sglang.streams` — request streams (token ids) for the radix model.
"""
