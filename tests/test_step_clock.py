"""The step clock: vLLM's KV event batches as observed step ends of the scheduler model
(simulate_schedule(marks=…), kvhit.replay.kvevents, simulate_recorded_scheduler(kv_events=…), kvhit replay
--kv-events); refusals of bad event files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.replay.check import simulate_recorded_scheduler
from kvhit.replay.kvevents import KvEventsError, prefix_keys, read_kv_events, step_marks
from kvhit.sim.vllm.blockids import hashes_from_token_ids
from kvhit.sim.vllm.scheduler import SchedRequest, simulate_schedule
from test_replay import FakeVllm, _chat_trace


def _reqs(seqs, prompts, arrivals, b):
    off, hs = hashes_from_token_ids([np.asarray(s, np.int64) for s in seqs], b)
    return [
        SchedRequest(
            i, prompts[i], len(seqs[i]) - prompts[i] + 1, tuple(int(x) for x in hs[off[i] : off[i + 1]]), arrivals[i]
        )
        for i in range(len(seqs))
    ]


@st.composite
def workloads(draw):
    """3–7 requests on 4-token blocks, some sharing the first 1–2 blocks of an earlier one, arrivals and
    deadlines at random; N small enough for evictions (and preemptions)."""
    n = draw(st.integers(3, 7))
    seqs, prompts, arrivals, dls = [], [], [], []
    t = 0.0
    for r in range(n):
        base = []
        if r and draw(st.booleans()):
            src = seqs[draw(st.integers(0, r - 1))]
            base = list(src[: draw(st.sampled_from([4, 8]))])
        T = len(base) + draw(st.integers(1, 8))
        m = draw(st.integers(1, 6))
        toks = base + [1000 + 50 * r + i for i in range(T + m - 1 - len(base))]
        seqs.append(toks)
        prompts.append(T)
        t += draw(st.floats(0.0, 0.3))
        arrivals.append(t)
        dls.append(t + draw(st.floats(0.05, 1.0)))
    return seqs, prompts, arrivals, dls, draw(st.integers(4, 8))


@settings(max_examples=60, deadline=None)
@given(workloads(), st.integers(0, 3))
def test_own_step_ends_fed_back_reproduce_the_run_exactly(w, every):
    """The model's own stores (the steps a vLLM engine would publish a batch for) fed back as marks — all of them,
    or every 2nd/3rd/4th — reproduce its hits, admissions, finishes and every step, bit for bit."""
    seqs, prompts, arrivals, dls, N = w
    reqs = _reqs(seqs, prompts, arrivals, 4)
    try:
        res = simulate_schedule(reqs, N=N, block_size=4, deadlines=dls)
    except ValueError:  # a request longer than N blocks
        return
    marks = [lst[:: every + 1] for lst in res.stores]
    again = simulate_schedule(reqs, N=N, block_size=4, deadlines=dls, marks=marks)
    np.testing.assert_array_equal(again.hit_tokens, res.hit_tokens)
    np.testing.assert_array_equal(again.admitted, res.admitted)
    np.testing.assert_array_equal(again.finished, res.finished)
    # every step starts (and so ends) at the same time; a marked step's duration is recomputed as end − start
    np.testing.assert_array_equal(again.steps[:, [0, 2, 3]], res.steps[:, [0, 2, 3]])
    np.testing.assert_allclose(again.steps[:, 1], res.steps[:, 1], rtol=1e-12, atol=1e-15)
    assert again.marked_steps == len({t for lst in marks for _, t in lst})
    assert again.mark_conflicts == 0


# found by a search over small workloads, then read step by step (N = 4 blocks of 4 tokens)
SEQS = [
    [9283, 3150, 3332, 9333, 9946, 4923, 8984, 5384],
    [9791, 5625, 8938, 9473, 3820, 9003, 7234],
    [4770, 1787, 1094, 6049, 4098],
    [9791, 5625, 8938, 9473, 4909, 8559, 8288],
]
PROMPTS = [3, 5, 5, 6]
ARRIVALS = [0.2672, 0.4242, 0.4452, 0.7108]
DEADLINES = [0.8369, 1.2522, 0.774, 1.6209]


def test_a_shifted_step_end_moves_an_admission_across_an_eviction():
    """Request 3 repeats request 1's first block. Request 0's first stored block (its decode step at 4 computed
    tokens) ending at 0.457 s: request 1 finishes at 0.742 while request 0 still runs, request 2 is admitted then
    and takes request 1's cached block from the free queue (evicted); request 3, waiting behind request 2, finds
    nothing. The same step ending 50 ms earlier: the later steps are paced anew, requests 0 and 1 finish together
    at 0.837, request 2 takes request 0's freed blocks instead (as many evictions, other blocks), and request 3 —
    admitted in that same step — hits the block."""
    reqs = _reqs(SEQS, PROMPTS, ARRIVALS, 4)
    kw = dict(N=4, block_size=4, deadlines=DEADLINES)
    late = simulate_schedule(reqs, marks=[[(4, 0.457)], [], [], []], **kw)
    early = simulate_schedule(reqs, marks=[[(4, 0.407)], [], [], []], **kw)
    assert late.hit_tokens.tolist() == [0, 0, 0, 0]
    assert early.hit_tokens.tolist() == [0, 0, 0, 4]
    assert late.steps[2, 0] == pytest.approx(0.457) and early.steps[2, 0] == pytest.approx(0.407)
    # late: request 2 is admitted (evicting) while request 0 runs, before request 3's admission
    assert late.admitted[2] < late.admitted[3] and late.admitted[2] < late.finished[0]
    # early: both admitted in the step after requests 0 and 1 finished
    assert early.admitted[2] == early.admitted[3] == early.finished[0] == pytest.approx(early.finished[1], abs=1e-5)
    # without marks the deadline rule alone gives the late case here
    assert simulate_schedule(reqs, **kw).hit_tokens.tolist() == [0, 0, 0, 0]


def test_spread_pacing_meets_the_mark_and_a_covered_mark_is_skipped():
    reqs = _reqs(SEQS, PROMPTS, ARRIVALS, 4)
    kw = dict(N=4, block_size=4, deadlines=DEADLINES)
    sp = simulate_schedule(reqs, marks=[[(4, 0.407)], [], [], []], mark_pacing="spread", **kw)
    assert sp.steps[1, 0] + sp.steps[1, 1] == pytest.approx(0.407)  # request 0's decode step 1 ends at its mark
    # "targets": the steps before a late mark are stretched towards it (the deadline rule alone would end the
    # first step at 0.362; the mark at 0.6 is two steps on, so each lasts about (0.6 − 0.267) / 2)
    tg = simulate_schedule(reqs, marks=[[(4, 0.6)], [], [], []], mark_pacing="targets", **kw)
    fo = simulate_schedule(reqs, marks=[[(4, 0.6)], [], [], []], **kw)
    assert fo.steps[0, 1] == pytest.approx(0.095, abs=1e-3) and fo.steps[1, 1] == pytest.approx(0.238, abs=1e-3)
    assert tg.steps[0, 1] == pytest.approx((0.6 - 0.2672) / 2) and tg.steps[1, 0] + tg.steps[1, 1] == pytest.approx(0.6)
    # a mark for tokens the request's prefix hit covers is not one of its steps: request 3 hits 4 tokens
    base = simulate_schedule(reqs, marks=[[(4, 0.407)], [], [], []], **kw)
    skip = simulate_schedule(reqs, marks=[[(4, 0.407)], [], [], [(4, 0.1)]], **kw)
    np.testing.assert_array_equal(skip.steps, base.steps)
    with pytest.raises(ValueError, match="mark_pacing"):
        simulate_schedule(reqs, marks=[[], [], [], []], mark_pacing="x", **kw)
    with pytest.raises(ValueError, match="one list per request"):
        simulate_schedule(reqs, marks=[[]], **kw)


def _events_file(path, seqs, store_times, b, t_reset):
    """Batches as live/kv_events.py writes them: a reset, then for every step end that stored blocks one batch
    with a BlockStored of each request's full blocks so far (hashes: the prefix keys' hex)."""
    by_t: dict[float, list] = {}
    for r, lst in enumerate(store_times):
        keys = prefix_keys(seqs[r], b)
        for n_tok, t in lst:
            k = n_tok // b
            by_t.setdefault(t, []).append(["S", [x.hex() for x in keys[:k]], None, [int(x) for x in seqs[r][: k * b]]])
    with open(path, "w") as f:
        f.write(json.dumps({"ts": t_reset, "ev": [["C"]]}) + "\n")
        for t in sorted(by_t):
            f.write(json.dumps({"ts": t, "ev": by_t[t] + [["R", ["ab"]]]}) + "\n")


def test_recorded_check_reproduces_itself_from_its_own_events(tmp_path):
    """On the anchored clock, the events the model itself would publish (its stores, as an events file) give the
    same hits: the marks built from them (blocks no earlier request holds) coincide with the model's steps."""
    b, rng = 4, np.random.default_rng(3)
    n = 24
    prompts, outputs, prev = [], [], np.full(n, -1, np.int64)
    for r in range(n):
        if r >= 4 and rng.random() < 0.6:  # a next turn of request r - 4: its history and new tokens
            p = np.concatenate([prompts[r - 4], outputs[r - 4], rng.integers(1, 9999, 3)])
            prev[r] = r - 4
        else:
            p = rng.integers(1, 9999, int(rng.integers(3, 12)))
        prompts.append(p)
        outputs.append(rng.integers(1, 9999, int(rng.integers(1, 6))))
    added = 1.8e9 + np.cumsum(rng.uniform(0.0, 0.05, n))
    ms = (rng.uniform(0, 20, n), rng.uniform(5, 30, n), rng.uniform(10, 90, n))
    tt = np.zeros(n)
    kw = dict(block_size=b, num_gpu_blocks=9, t_send=tt, t_done=tt + 1, prev=prev, server_ms=ms, server_added=added)
    hit, info = simulate_recorded_scheduler(prompts, outputs, **kw)
    seqs = [np.concatenate([p, o[:-1]]) for p, o in zip(prompts, outputs, strict=True)]
    ev = tmp_path / "events.jsonl"
    _events_file(ev, seqs, info["store_times"], b, float(added.min()) - 1.0)
    batches = read_kv_events(ev, b)
    hit2, info2 = simulate_recorded_scheduler(prompts, outputs, kv_events=batches, **kw)
    np.testing.assert_array_equal(hit2, hit)
    assert info2["clock"] == "step clock (KV events)"
    assert info2["step_clock"]["marks"] > 0 and info2["step_clock"]["mark_conflicts"] == 0
    assert info2["preemptions"] == info["preemptions"]
    with pytest.raises(ValueError, match="server's clock"):
        simulate_recorded_scheduler(prompts, outputs, kv_events=batches, **{**kw, "server_added": None})


def test_step_marks_use_new_blocks_only_and_the_run_after_its_reset():
    b = 2
    seqs = [[1, 2, 3, 4], [1, 2, 5, 6, 7]]  # request 1 shares block [1, 2]: only its block [5, 6] is new
    k0, k1 = prefix_keys(seqs[0], b), prefix_keys(seqs[1], b)
    batches = [
        (9.0, k1[1:], False),  # an earlier run's store, before the reset
        (9.5, [], True),  # an earlier reset
        (10.2, k0[:1], True),  # this run's reset, published with its first step (after the first arrival)
        (10.3, k0[1:], False),
        (10.6, k1, False),
        (10.9, k1[1:], False),
    ]
    marks, info = step_marks(seqs, [10.0, 10.5], batches, b)
    assert marks == [[(2, 10.2), (4, 10.3)], [(4, 10.6)]]
    assert info == {"batches": 4, "new_blocks": 3, "marks": 3}
    # a reset in a later batch is another run's: ignored
    marks, _ = step_marks(seqs, [10.0, 10.5], batches + [(11.0, k0, True)], b)
    assert marks == [[(2, 10.2), (4, 10.3)], [(4, 10.6)]]
    with pytest.raises(KvEventsError, match="no stored block after the run's start"):
        step_marks(seqs, [10.0, 10.5], [(9.0, k0, False), (9.5, [], True)], b)


def test_a_reset_batch_keeps_the_stores_after_the_reset(tmp_path):
    """vLLM publishes AllBlocksCleared with the next step's batch: the stores after it in that batch are this
    run's first (the first request's blocks); those before it are the previous run's."""
    f = tmp_path / "events.jsonl"
    f.write_text('{"ts": 5.0, "ev": [["S", ["a"], null, [7, 8]], ["C"], ["S", ["b"], null, [1, 2]], ["R", ["b"]]]}\n')
    ((ts, stored, reset),) = read_kv_events(f, 2)
    assert ts == 5.0 and reset and stored == prefix_keys([1, 2], 2)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("not json\n", r"events\.jsonl, line 1: not a JSON object"),
        ('{"ts": 1.0, "ev": []}\n{"ev": []}\n', r"events\.jsonl, line 2: 'ts' must be a finite Unix time"),
        ('{"ts": 2.0, "ev": []}\n{"ts": 1.0, "ev": []}\n', r"line 2: 'ts' 1\.0 is earlier than the previous"),
        ('{"ts": 1.0, "ev": [["S", ["a"], null, [1, 2, 3]]]}\n', r"line 1: a stored event of 1 blocks has 3 token ids"),
        ('{"ts": 1.0, "ev": [["X"]]}\n', r"line 1: unknown event"),
        ('{"ts": 1.0, "ev": [["R"]]}\n', r"line 1: a removed event must be"),
        ("\n", r"events\.jsonl: no event batches"),
    ],
)
def test_bad_event_files_are_refused_with_file_and_line(tmp_path, text, needle):
    f = tmp_path / "events.jsonl"
    f.write_text(text)
    with pytest.raises(KvEventsError, match=needle):
        read_kv_events(f, 2)
    with pytest.raises(KvEventsError, match="cannot be read"):
        read_kv_events(tmp_path / "none.jsonl", 2)


def test_replay_refuses_a_bad_events_file_in_one_line(tmp_path):
    from clihelp import kvhit

    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=3)
    slog = tmp_path / "server.log"
    slog.write_text("")
    ev = tmp_path / "events.jsonl"
    ev.write_text('{"ts": 1.0, "ev": []}\n{"ts": "late", "ev": []}\n')
    with FakeVllm(log=slog) as srv:
        args = ("replay", "--endpoint", srv.url, "--trace", str(path), "--check", "--concurrency", "2")
        r = kvhit(*args, "--server-log", str(slog), "--kv-events", str(ev), "--log", str(tmp_path / "l.parquet"))
        assert r.code == 2
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
        assert "events.jsonl, line 2: 'ts' must be a finite Unix time" in " ".join(r.err.split())
        assert (tmp_path / "l.parquet").exists()  # the replay's log is kept
        r = kvhit(*args, "--kv-events", str(ev))
        assert r.code == 2 and "--kv-events: needs --server-log" in r.err and "Traceback" not in r.err
        r = kvhit(*args, "--server-log", str(slog), "--kv-events", str(tmp_path / "none.jsonl"))
        assert r.code == 2 and "--kv-events" in r.err and "no such file" in r.err


def test_replay_reports_the_step_clock_beside_the_server_clock(tmp_path):
    """kvhit replay --server-log --kv-events: the step clock is reported (scheduler_step_clock, its marks) and
    written to the log; events that store none of the replay's blocks leave it equal to the server's clock."""
    import time

    import pyarrow.parquet as pq

    from kvhit.service.base import build
    from kvhit.service.replay import ReplayRequest, replay

    path = tmp_path / "t.parquet"
    _chat_trace(path, n_conv=5)
    slog = tmp_path / "server.log"
    slog.write_text("")
    ev = tmp_path / "events.jsonl"
    ev.write_text(json.dumps({"ts": time.time() + 1e4, "ev": [["S", ["x"], None, list(range(16))]]}) + "\n")
    with FakeVllm(log=slog) as srv:
        req = build(
            ReplayRequest,
            endpoint=srv.url,
            trace=path,
            check=True,
            concurrency=3,
            server_log=slog,
            kv_events=ev,
            log=tmp_path / "log.parquet",
        )
        res = replay(req)
    cc = res.check["concurrent"]
    sc = cc["scheduler_step_clock"]
    assert (
        sc["marks"] == 0
        and sc["new_blocks"] > 0
        and sc["mismatching_requests"] == cc["scheduler"]["mismatching_requests"]
    )
    t = pq.read_table(tmp_path / "log.parquet").to_pydict()
    assert t["simulated_hit_tokens_scheduler_step_clock"] == t["simulated_hit_tokens_scheduler"]


@settings(max_examples=40, deadline=None)
@given(workloads())
def test_every_own_step_end_as_the_iteration_clock_reproduces_the_run(w):
    """step_ends = the run's own step ends (what --enable-logging-iteration-details logs: every step) reproduce
    the run; a grid shifted by half a step changes the step times (so the grid is used)."""
    seqs, prompts, arrivals, dls, N = w
    reqs = _reqs(seqs, prompts, arrivals, 4)
    try:
        res = simulate_schedule(reqs, N=N, block_size=4, deadlines=dls)
    except ValueError:
        return
    ends = res.steps[:, 0] + res.steps[:, 1]
    again = simulate_schedule(reqs, N=N, block_size=4, deadlines=dls, step_ends=ends)
    np.testing.assert_array_equal(again.hit_tokens, res.hit_tokens)
    np.testing.assert_allclose(again.steps[:, 0], res.steps[:, 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(again.finished, res.finished, rtol=1e-12, atol=1e-12)
    late = simulate_schedule(reqs, N=N, block_size=4, deadlines=dls, step_ends=np.unique(ends + 0.5 * res.steps[:, 1]))
    late_ends = late.steps[:, 0] + late.steps[:, 1]
    assert late.steps.shape != res.steps.shape or not np.allclose(late_ends, ends)
    with pytest.raises(ValueError, match="increasing"):
        simulate_schedule(reqs, N=N, block_size=4, deadlines=dls, step_ends=[1.0, 1.0])


def test_iteration_lines_are_read_and_bad_ones_refused(tmp_path):
    from kvhit.replay.serverlog import ServerLogError, iteration_times

    line = (
        "{t} 4182 INFO vllm.v1.metrics.loggers: Engine 000: Iteration({i}): 1 context requests, 11 context tokens, "
        "0 generation requests, 0 generation tokens, iteration elapsed time: 22.50 ms, CPU KV cache usage: 2.6%\n"
    )
    f = tmp_path / "server.log"
    f.write_text(line.format(t="10.5", i=0) + "noise\n" + line.format(t="10.75", i=1))
    np.testing.assert_array_equal(iteration_times(f), [10.5, 10.75])
    f.write_text(line.format(t="10.5", i=0) + line.format(t="10.75", i=2))
    with pytest.raises(ServerLogError, match=r"server\.log, line 2: Iteration\(2\) after Iteration\(0\)"):
        iteration_times(f)
    f.write_text("INFO 12-03 [loggers.py] " + line.format(t="x", i=0)[2:])
    with pytest.raises(ServerLogError, match=r"line 1: an 'Iteration\(…\)' line without a Unix time"):
        iteration_times(f)
    f.write_text("10.5 1 INFO started\n")
    with pytest.raises(ServerLogError, match="--enable-logging-iteration-details"):
        iteration_times(f)
