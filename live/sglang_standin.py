"""A stand-in SGLang server: SGLang 0.5.23's OWN prefix cache behind SGLang's HTTP shape, one request at a time.

    <sglang-env>/bin/python live/sglang_standin.py --port P [--page-size 1] [--max-total-tokens 4096]
        [--radix-eviction-policy lru] [--radix-eviction-policy-config JSON] [--tree-core rust|python]
        [--served-model-name tiny] [--context-length 4096] [--disable-radix-cache] [--no-cache-report]
        [--no-metrics]

Runs in the throwaway SGLang environment (``conformance/make_env.sh sglang 0.5.23``) and imports nothing from
kvhit. What is SGLang's, unmodified: the radix tree (``UnifiedRadixCache`` with a full-attention component and
the Rust tree core — what the 0.5.23 scheduler builds for a full-attention model — or the Python core), its
eviction policies, and the KV allocators (``TokenToKVPoolAllocator`` at page 1, ``PagedTokenToKVPoolAllocator``
above: ``evict_to_free_tokens``, ``alloc``/``alloc_extend``/``alloc_decode``, the naive CPU kernels) and
``free_kv_row_segments``. What is transcribed (SGLang's scheduler objects ``Req``/``ScheduleBatch`` are not
built; each step names the function it follows) — the life of ONE request with nothing else running:

1. ``Req.init_next_round_input`` → ``match_kv_cache``: ``match_prefix`` of the prompt with ``RadixKey(limit =
   T − 1)`` (``Req._compute_max_prefix_len``); the hit is ``device_prefix_len`` — SGLang's ``cached_tokens``
   (``ScheduleBatch.prepare_for_extend``: ``pre_len − already_computed``); ``lock`` the matched node;
2. ``alloc_for_extend``: page 1 ``alloc_token_slots`` (evict for the ``T − hit`` extend tokens, alloc); page
   p > 1 ``alloc_paged_token_slots_extend`` (evict for ``extend + p``, the one-page-per-request over-estimate,
   then ``alloc_extend``);
3. prefill samples the first token. If ``max_tokens`` is 1 the request finishes (step 5); otherwise
   ``batch_result_processor`` → ``checkpoint_kv_cache`` → ``UnifiedRadixCache.checkpoint_into_tree(up_to=T)``;
4. each of the ``m − 1`` decode steps (``alloc_for_decode_default``): page 1 ``alloc_token_slots(1)``; page p
   ``alloc_paged_token_slots_decode`` (evict for p tokens, ``alloc_decode``) — the KV of the token fed back;
5. finish → ``release_kv_cache(checkpoint=True)``: ``checkpoint_into_tree(up_to = owned_kv_len = T + m − 1)``
   (the last sampled token is never fed back), ``free_kv_row`` of ``[cache_protected_len, owned_kv_len)``,
   ``unlock``.

``checkpoint_into_tree`` as transcribed: insert ``RadixKey(tokens[:up_to]).page_aligned(p)`` with
``prev_prefix_len = cache_protected_len`` and ``inserted_len = cache_inserted_len`` (the tree frees the duplicate
slots itself), then the ``split_prompt`` insert of the page-aligned prompt at priority 1 when it is shorter, then
the row takes the tree's indices and the lock moves to ``InsertResult.last_device_node``. The full-attention
component's hooks (``prepare_for_caching_req``, ``floor_cache_len``, ``cleanup_after_caching_req``) are not
called: for a full-attention-only tree they do not change the key (no SWA window, no Mamba state).

NOT SGLang here: its scheduler and server. No batching, no chunked prefill, no overlap scheduling (the event
loop followed is the non-overlapped one; what the overlap scheduler allocates around a finishing request is not
checked), no
``new_token_ratio`` admission reservation or retraction, no tokenizer, no model: the generated tokens are a
deterministic function of the prompt. Requests are served strictly one at a time (a lock), so the stand-in
checks kvhit's model of SGLang's *cache* on sequential replays, not SGLang's scheduling.

HTTP (SGLang 0.5.23's shapes): ``GET /v1/models``; ``GET /server_info`` and ``/get_server_info`` (server
arguments and ``max_total_num_tokens``); ``GET /metrics`` (``sglang:prompt_tokens_total``,
``sglang:cached_tokens_total{cache_source="device"}``, ``sglang:max_total_num_tokens``, ``sglang:page_size``);
``POST /flush_cache``; ``POST /v1/completions`` with a token-id ``prompt``, ``max_tokens``, ``return_token_ids``
→ ``choices[0].token_ids`` and ``usage.prompt_tokens_details.cached_tokens`` (with the cache report on).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
import threading
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock


class _StubConfigs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sglang.srt.configs`` (model-architecture classes pulling torchvision/gguf) is not cache logic: stubbed,
    as conformance/real_sglang.py does."""

    def find_spec(self, name, path, target=None):
        if name == "sglang.srt.configs" or name.startswith("sglang.srt.configs."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__ = []
        m.__spec__ = spec
        return m

    def exec_module(self, module):
        pass


POLICIES = ("lru", "lfu", "slru", "priority", "tlru", "fifo", "mru", "filo")


class StandIn:
    """SGLang's UnifiedRadixCache + allocator, driven through one request's life (module docstring)."""

    def __init__(self, pool: int, page: int, policy: str, policy_config: dict | None, core: str, disable: bool):
        import os

        os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = core
        sys.meta_path.insert(0, _StubConfigs())
        import torch
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import free_kv_row_segments
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        self.torch, self.RadixKey = torch, RadixKey
        self.InsertParams, self.MatchPrefixParams = InsertParams, MatchPrefixParams
        self.free_kv_row_segments = free_kv_row_segments
        self.pool, self.page, self.disable = pool, page, disable
        if page == 1:
            self.alloc = TokenToKVPoolAllocator(pool, torch.float16, "cpu", None, False)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(pool, page, torch.float16, "cpu", None, False)
            self.alloc.use_triton_kernels = False  # the naive (torch) kernels: CPU
        self.cache = UnifiedRadixCache(
            CacheInitParams(
                disable=disable,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.alloc,
                page_size=page,
                eviction_policy=policy,
                eviction_policy_config=policy_config,
                tree_components=(ComponentType.FULL,),
            )
        )
        assert self.cache._tree_core_backend == core

    def _key(self, toks, limit=None):
        return self.RadixKey(array("q", toks), limit=limit)

    def _evict(self, n: int) -> None:  # evict_from_tree_cache
        if not self.disable:
            self.alloc.evict_to_free_tokens(self.cache, n)

    def _checkpoint(self, st: dict, toks: list, up_to: int, T: int) -> None:
        """``UnifiedRadixCache.checkpoint_into_tree`` for a full-attention tree (module docstring)."""
        torch, p = self.torch, self.page
        if self.disable:
            return
        key = self._key(toks[:up_to]).page_aligned(p)
        n = len(key)
        if n <= 0:
            return
        values = st["row"][:n].to(torch.int64).clone()
        res = self.cache.insert(
            self.InsertParams(
                key=key, value=values, prev_prefix_len=st["protected"], inserted_len=st["inserted"], priority=0
            )
        )
        st["inserted"] = max(st["inserted"], n)
        pk = self._key(toks[:T]).page_aligned(p)
        if 0 < len(pk) < n:  # split the leaf at the prompt boundary
            self.cache.insert(
                self.InsertParams(
                    key=pk, value=values[: len(pk)], prev_prefix_len=len(pk), inserted_len=len(pk), priority=1
                )
            )
        new = self.cache.path_device_indices(res.last_device_node).to(torch.int64)
        assert len(new) == n, (len(new), n)
        st["row"][st["protected"] : n] = new[st["protected"] :]
        self.cache.unlock(st["lock"])
        st["lock"] = self.cache.lock(res.last_device_node)
        st["protected"] = n

    def serve(self, prompt: list[int], m: int, out: list[int]) -> int:
        """One request: prompt, ``m`` generated tokens ``out``; returns SGLang's cached_tokens."""
        torch, p = self.torch, self.page
        T = len(prompt)
        if self.disable:
            return 0
        # 1. match (key capped at T − 1), lock
        mr = self.cache.match_prefix(self.MatchPrefixParams(key=self._key(prompt, limit=T - 1)))
        hit, node = mr.device_prefix_len, mr.last_device_node
        lock = self.cache.lock(node)
        prefix = self.cache.path_device_indices(node).to(torch.int64)
        assert len(prefix) == hit
        extend = T - hit
        # 2. prefill allocation
        if p == 1:
            self._evict(extend)
            new = self.alloc.alloc(extend)
        else:
            self._evict(extend + p)
            last = prefix[-1:] if hit else torch.full((1,), -1, dtype=torch.int64)
            pl = torch.tensor([hit], dtype=torch.int64)
            sl = torch.tensor([T], dtype=torch.int64)
            new = self.alloc.alloc_extend(pl, pl, sl, sl, last, extend)
        if new is None:
            self.cache.unlock(lock)
            raise RuntimeError(f"prefill out of memory: {extend} tokens, pool {self.pool}")
        row = torch.cat([prefix, new.to(torch.int64)])
        st = {"row": row, "lock": lock, "protected": hit, "inserted": 0}
        toks = list(prompt) + list(out[: m - 1])
        # 3. the first token; a request that continues is checkpointed at its prompt
        if m > 1:
            self._checkpoint(st, toks, T, T)
        # 4. decode steps: the KV of each fed-back token
        for i in range(m - 1):
            L = T + i  # current length; this step writes position L
            if p == 1:
                self._evict(1)
                one = self.alloc.alloc(1)
            else:
                self._evict(p)
                sl = torch.tensor([L + 1], dtype=torch.int64)
                one = self.alloc.alloc_decode(sl, sl, st["row"][L - 1 : L])
            if one is None:
                raise RuntimeError(f"decode out of memory at length {L}, pool {self.pool}")
            st["row"] = torch.cat([st["row"], one.to(torch.int64)])
        # 5. release with checkpoint up to owned_kv_len = T + m − 1
        owned = T + m - 1
        assert len(st["row"]) == owned
        self._checkpoint(st, toks, owned, T)
        prot = st["protected"]
        if prot < owned:
            self.free_kv_row_segments(self.alloc, [(st["row"][prot:owned], prot)], swa_evicted_seqlen=0)
        self.cache.unlock(st["lock"])
        return int(hit)

    def flush(self) -> None:
        self.cache.reset()
        self.alloc.clear()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    ap.add_argument("--radix-eviction-policy", default="lru", choices=POLICIES)
    ap.add_argument("--radix-eviction-policy-config", type=json.loads, default=None)
    ap.add_argument("--tree-core", default="rust", choices=("rust", "python"))
    ap.add_argument("--served-model-name", default="tiny")
    ap.add_argument("--context-length", type=int, default=4096)
    ap.add_argument("--disable-radix-cache", action="store_true")
    ap.add_argument("--no-cache-report", action="store_true")
    ap.add_argument("--no-metrics", action="store_true")
    a = ap.parse_args(argv)
    pool = a.max_total_tokens // a.page_size * a.page_size
    sg = StandIn(
        pool, a.page_size, a.radix_eviction_policy, a.radix_eviction_policy_config, a.tree_core, a.disable_radix_cache
    )
    from importlib.metadata import version

    args = {
        "model_path": "stand-in",
        "served_model_name": a.served_model_name,
        "page_size": a.page_size,
        "radix_eviction_policy": a.radix_eviction_policy,
        "radix_eviction_policy_config": a.radix_eviction_policy_config,
        "disable_radix_cache": a.disable_radix_cache,
        "enable_cache_report": not a.no_cache_report,
        "enable_metrics": not a.no_metrics,
        "enable_hierarchical_cache": False,
        "speculative_algorithm": None,
        "disaggregation_mode": "null",
        "context_length": a.context_length,
        "max_total_tokens": a.max_total_tokens,
    }
    state = {"prompt": 0, "cached": 0, "requests": 0}
    lock = threading.Lock()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *x):
            pass

        def _send(self, code, body, ctype="application/json"):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/v1/models":
                card = {"id": a.served_model_name, "object": "model", "max_model_len": a.context_length}
                self._send(200, {"object": "list", "data": [card]})
            elif self.path in ("/server_info", "/get_server_info"):
                sched = {"status": "ready", "max_total_num_tokens": pool, "max_req_input_len": a.context_length - 1}
                self._send(200, args | sched | {"internal_states": [dict(args)], "version": version("sglang")})
            elif self.path == "/health":
                self._send(200, "")
            elif self.path == "/metrics" and not a.no_metrics:
                lab = f'model_name="{a.served_model_name}",engine_type="unified"'
                with lock:
                    lines = [
                        f"sglang:max_total_num_tokens{{{lab}}} {pool}.0",
                        f"sglang:page_size{{{lab}}} {a.page_size}.0",
                        f'sglang:prompt_tokens_total{{{lab},is_streaming="false"}} {state["prompt"]}.0',
                        f'sglang:num_requests_total{{{lab},is_streaming="false"}} {state["requests"]}.0',
                    ]
                    if state["cached"]:
                        lines.append(f'sglang:cached_tokens_total{{{lab},cache_source="device"}} {state["cached"]}.0')
                self._send(200, "\n".join(lines) + "\n", "text/plain; version=0.0.4")
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            if self.path.startswith("/flush_cache"):
                with lock:
                    sg.flush()
                self._send(200, "Cache flushed.\n", "text/plain")
                return
            if self.path != "/v1/completions":
                self._send(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(raw or b"{}")
                prompt = [int(x) for x in body["prompt"]]
                m = int(body.get("max_tokens") or 16)
                if body.get("model") not in (None, a.served_model_name):
                    raise ValueError(f"The model '{body.get('model')}' does not exist")
                if not prompt or m < 1:
                    raise ValueError("prompt must be a non-empty list of token ids and max_tokens ≥ 1")
                if len(prompt) + m > a.context_length:
                    raise ValueError(f"prompt + max_tokens exceeds the context length {a.context_length}")
            except (KeyError, TypeError, ValueError) as e:
                self._send(400, {"object": "error", "message": str(e), "type": "BadRequestError", "code": 400})
                return
            h = 0
            for x in prompt:
                h = (h * 1_000_003 + x) % (1 << 61)
            out = [1000 + (h + 7919 * i) % 30000 for i in range(m)]
            with lock:
                try:
                    cached = sg.serve(prompt, m, out)
                except RuntimeError as e:
                    self._send(500, {"object": "error", "message": str(e), "type": "InternalServerError", "code": 500})
                    return
                state["prompt"] += len(prompt)
                state["cached"] += cached
                state["requests"] += 1
                rid = state["requests"]
            usage = {"prompt_tokens": len(prompt), "completion_tokens": m, "total_tokens": len(prompt) + m}
            if not a.no_cache_report:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "matched_stop": None}
            if body.get("return_token_ids"):
                choice["token_ids"] = out
            self._send(
                200,
                {
                    "id": f"standin-{rid}",
                    "object": "text_completion",
                    "model": a.served_model_name,
                    "choices": [choice],
                    "usage": usage,
                },
            )

    srv = ThreadingHTTPServer((a.host, a.port), H)
    print(
        f"sglang stand-in on http://{a.host}:{a.port}: pool {pool} tokens, page {a.page_size}, "
        f"{a.radix_eviction_policy}, UnifiedRadixCache[{a.tree_core}]",
        flush=True,
    )
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
