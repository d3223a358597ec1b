"""Replaying a trace against a running vLLM or SGLang server and checking kvhit against what it measured.

:mod:`kvhit.replay.tokens` turns a trace into token-id prompts (deterministic; same block id ⇒ same tokens),
:mod:`kvhit.replay.client` sends them (async HTTP, bounded in flight) and records each request's prefix-cache hit
and the server's counters, :mod:`kvhit.replay.check` simulates exactly the recorded sequence with kvhit's vLLM
engine (or its SGLang model, for an SGLang server) and compares. The command is ``kvhit replay``
(:mod:`kvhit.service.replay`); ``make live`` runs it against a real vLLM server in CI, ``live/sglang_check.sh``
against SGLang 0.5.23's own cache code (docs/live.md).
"""
