"""kvhit — predict, simulate and plan KV-cache hit ratios for multi-turn LLM serving.

The mathematical foundation is the multi-turn conversation model (MCM) under whole-conversation LRU
(paper: "multi-turn LRU hit ratio", §2–4, App. B–E). Symbols follow the paper: ``lam0`` (λ0), ``A_R``,
``A_H``, ``A_H_hash``, ``E_B`` (E[B]), ``T_C``; equations are cited as ``eq. (NN)``.
"""

__version__ = "0.1.0"
