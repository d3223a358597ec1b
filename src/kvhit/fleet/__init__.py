"""Fleets: R replicas behind a router.

* :mod:`~kvhit.fleet.routers` — oblivious and KV-aware routers (Dynamo, llm-d, SGLang router, sticky).
* :mod:`~kvhit.fleet.simulate` — the exact fleet simulation (one vLLM block cache per replica);
  :mod:`~kvhit.fleet.reference` — its slow reference.
* :mod:`~kvhit.fleet.estimate` — fleet estimators (eq. (38)–(39) per replica; KV-aware stay probabilities).
* :mod:`~kvhit.fleet.plan` — the smallest R (or N per replica) reaching a target.

Layer: imports ``workload``, ``sim`` and ``estimate``; never ``plan`` (a sibling).
"""
