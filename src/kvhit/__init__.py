"""kvhit — predict, simulate and plan KV-cache hit ratios for multi-turn LLM serving.

The mathematical foundation is the multi-turn conversation model (MCM) under whole-conversation LRU
(paper: "multi-turn LRU hit ratio", §2–4, App. B–E). Symbols follow the paper: ``lam0`` (λ0), ``A_R``,
``A_H``, ``A_H_hash``, ``E_B`` (E[B]), ``T_C``; equations are cited as ``eq. (NN)``.

Layers (each imports only from the ones before it; ``make lint`` enforces it with import-linter):
``workload`` → ``sim`` → ``estimate`` → ``fleet`` | ``plan`` → ``plots`` → ``experiments`` → ``service`` →
``cli`` | ``web`` | ``sweep`` (the front ends). Old module paths (before this layout) stay importable for one
release with a :class:`DeprecationWarning` (:mod:`kvhit._compat`).
"""

from kvhit import _compat

__version__ = "0.1.0"

_compat.install()
