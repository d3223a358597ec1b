"""``kvhit replay`` against SGLang servers: engine detection, the recorded-sequence check with kvhit's SGLang
model, refusals — against a small fake SGLang server started here on 127.0.0.1 (and stopped here) — and, when the
conformance environment exists (``conformance/make_env.sh sglang 0.5.23``), against ``live/sglang_standin.py``, which
wraps SGLang 0.5.23's own ``UnifiedRadixCache`` and allocators behind SGLang's HTTP shape."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from kvhit.replay.check import simulate_recorded_sglang
from kvhit.service.base import build
from kvhit.service.errors import InputError
from kvhit.service.replay import ReplayRequest, replay
from test_replay import FakeVllm, _chat_trace

ROOT = Path(__file__).resolve().parents[1]


class FakeSglang:
    """Answers /v1/models, /server_info (or only /get_server_info), /metrics, /flush_cache and /v1/completions in
    SGLang 0.5.23's shapes. ``cached_tokens`` comes from an independent set-of-prefixes model of a radix cache
    that never evicts (page ``p``; on finish prompt + m − 1 output tokens cached, page-aligned down; a hit is the
    longest cached page-aligned prefix of the first T − 1 prompt tokens) — the check must agree with it when the
    pool is large. ``lie_at``: the request whose cached_tokens is one page short. ``args``: server arguments
    overriding the defaults; ``metrics``: export the sglang: counters; ``old``: serve /get_server_info only."""

    def __init__(self, p=4, pool=100_000, lie_at=None, args=None, metrics=True, old=False, max_len=4096):
        self.p, self.pool, self.lie_at, self.metrics, self.old, self.max_len = p, pool, lie_at, metrics, old, max_len
        self.args = {
            "page_size": p,
            "radix_eviction_policy": "lru",
            "radix_eviction_policy_config": None,
            "disable_radix_cache": False,
            "enable_cache_report": True,
            "enable_metrics": metrics,
            "enable_hierarchical_cache": False,
            "speculative_algorithm": None,
            "disaggregation_mode": "null",
            "served_model_name": "tiny",
        } | (args or {})
        self.cached: set[tuple] = set()
        self.q = self.h = 0
        self.n = 0
        self.flushes = 0
        self.lock = threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body, ctype="application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                info = fake.args | {"max_total_num_tokens": fake.pool, "max_req_input_len": fake.max_len - 1}
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "tiny", "max_model_len": fake.max_len}]})
                elif self.path == "/server_info" and not fake.old:
                    self._send(200, info | {"internal_states": [{"last_gen_throughput": 0.0}], "version": "0.5.23"})
                elif self.path == "/get_server_info":
                    self._send(200, info | {"version": "0.5.23"})
                elif self.path == "/metrics" and fake.metrics:
                    lab = 'model_name="tiny",engine_type="unified"'
                    lines = [
                        f"sglang:max_total_num_tokens{{{lab}}} {fake.pool}.0",
                        f'sglang:prompt_tokens_total{{{lab},is_streaming="false"}} {fake.q}.0',
                    ]
                    if fake.h:
                        lines.append(f'sglang:cached_tokens_total{{{lab},cache_source="device"}} {fake.h}.0')
                    self._send(200, "\n".join(lines) + "\n", "text/plain")
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path == "/flush_cache":
                    fake.cached.clear()
                    fake.flushes += 1
                    self._send(200, "Cache flushed.\n", "text/plain")
                    return
                if self.path != "/v1/completions":
                    self._send(404, {"detail": "Not Found"})
                    return
                with fake.lock:
                    r = fake.n
                    fake.n += 1
                    pr = list(body["prompt"])
                    m = int(body["max_tokens"])
                    out = [2000 + (len(pr) * 11 + i) % 7000 for i in range(m)]
                    p = fake.p
                    k = (len(pr) - 1) // p
                    while k and tuple(pr[: k * p]) not in fake.cached:
                        k -= 1
                    hit = k * p - (p if r == fake.lie_at and k else 0)
                    if not fake.args["disable_radix_cache"]:
                        seq = pr + out[: m - 1]
                        for j in range(1, len(seq) // p + 1):
                            fake.cached.add(tuple(seq[: j * p]))
                    fake.q += len(pr)
                    fake.h += hit
                usage = {"prompt_tokens": len(pr), "completion_tokens": m, "total_tokens": len(pr) + m}
                if fake.args["enable_cache_report"]:
                    usage["prompt_tokens_details"] = {"cached_tokens": hit}
                self._send(
                    200,
                    {
                        "id": f"cmpl-{r}",
                        "object": "text_completion",
                        "choices": [{"index": 0, "text": "", "token_ids": out, "finish_reason": "length"}],
                        "usage": usage,
                    },
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *a):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _run(url, trace, **kw):
    return replay(build(ReplayRequest, endpoint=url, trace=trace, **kw))


# ---- the SGLang model on recorded sequences (hand-worked) ----------------------------------------------------


def test_sglang_caches_prompt_plus_m_minus_1_in_whole_pages():
    # p = 4: T = 8 and m = 4 → 8 + 3 = 11 tokens inserted, 8 of them in whole pages (11 → 8); the next turn
    # repeats the 8 prompt tokens and the 4 outputs (12 tokens + 5 new): a hit of 8, not 12 (the 4th output has no
    # KV and the 3 cached outputs make no whole page)
    p0, o0 = np.arange(100, 108), np.arange(200, 204)
    p1 = np.concatenate([p0, o0, np.arange(300, 305)])
    one = np.arange(1)
    assert simulate_recorded_sglang([p0, p1], [o0, one], page_size=4, pool_tokens=1000).tolist() == [0, 8]
    # p = 1: every token: T + m − 1 = 11 cached, and the next prompt's hit is capped at T − 1 = 16 anyway
    assert simulate_recorded_sglang([p0, p1], [o0, one], page_size=1, pool_tokens=1000).tolist() == [0, 11]
    # the hit is capped at T − 1 tokens: the same 8-token prompt again hits 7 at p = 1 and 4 at p = 4
    assert simulate_recorded_sglang([p0, p0], [one, one], page_size=1, pool_tokens=100).tolist() == [0, 7]
    assert simulate_recorded_sglang([p0, p0], [one, one], page_size=4, pool_tokens=100).tolist() == [0, 4]


def test_sglang_pool_evicts_whole_leaves_lru():
    # pool 16 tokens, p = 1, one output token (nothing decoded): A (8) is cached, B (10) needs 10 → the shortfall of
    # 2 evicts A's leaf whole; with a pool of 18 A stays and A again hits T − 1 = 7
    a = np.arange(1000, 1008)
    b = np.arange(2000, 2010)
    one = np.arange(1)
    assert simulate_recorded_sglang([a, b, a], [one] * 3, page_size=1, pool_tokens=16).tolist() == [0, 0, 0]
    assert simulate_recorded_sglang([a, b, a], [one] * 3, page_size=1, pool_tokens=18).tolist() == [0, 0, 7]
    # a request longer than the pool never runs: -1
    assert simulate_recorded_sglang([np.arange(20)], [one], page_size=1, pool_tokens=16).tolist() == [-1]


# ---- the whole command against a fake SGLang server ----------------------------------------------------------


@pytest.mark.parametrize("old", [False, True])
def test_replay_detects_sglang_and_matches(tmp_path, old):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeSglang(old=old) as srv:
        res = _run(srv.url, path, check=True, system_prompt_tokens=20, log=tmp_path / "log.parquet")
        assert srv.flushes == 1  # the cache was emptied first
    assert res.server["engine"] == "sglang" and res.server["pool_tokens"] == 100_000
    assert res.completed == res.requests == 18 and not res.partial
    ck = res.check
    assert ck["engine"] == "sglang" and ck["page_size"] == 4 and ck["evict_policy"] == "lru"
    assert ck["mismatching_requests"] == 0 and ck["passed"] and ck["measured_hit_tokens_all"] > 0
    assert res.counters["equal_to_per_request_sums"]


def test_replay_sglang_finds_a_lying_server_and_exits_1(tmp_path):
    from clihelp import kvhit

    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeSglang(lie_at=5) as srv:
        res = _run(srv.url, path, check=True, system_prompt_tokens=20)
    assert res.check["mismatching_requests"] == 1 and res.check["first_mismatch"]["request"] == 5
    with FakeSglang(lie_at=5) as srv:
        r = kvhit("replay", "--endpoint", srv.url, "--trace", str(path), "--check", "--system-prompt-tokens", "20")
    assert r.code == 1 and not r.exc and "SGLang, pages of 4 tokens" in r.out
    assert r.err_lines[-1].startswith("mismatch: 1 of 18 requests differ; first: request 5")


def test_replay_sglang_negative_controls_mismatch(tmp_path):
    # a pool of 64 tokens on the fake (which never evicts) is a wrong pool for kvhit: it must disagree
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeSglang() as srv:
        res = _run(srv.url, path, check=True, system_prompt_tokens=20, pool_tokens=64)
    assert res.check["mismatching_requests"] > 0 and res.check["pool_tokens"] == 64
    assert any("--pool-tokens 64" in n for n in res.notes)


@pytest.mark.parametrize(
    "cfg", [{"threshold": 96, "next_prompt_estimate": 16}, '{"threshold": 96, "next_prompt_estimate": 16}']
)
def test_replay_sglang_reads_the_tlru_budget(tmp_path, cfg):
    # T-LRU's tail budget is threshold − next_prompt_estimate from --radix-eviction-policy-config (a dict, or its JSON)
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeSglang(args={"radix_eviction_policy": "tlru", "radix_eviction_policy_config": cfg}) as srv:
        res = _run(srv.url, path, check=True)
    assert res.check["evict_policy"] == "tlru" and res.check["tlru_tail_budget"] == 80
    assert res.check["mismatching_requests"] == 0  # the fake never evicts


def test_replay_sglang_concurrent_is_simulated_with_holds_and_not_gated(tmp_path):
    from clihelp import kvhit

    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeSglang() as srv:
        r = kvhit("replay", "--endpoint", srv.url, "--trace", str(path), "--check", "--concurrency", "3")
    assert r.code == 0 and not r.exc, r.err
    assert "concurrent, holds from measured times:" in r.out and "no model of SGLang's scheduler" in r.out
    with FakeSglang() as srv:
        res = _run(srv.url, path, check=True, concurrency=3)
    assert res.check["per_request"] is False and res.check["passed"] is None
    assert res.check["concurrent"]["model"] == "holds" and res.check["concurrent"]["holds"]["requests_compared"] == 18


def test_replay_sglang_without_metrics_compares_per_request(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeSglang(metrics=False) as srv:
        res = _run(srv.url, path, check=True, engine="sglang")
    assert res.check["mismatching_requests"] == 0 and res.counters["queries"] is None
    assert any("--enable-metrics" in n for n in res.notes)


@pytest.mark.parametrize(
    ("fake_kw", "req_kw", "needle"),
    [
        ({"args": {"enable_cache_report": False}}, {}, "--enable-cache-report"),
        ({"args": {"disable_radix_cache": True}}, {"check": True}, "--disable-radix-cache"),
        ({"args": {"radix_eviction_policy": "weird"}}, {"check": True}, "radix_eviction_policy='weird'"),
        ({"args": {"enable_hierarchical_cache": True}}, {"check": True}, "enable_hierarchical_cache=True"),
        ({"args": {"speculative_algorithm": "EAGLE"}}, {"check": True}, "speculative_algorithm=EAGLE"),
        ({"args": {"page_size": None}}, {"check": True}, "no page_size"),
        ({}, {"block_size": 16}, "--block-size 16: the SGLang server"),
        ({}, {"num_gpu_blocks": 40}, "--num-gpu-blocks"),
        ({}, {"output_cached": "m"}, "--output-cached m"),
        ({}, {"evict_policy": "nope"}, "--evict-policy nope"),
        ({}, {"engine": "vllm"}, "not a vLLM server"),
        ({"max_len": 40}, {}, "max_model_len"),
    ],
)
def test_replay_sglang_refusals_are_one_line(tmp_path, fake_kw, req_kw, needle):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeSglang(**fake_kw) as srv:
        with pytest.raises(InputError) as e:
            _run(srv.url, path, **req_kw)
        assert srv.n == 0  # nothing was sent
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_replay_sglang_flags_refused_on_vllm_and_engine_sglang_on_vllm(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeVllm() as srv:
        for kw, needle in (({"pool_tokens": 100}, "--pool-tokens"), ({"engine": "sglang"}, "not an SGLang server")):
            with pytest.raises(InputError) as e:
                _run(srv.url, path, **kw)
            assert needle in str(e.value) and "\n" not in str(e.value)
        assert srv.n == 0


# ---- the stand-in: SGLang 0.5.23's own cache code behind SGLang's HTTP shape ------------------------------------

SG_PY = (
    Path(os.environ.get("KVHIT_CONFORMANCE_CACHE", str(Path.home() / ".cache/kvhit-conformance")))
    / "venv-sglang-0.5.23/bin/python"
)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.skipif(not SG_PY.exists(), reason="no SGLang 0.5.23 environment (conformance/make_env.sh sglang 0.5.23)")
@pytest.mark.parametrize(
    ("workload", "page", "pool", "policy", "cfg", "other"),
    [
        ("chat", 1, 96, "lru", None, "mru"),
        ("chat", 4, 96, "lru", None, "mru"),
        ("chat", 1, 96, "lfu", None, "mru"),
        # shared documents: T-LRU with a tail budget of 96 − 16 = 80 tokens evicts otherwise than LRU there
        ("docs", 1, 512, "tlru", '{"threshold": 96, "next_prompt_estimate": 16}', "lru"),
    ],
)
def test_replay_against_sglang_standin(tmp_path, workload, page, pool, policy, cfg, other):
    if workload == "chat":
        path = tmp_path / "t.parquet"
        _chat_trace(path, n_conv=8, turns=4)
        src = {"trace": path, "system_prompt_tokens": 12}
    else:
        sys.path.insert(0, str(ROOT / "live"))
        try:
            from shared_docs_trace import main as docs_trace
        finally:
            sys.path.pop(0)
        path = tmp_path / "docs.jsonl"
        docs_trace(str(path), "7", "120")
        src = {"blocks_trace": path, "tokens_per_block": 8}
    port = _free_port()
    cmd = [str(SG_PY), str(ROOT / "live/sglang_standin.py"), "--port", str(port), "--page-size", str(page)]
    cmd += ["--max-total-tokens", str(pool), "--radix-eviction-policy", policy]
    cmd += ["--radix-eviction-policy-config", cfg] if cfg else []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.1)
        res = replay(build(ReplayRequest, endpoint=url, check=True, **src))
        assert res.server["engine"] == "sglang" and res.server["pool_tokens"] == pool
        assert res.check["mismatching_requests"] == 0 and res.check["passed"]
        assert res.check["measured_hit_tokens_all"] > 0 and res.counters["equal_to_per_request_sums"]
        # negative controls: the same replay simulated with twice the pool, and with another policy, must differ
        # somewhere (these traces evict: their requests hold several times the pool)
        bad = replay(build(ReplayRequest, endpoint=url, check=True, pool_tokens=2 * pool, **src))
        assert bad.check["mismatching_requests"] > 0
        bad = replay(build(ReplayRequest, endpoint=url, check=True, evict_policy=other, **src))
        assert bad.check["mismatching_requests"] > 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
