"""The engine's clock for the concurrent check: the server log's 'Added request' lines (kvhit.replay.serverlog) and
the scheduler model and the holds anchored on them (simulate_recorded_scheduler(server_added=…),
server_clock_holds); refusals of bad logs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvhit.replay.check import server_clock_holds, simulate_recorded, simulate_recorded_scheduler
from kvhit.replay.serverlog import ServerLogError, added_times, anchor_times, external_id
from kvhit.service.base import build
from kvhit.service.errors import InputError
from kvhit.service.replay import ReplayRequest, replay
from test_replay import FakeVllm, _chat_trace

# what vLLM 0.32.0 writes with live/vllm_logging.json and --enable-log-requests (ids: cmpl-<X-Request-Id>-0-<8 hex>)
LOG = """\
1796307100.100000 31432 INFO vllm.entrypoints.openai.api_server: vLLM API server version 0.32.0
1796307107.219552 31432 INFO vllm.v1.engine.async_llm: Added request cmpl-kvhit-ab12-0-0-1a2b3c4d.
Traceback-looking noise without the marker
1796307107.250001 31432 INFO vllm.v1.engine.async_llm: Added request cmpl-kvhit-ab12-1-0-deadbeef.
1796307107.300000 31432 INFO vllm.v1.engine.async_llm: Added request cmpl-0f9e8d7c6b5a-0-00ff00ff.
"""


def test_external_id_strips_the_prompt_index_and_random_suffix():
    assert external_id("cmpl-kvhit-ab12-17-0-1a2b3c4d") == "cmpl-kvhit-ab12-17"
    assert external_id("cmpl-abc-3-0123abcd") == "cmpl-abc"
    assert external_id("cmpl-no-suffix") == "cmpl-no-suffix"  # not an engine id: unchanged


def test_added_times_parses_only_marked_lines(tmp_path):
    f = tmp_path / "server.log"
    f.write_text(LOG)
    t = added_times(f)
    assert t == {
        "cmpl-kvhit-ab12-0": 1796307107.219552,
        "cmpl-kvhit-ab12-1": 1796307107.250001,
        "cmpl-0f9e8d7c6b5a": 1796307107.3,
    }
    a = anchor_times(f, ["cmpl-kvhit-ab12-1", None, "cmpl-kvhit-ab12-0"])
    assert a[0] == 1796307107.250001 and np.isnan(a[1]) and a[2] == 1796307107.219552


@pytest.mark.parametrize(
    "text, needle",
    [
        # vLLM's default format: second resolution, no Unix time at the start
        (
            "INFO 12-03 14:11:47 [async_llm.py:578] Added request cmpl-x-0-1a2b3c4d.\n",
            r"server\.log, line 1: an 'Added request' line without a Unix time .*VLLM_LOGGING_CONFIG_PATH",
        ),
        (
            LOG + LOG.splitlines()[1] + "\n",
            r"server\.log, line 6: request cmpl-kvhit-ab12-0 was already added at line 2",
        ),
    ],
)
def test_bad_lines_are_refused_with_file_and_line(tmp_path, text, needle):
    f = tmp_path / "server.log"
    f.write_text(text)
    with pytest.raises(ServerLogError, match=needle):
        added_times(f)


def test_missing_request_is_refused_with_file_and_request(tmp_path):
    f = tmp_path / "server.log"
    f.write_text(LOG)
    with pytest.raises(ServerLogError, match=r"server\.log: no 'Added request' line for request 1 \(id cmpl-zz\)"):
        anchor_times(f, ["cmpl-kvhit-ab12-0", "cmpl-zz"])
    f.write_text("1796307100.1 1 INFO vllm: started\n")
    with pytest.raises(ServerLogError, match="start the server with --enable-log-requests"):
        anchor_times(f, ["cmpl-a"])
    with pytest.raises(ServerLogError, match="cannot be read"):
        anchor_times(tmp_path / "nope.log", ["cmpl-a"])


def test_anchored_clock_hand_case():
    """Two requests share an 8-token prefix (blocks of 4, 3 usable blocks, one output token each, so A keeps its
    2 full blocks and B its first 2): whichever reaches the scheduler first misses, the other hits. The client sent
    A at 0.0 and B at 0.1, but A's answer took 1.1 s (a slow HTTP way out) and B's 0.15 s; both engines spent
    50 ms (no queue, a one-step prefill, no decode). The client's clock splits each HTTP overhead evenly:
    o_A = 1.1 − 0.05 = 1.05 puts A at the scheduler at 0.525, o_B = 0.15 − 0.05 = 0.10 puts B at 0.15 — B first:
    B misses, A then finds B's 2 blocks, capped at (8 − 1) // 4 = 1 block: 4 tokens. The server log says A was
    handed to the engine at +0.05 and B at +0.12: A first (done at +0.10), A misses, B finds A's 2 free cached
    blocks, capped at (9 − 1) // 4 = 2: 8 tokens, and fits (3 blocks needed − 2 hit + 2 evictable ≤ 3 free)."""
    prompts = [np.arange(1, 9), np.arange(1, 10)]
    outputs = [np.array([100]), np.array([101])]
    kw = dict(
        block_size=4,
        num_gpu_blocks=4,
        t_send=np.array([0.0, 0.1]),
        t_done=np.array([1.1, 0.25]),
        server_ms=(np.array([0.0, 0.0]), np.array([50.0, 50.0]), np.array([0.0, 0.0])),
    )
    client, ci = simulate_recorded_scheduler(prompts, outputs, **kw)
    assert ci["clock"] == "measured (server timings)"
    assert client.tolist() == [4, 0]
    anch, ai = simulate_recorded_scheduler(prompts, outputs, server_added=np.array([1000.05, 1000.12]), **kw)
    assert ai["clock"] == "anchored (server log)"
    assert anch.tolist() == [0, 8]
    # a request without an anchor (NaN) leaves the client's clock in charge
    part, pi = simulate_recorded_scheduler(prompts, outputs, server_added=np.array([1000.05, np.nan]), **kw)
    assert pi["clock"] == "measured (server timings)" and part.tolist() == [4, 0]


def test_anchored_clock_equals_client_clock_at_the_client_arrivals():
    """With anchors where the client's clock puts each request (send + half the HTTP overhead) and no chat
    dependencies, both clocks give the same arrivals and due times: the same hits, request by request."""
    rng = np.random.default_rng(3)
    n = 40
    shared = rng.integers(1, 500, 64)
    prompts = [
        np.concatenate([shared[: rng.integers(8, 64)], rng.integers(500, 900, rng.integers(1, 40))]) for _ in range(n)
    ]
    outputs = [rng.integers(1000, 2000, rng.integers(1, 6)) for _ in range(n)]
    ts = np.sort(rng.uniform(0, 2, n))
    q, f, g = rng.uniform(0, 30, n), rng.uniform(5, 40, n), rng.uniform(0, 60, n)
    o = rng.uniform(0.01, 0.3, n)
    td = ts + o + (q + f + g) / 1e3
    kw = dict(block_size=8, num_gpu_blocks=12, t_send=ts, t_done=td, server_ms=(q, f, g))
    client, ci = simulate_recorded_scheduler(prompts, outputs, **kw)
    anch, ai = simulate_recorded_scheduler(prompts, outputs, server_added=ts + o / 2, **kw)
    assert ai["clock"] == "anchored (server log)" and ci["clock"] == "measured (server timings)"
    assert anch.tolist() == client.tolist()
    assert ci["preemptions"] + (client > 0).sum() > 0  # the case exercises hits (and, here, the pool)


def test_server_clock_holds_hand_case():
    """Holds on the server's clock run from the first schedule (anchor + queue) to the last token (+ ttft +
    generation). Two requests share an 8-token prefix (blocks of 4, 5 usable blocks, one output token each: A keeps
    2 full blocks, B its first 2 of 9 tokens): whoever is admitted first misses, the other hits — A capped at
    (8 − 1) // 4 = 1 block (4 tokens), B at (9 − 1) // 4 = 2 blocks (8 tokens). The client sent B at 0.0 and A at
    0.1: holds on the client's clock admit B first → [4, 0]. The server log has B added at +0.00 and A at +0.02,
    but B waited 50 ms in the queue and A none: first schedules A at 0.02, B at 0.05 — A first; with 50 ms to the
    first token and no decode A holds [0.02, 0.07], B [0.05, 0.10], so B is admitted while A runs and finds
    its 2 cached blocks → [0, 8]. Holds from the arrival instead (no queue) would put B first again → [4, 0]."""
    prompts = [np.arange(1, 9), np.arange(1, 10)]
    outputs = [np.array([100]), np.array([101])]
    kw = dict(block_size=4, num_gpu_blocks=6)
    server_ms = (np.array([0.0, 50.0]), np.array([50.0, 50.0]), np.array([0.0, 0.0]))
    start, end = server_clock_holds(np.array([1000.02, 1000.0]), server_ms)
    np.testing.assert_allclose(start, [0.02, 0.05], atol=1e-9)
    np.testing.assert_allclose(end, [0.07, 0.10], atol=1e-9)
    client = simulate_recorded(prompts, outputs, t_send=np.array([0.1, 0.0]), t_done=np.array([0.3, 0.2]), **kw)
    assert client.tolist() == [4, 0]
    assert simulate_recorded(prompts, outputs, t_send=start, t_done=end, **kw).tolist() == [0, 8]
    arrival = simulate_recorded(prompts, outputs, t_send=np.array([0.02, 0.0]), t_done=end, **kw)
    assert arrival.tolist() == [4, 0]
    # anything missing (an anchor, a duration): no server clock
    assert server_clock_holds(np.array([1000.0, np.nan]), server_ms) is None
    assert server_clock_holds(np.array([1000.0, 1000.1]), (server_ms[0], np.array([1.0, np.nan]), server_ms[2])) is None
    assert server_clock_holds(None, server_ms) is None


def _req(url, path, **kw):
    return build(ReplayRequest, endpoint=url, trace=path, check=True, **kw)


def test_replay_with_server_log_uses_the_anchored_clock(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=6)
    slog = tmp_path / "server.log"
    slog.write_text("")
    with FakeVllm(log=slog) as srv:
        res = replay(_req(srv.url, path, concurrency=3, server_log=slog, log=tmp_path / "log.parquet"))
    cc = res.check["concurrent"]
    assert cc["scheduler"]["clock"] == "anchored (server log)"
    # nothing is evicted (1,000 blocks): every clock gives the server's hits
    for name in ("scheduler", "scheduler_client_clock", "holds", "holds_client_clock"):
        assert cc[name]["mismatching_requests"] == 0
    assert cc["holds"]["clock"] == "server (first schedule to last token)"
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "log.parquet").to_pydict()
    assert all(x.startswith("cmpl-kvhit-") for x in t["response_id"])
    assert np.all(np.isfinite(t["server_added_unix"]))


def test_replay_with_a_bad_server_log_exits_2_in_one_line(tmp_path):
    from clihelp import kvhit

    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=3)
    slog = tmp_path / "server.log"
    slog.write_text("INFO 12-03 14:11:47 [async_llm.py:578] Added request cmpl-x-0-1a2b3c4d.\n")
    with FakeVllm() as srv:  # writes no log of its own
        args = ("replay", "--endpoint", srv.url, "--trace", str(path), "--check", "--concurrency", "2")
        r = kvhit(*args, "--server-log", str(slog), "--log", str(tmp_path / "l.parquet"))
        assert r.code == 2
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
        assert "server.log, line 1: an 'Added request' line without a Unix time" in " ".join(r.err.split())
        assert (tmp_path / "l.parquet").exists()  # the replay's log is kept
        r = kvhit(*args, "--server-log", str(tmp_path / "none.log"))
        assert r.code == 2 and "--server-log" in r.err and "no such file" in r.err


def test_missing_request_in_server_log_refused(tmp_path):
    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=3)
    slog = tmp_path / "server.log"
    slog.write_text(LOG)  # another replay's lines
    with FakeVllm() as srv, pytest.raises(InputError, match=r"server\.log: no 'Added request' line for request 0"):
        replay(_req(srv.url, path, concurrency=2, server_log=slog))


@given(
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    st.integers(0, 2**32 - 1),
    st.floats(1e9, 4e9, allow_nan=False),
)
def test_parser_round_trips_any_id(tmp_path_factory, rid, suffix, t):
    """Whatever X-Request-Id a client sends (printable, no spaces), the engine id vLLM logs maps back to the
    response id, and the logged time comes back to the microsecond."""
    f = tmp_path_factory.mktemp("log") / "server.log"
    resp = f"cmpl-{rid}"
    f.write_text(f"{t:.6f} 7 INFO vllm.v1.engine.async_llm: Added request {resp}-0-{suffix:08x}.\n")
    (got,) = anchor_times(f, [resp])
    assert got == float(f"{t:.6f}")


def test_cli_prints_both_clocks_for_scheduler_and_holds(tmp_path):
    from clihelp import kvhit

    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=4)
    slog = tmp_path / "server.log"
    slog.write_text("")
    with FakeVllm(log=slog) as srv:
        r = kvhit(
            "replay", "--endpoint", srv.url, "--trace", str(path), "--check", "--concurrency", "2",
            "--server-log", str(slog),
        )  # fmt: skip
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    for what in (
        "vLLM's scheduler on the server's clock",
        "vLLM's scheduler on the client's clock",
        "holds on the server's clock (first schedule to last token)",
        "holds on the client's clock (send to finish)",
    ):
        assert f"concurrent, {what}" in out
