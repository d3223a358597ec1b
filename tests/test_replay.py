"""``kvhit replay`` without a vLLM server: token ids, prompts, the recorded-sequence check, refusals, and the whole
client against a small fake server started here on 127.0.0.1 (and stopped here)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pyarrow.parquet as pq
import pytest

from kvhit.replay.check import compare, recorded_trace, simulate_recorded
from kvhit.replay.client import parse_metrics
from kvhit.replay.tokens import TOKEN_LO, block_token_ids, chat_prompt, plan_from_production, plan_from_trace
from kvhit.service.base import build
from kvhit.service.errors import InputError
from kvhit.service.replay import ReplayRequest, replay
from kvhit.workload import Exponential
from kvhit.workload.generate import trace_from_conversations


def _chat_trace(path=None, n_conv=6, turns=3, seed=0):
    rng = np.random.default_rng(seed)
    M = np.full(n_conv, turns, np.int64)
    T, resp = [], []
    for _c in range(n_conv):
        t, prev = 0, 0
        for _j in range(turns):
            t = t + prev + int(rng.integers(1, 30))
            r = int(rng.integers(1, 6))
            T.append(t)
            resp.append(r)
            prev = r
    T = np.array(T, np.int64)
    R = -(-T // 16)
    Z = np.maximum(np.diff(np.concatenate([[0], R])), 1)
    Z[::turns] = np.maximum(R[::turns], 1)
    tr = trace_from_conversations(
        M,
        Z,
        lam0=1.0,
        interarrival=Exponential(2.0),
        seed=seed,
        extra={"cum_tokens": T, "response_tokens": np.array(resp, np.int64)},
        meta={"block_size": 16},
    )
    if path is not None:
        tr.write(path)
    return tr


# ---- token ids and prompts ----------------------------------------------------------------------------------


def test_block_token_ids_same_block_same_tokens():
    a = block_token_ids([7, 9, 7], 5, seed=3)
    assert a.shape == (15,)
    assert np.array_equal(a[:5], a[10:])
    assert not np.array_equal(a[:5], a[5:10])
    assert np.array_equal(a, block_token_ids([7, 9, 7], 5, seed=3))
    assert not np.array_equal(a, block_token_ids([7, 9, 7], 5, seed=4))
    assert a.min() >= TOKEN_LO and a.max() < 32000


def test_chat_plan_deterministic_and_sized_from_token_counts():
    tr = _chat_trace()
    p1 = plan_from_trace(tr, tokens_per_block=16, output_tokens=4, system_prompt_tokens=7, seed=1)
    p2 = plan_from_trace(tr, tokens_per_block=16, output_tokens=4, system_prompt_tokens=7, seed=1)
    p3 = plan_from_trace(tr, tokens_per_block=16, output_tokens=4, system_prompt_tokens=7, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(p1.new_ids, p2.new_ids, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(p1.new_ids, p3.new_ids, strict=True))
    # the prompt a chat client builds reaches exactly the trace's T_j when every answer has the trace's length
    T = p1.prompt_bound()
    order = np.lexsort((tr["turn"], tr["time"]))
    assert np.array_equal(T - 7, np.asarray(tr["cum_tokens"])[order])
    assert np.array_equal(p1.max_tokens, np.asarray(tr["response_tokens"])[order])
    # the system prompt opens every conversation, and only its first turn
    firsts = [ids for ids, pv in zip(p1.new_ids, p1.prev, strict=True) if pv < 0]
    assert len(firsts) == tr.n_conversations
    assert all(np.array_equal(f[:7], firsts[0][:7]) for f in firsts)
    later = [ids for ids, pv in zip(p1.new_ids, p1.prev, strict=True) if pv >= 0]
    assert not any(np.array_equal(x[:7], firsts[0][:7]) for x in later if x.size >= 7)
    # previous turn of the same conversation, earlier in arrival order
    for r, pv in enumerate(p1.prev):
        if pv >= 0:
            assert pv < r and p1.conv[pv] == p1.conv[r] and p1.turn[pv] == p1.turn[r] - 1


def test_chat_prompt_is_history_response_new():
    p = chat_prompt(np.array([1, 2]), np.array([3]), np.array([4, 5]))
    assert p.tolist() == [1, 2, 3, 4, 5]
    assert chat_prompt(None, None, np.array([9])).tolist() == [9]


def test_block_id_trace_shares_prefixes(tmp_path):
    from kvhit.workload.production import read_mooncake

    f = tmp_path / "t.jsonl"
    recs = [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 5, "input_length": 1030, "output_length": 0, "hash_ids": [1, 2, 4]},
    ]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    pt = read_mooncake(f)
    plan = plan_from_production(pt, tokens_per_block=8, output_tokens=2)
    a, b = plan.new_ids
    # two shared full blocks of 512 → 2 × 8 shared tokens; a's partial tail of 76 tokens scales to 1 token, b's of 6
    # to none; an output length of 0 becomes 1 (a completion generates at least one token)
    assert np.array_equal(a[:16], b[:16])
    assert (a.size, b.size) == (17, 16)
    assert plan.max_tokens.tolist() == [3, 1]
    assert not plan.chat and any("scaled" in n for n in plan.notes)


# ---- the recorded-sequence check -----------------------------------------------------------------------------


def test_simulate_recorded_caches_prompt_plus_m_minus_1():
    # b = 4: T = 8, m = 4 → T + m − 1 = 11 tokens keep 2 full blocks (m would give 12 = 3 blocks)
    p0, o0 = np.arange(100, 108), np.arange(200, 204)
    p1 = np.concatenate([p0, o0, np.arange(300, 305)])
    kw = dict(block_size=4, num_gpu_blocks=20)
    assert simulate_recorded([p0, p1], [o0, np.arange(1)], **kw).tolist() == [0, 8]
    assert simulate_recorded([p0, p1], [o0, np.arange(1)], output_cached="m", **kw).tolist() == [0, 12]
    assert simulate_recorded([p0, p1], [o0, np.arange(1)], output_cached="0", **kw).tolist() == [0, 8]


def test_simulate_recorded_null_block_and_eviction():
    # G = 6 blocks of 4 → 5 usable. A: 8 + 1 tokens (3 physical, 2 hashed); B: 4 physical new blocks;
    # with 5 usable blocks B evicts one of A's (its last: tail first), with 6 it would not.
    a = np.arange(1000, 1009)
    b = np.arange(2000, 2013)
    one = np.arange(1)
    got = simulate_recorded([a, b, a], [one, one, one], block_size=4, num_gpu_blocks=6)
    assert got.tolist() == [0, 0, 4]
    got = simulate_recorded([a, b, a], [one, one, one], block_size=4, num_gpu_blocks=7)
    assert got.tolist() == [0, 0, 8]


def test_compare_counts_mismatches_and_first():
    c = compare([0, 4, 8, 8], [0, 4, 4, 8], [10, 10, 10, 10])
    assert (c.mismatches, c.first_mismatch, c.measured_hit_tokens, c.simulated_hit_tokens) == (1, 2, 20, 16)
    assert c.measured_ratio == pytest.approx(0.5) and c.simulated_ratio == pytest.approx(0.4)


def test_recorded_trace_is_a_valid_kvhit_trace():
    tr = recorded_trace([0, 1, 0, 1], [1, 1, 2, 2], [0.0, 1.0, 2.0, 3.0], [10, 70, 12, 75], [2, 2, 2, 2], 64)
    assert tr.n_conversations == 2 and tr["cum_tokens"].tolist() == [10, 70, 12, 75]


def test_parse_metrics_labels_and_values():
    m = parse_metrics(
        '# HELP x\nvllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 12.0\n'
        'vllm:cache_config_info{block_size="32",num_gpu_blocks="130"} 1.0\n'
    )
    assert m["vllm:prefix_cache_hits_total"] == [({"engine": "0", "model_name": "tiny"}, 12.0)]
    assert m["vllm:cache_config_info"][0][0]["num_gpu_blocks"] == "130"


# ---- a fake OpenAI/vLLM server on 127.0.0.1 ------------------------------------------------------------------


class FakeVllm:
    """Answers /v1/models, /metrics, /reset_prefix_cache and /v1/completions. ``cached_tokens`` comes from an
    independent dict-of-prefixes model of a cache that never evicts (block size ``b``; prompt + m − 1 output
    tokens kept; hit capped at T − 1) — the check must agree with it when nothing is evicted. ``lie_at``: the
    request index whose cached_tokens is reported one block short. ``die_at``: close the server at that request.
    ``metrics``: False for a server without vLLM metrics; ``counters``: False for vLLM metrics without them.
    ``log``: a file to which, like vLLM with --enable-log-requests and live/vllm_logging.json, every request
    appends ``<unix time> … Added request cmpl-<X-Request-Id>-0-<8 hex>.``; the response ``id`` is
    ``cmpl-<X-Request-Id>``."""

    def __init__(
        self, b=16, blocks=1000, max_len=4096, lie_at=None, die_at=None, metrics=True, counters=True, log=None
    ):
        self.b, self.blocks, self.max_len, self.log = b, blocks, max_len, log
        self.lie_at, self.die_at, self.metrics, self.counters = lie_at, die_at, metrics, counters
        self.cached: set[tuple] = set()
        self.q = self.h = 0
        self.n = 0
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
                if self.path == "/v1/models":
                    self._send(200, {"data": [{"id": "tiny", "max_model_len": fake.max_len}]})
                elif self.path == "/metrics" and fake.metrics:
                    lines = [
                        f'vllm:cache_config_info{{block_size="{fake.b}",num_gpu_blocks="{fake.blocks}",'
                        'enable_prefix_caching="True"} 1.0'
                    ]
                    if fake.counters:
                        lines += [
                            f'vllm:prefix_cache_queries_total{{engine="0",model_name="tiny"}} {fake.q}.0',
                            f'vllm:prefix_cache_hits_total{{engine="0",model_name="tiny"}} {fake.h}.0',
                        ]
                    self._send(200, "\n".join(lines) + "\n", "text/plain")
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/reset_prefix_cache":
                    fake.cached.clear()
                    self._send(200, {})
                    return
                with fake.lock:
                    r = fake.n
                    fake.n += 1
                    if fake.die_at is not None and r >= fake.die_at:
                        threading.Thread(target=fake.die).start()
                        self.close_connection = True
                        return
                    rid = f"cmpl-{self.headers.get('X-Request-Id') or f'fake{r}'}"
                    if fake.log is not None:
                        with open(fake.log, "a") as f:
                            f.write(
                                f"{time.time():.6f} 1 INFO vllm.v1.engine.async_llm: Added request {rid}-0-{r:08x}.\n"
                            )
                    p = list(body["prompt"])
                    m = int(body["max_tokens"])
                    out = [1000 + (len(p) * 7 + i) % 5000 for i in range(m)]
                    b = fake.b
                    k = 0
                    while (k + 1) * b <= len(p) - 1 and tuple(p[: (k + 1) * b]) in fake.cached:
                        k += 1
                    seq = p + out[: m - 1]
                    for j in range(1, len(seq) // b + 1):
                        fake.cached.add(tuple(seq[: j * b]))
                    hit = k * b - (b if r == fake.lie_at and k else 0)
                    fake.q += len(p)
                    fake.h += hit
                self._send(
                    200,
                    {
                        "id": rid,
                        "choices": [{"token_ids": out, "text": ""}],
                        "usage": {
                            "prompt_tokens": len(p),
                            "completion_tokens": m,
                            "prompt_tokens_details": {"cached_tokens": hit},
                        },
                        # vLLM --enable-per-request-metrics
                        "metrics": {"queue_time_ms": 0.0, "time_to_first_token_ms": 0.2, "generation_time_ms": 0.1},
                    },
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def die(self):
        self.server.shutdown()
        self.server.server_close()  # connections are refused from now on, as from a killed process

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *a):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _run(url, trace, **kw):
    return replay(build(ReplayRequest, endpoint=url, trace=trace, **kw))


def test_replay_against_fake_server_matches_and_logs(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeVllm() as srv:
        res = _run(srv.url, path, check=True, log=tmp_path / "log.parquet", system_prompt_tokens=20)
    assert res.completed == res.requests == 18 and not res.partial
    assert res.check["mismatching_requests"] == 0 and res.check["passed"]
    assert res.counters["equal_to_per_request_sums"]
    assert res.check["measured_hit_tokens_all"] > 0  # shared system prompt and histories do hit
    log = pq.read_table(tmp_path / "log.parquet")
    meta = json.loads(log.schema.metadata[b"kvhit_replay"])
    assert meta["partial"] is False
    d = log.to_pydict()
    assert d["cached_tokens"] == d["simulated_hit_tokens"] and set(d["status"]) == {"ok"}


def test_replay_check_finds_a_lying_server(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeVllm(lie_at=5) as srv:
        res = _run(srv.url, path, check=True, system_prompt_tokens=20)
    assert res.check["mismatching_requests"] == 1 and res.check["first_mismatch"]["request"] == 5
    assert res.check["passed"] is False


def test_replay_server_dies_midway_keeps_partial_log(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeVllm(die_at=7) as srv:
        res = _run(srv.url, path, log=tmp_path / "log.parquet", retries=1)
    assert res.partial and res.completed == 7 and res.error and "\n" not in res.error
    meta = json.loads(pq.read_table(tmp_path / "log.parquet").schema.metadata[b"kvhit_replay"])
    assert meta["partial"] is True and meta["completed"] == 7
    st = pq.read_table(tmp_path / "log.parquet").column("status").to_pylist()
    assert st[:7] == ["ok"] * 7 and "ok" not in st[7:]


@pytest.mark.parametrize(
    ("fake_kw", "req_kw", "needle"),
    [
        ({"metrics": False}, {}, "not a vLLM server"),
        ({"counters": False}, {}, "vllm:prefix_cache_queries_total"),
        ({}, {"model": "other"}, "--model other"),
        ({"max_len": 40}, {}, "max_model_len"),
        ({}, {"block_size": 32}, "--block-size 32"),
        ({}, {"speedup": 2.0, "concurrency": 2}, "--speedup and --concurrency"),
        ({}, {"concurrent_model": "exact"}, "--concurrent-model"),
        ({}, {"max_num_batched_tokens": 0}, "--max-num-batched-tokens"),
        ({}, {"max_num_seqs": 0}, "--max-num-seqs"),
    ],
)
def test_replay_refusals_are_one_line(tmp_path, fake_kw, req_kw, needle):
    path = tmp_path / "t.parquet"
    _chat_trace(path)
    with FakeVllm(**fake_kw) as srv:
        with pytest.raises(InputError) as e:
            _run(srv.url, path, **req_kw)
        assert srv.n == 0  # nothing was sent
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_replay_unreachable_endpoint(tmp_path):
    import socket

    path = tmp_path / "t.parquet"
    _chat_trace(path)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(InputError, match=r"--endpoint http://127\.0\.0\.1:\d+: no server answers"):
        _run(f"http://127.0.0.1:{port}", path)


def test_replay_closed_loop_concurrency_matches_in_aggregate(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=8)
    with FakeVllm() as srv:
        res = _run(srv.url, path, check=True, concurrency=4, log=tmp_path / "log.parquet")
    # nothing is evicted (1,000 blocks): neither the scheduler model nor holds changes a hit; reported per request
    # for both models, gating nothing
    assert res.check["per_request"] is False and res.check["passed"] is None
    assert res.check["simulated_minus_measured"] == 0.0
    cc = res.check["concurrent"]
    assert cc["model"] == "scheduler"
    for name in ("scheduler", "holds"):
        assert cc[name]["mismatching_requests"] == 0 and cc[name]["simulated_minus_measured"] == 0.0
    assert cc["scheduler"]["clock"] == "measured (server timings)" and cc["scheduler"]["preemptions"] == 0
    # the log holds the ids as sent and returned, so the check can be re-run from it alone
    t = pq.read_table(tmp_path / "log.parquet").to_pydict()
    assert t["simulated_hit_tokens_scheduler"] == t["cached_tokens"] == t["simulated_hit_tokens_holds"]
    assert [len(x) for x in t["prompt_ids"]] == t["prompt_tokens"]
    assert [len(x) for x in t["output_ids"]] == t["completion_tokens"]
    assert set(t["server_ttft_ms"]) == {0.2} and set(t["server_generation_ms"]) == {0.1}
    for r, pv in enumerate(t["prev_request"]):
        if pv >= 0:
            prompt, prev = t["prompt_ids"][r], t["prompt_ids"][pv] + t["output_ids"][pv]
            assert prompt[: len(prev)] == prev


def test_replay_cli_prints_both_concurrent_models(tmp_path):
    from clihelp import kvhit

    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=4)
    with FakeVllm() as srv:
        r = kvhit("replay", "--endpoint", srv.url, "--trace", str(path), "--check", "--concurrency", "3")
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    assert "concurrent, vLLM's scheduler (the simulated row): 0 of 12 requests differ" in out
    assert "concurrent, holds from measured times: 0 of 12 requests differ" in out
    assert "steps paced by the measured finish times and the server's own timings; 0 preemptions" in out


def test_replay_block_id_trace_against_fake_server(tmp_path):
    f = tmp_path / "t.jsonl"
    recs = [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2, 3]},
        {"timestamp": 5, "input_length": 1030, "output_length": 2, "hash_ids": [1, 2, 4]},
        {"timestamp": 9, "input_length": 600, "output_length": 2, "hash_ids": [7, 8]},
    ]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    with FakeVllm(b=16) as srv:
        res = replay(build(ReplayRequest, endpoint=srv.url, blocks_trace=f, tokens_per_block=32, check=True))
    # request 1 is the two 512-token blocks it shares with request 0 (64 replayed tokens, its 6-token tail scales to
    # none): 4 server blocks of 16, of which 3 hit (the hit is capped at T − 1 tokens)
    assert res.source == "block-ids" and res.completed == 3
    assert res.check["mismatching_requests"] == 0 and res.check["measured_hit_tokens_all"] == 48


def test_replay_exclude_drain_and_stationarity(tmp_path):
    """--exclude-drain keeps exactly the requests at or before the last conversation's arrival (counted here from
    the trace itself); a 6-conversation trace is no steady state, and the estimator's number is flagged."""
    path = tmp_path / "t.parquet"
    tr = _chat_trace(path, n_conv=6, turns=3)
    t = np.asarray(tr["time"])
    conv = np.asarray(tr["conv"])
    last_arrival = max(t[conv == c].min() for c in np.unique(conv))
    first_conv = conv[np.argmin(t)]
    keep = (t <= last_arrival) & (conv != first_conv)
    T = np.asarray(tr["cum_tokens"])
    with FakeVllm() as srv:
        full = _run(srv.url, path, check=True, warmup=1)
        res = _run(srv.url, path, check=True, warmup=1, exclude_drain=True)
    assert full.measured["requests"] == int((conv != first_conv).sum()) == 15
    assert res.measured["requests"] == int(keep.sum()) < 15
    assert res.measured["prompt_tokens"] == int(T[keep].sum())
    assert res.check["mismatching_requests"] == 0  # the per-request check still covers every request
    st = res.measured["stationarity"]
    assert st["stationary"] is False and st["message"].startswith("NOT STATIONARY")
    assert res.check["estimator_applies"] is False
    assert any("steady-state model" in n for n in res.notes)
