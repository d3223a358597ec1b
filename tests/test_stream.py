"""Streaming simulation (kvhit.sim.stream, kvhit.workload.chunks): chunked == whole trace, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvhit.sim.content.lru import ContentInputError, simulate_content
from kvhit.sim.runner import block_requests
from kvhit.sim.stream import BlockStream, ContentStream, block_request_chunk, simulate_stream
from kvhit.sim.vllm.block import BlockSimError, simulate_block
from kvhit.workload import SpecError, Trace, TraceError, WorkloadSpec
from kvhit.workload.chunks import (
    CONVERSATIONS_PER_BLOCK,
    EventChunk,
    check_chunk_args,
    materialize,
    parquet_chunks,
    spec_chunks,
)

SPEC = WorkloadSpec.from_toml(Path(__file__).resolve().parents[1] / "examples" / "scm.toml")
COLS = ("conv", "turn", "M", "R", "Z", "time", "conv_arrival")


@pytest.fixture(scope="module")
def trace() -> Trace:
    return materialize(SPEC, 11, 3000)


def _concat(chunks, name):
    return np.concatenate([getattr(c, name) for c in chunks])


# -- the chunked generator --------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(1, 3100))
def test_spec_chunks_equal_the_materialized_trace(trace, chunk):
    chunks = list(spec_chunks(SPEC, 11, 3000, chunk))
    assert [len(c) for c in chunks[:-1]] == [chunk] * (len(chunks) - 1) and 1 <= len(chunks[-1]) <= chunk
    assert [c.start for c in chunks] == [k * chunk for k in range(len(chunks))]
    for name in COLS:
        assert np.array_equal(_concat(chunks, name), trace[name]), name


def test_stream_trace_is_a_valid_time_sorted_trace_across_generator_blocks():
    # more events than one generator block holds conversations: the merge across blocks is exercised
    n = 5 * CONVERSATIONS_PER_BLOCK
    tr = materialize(SPEC, 3, n)
    assert tr.n_turns == n and tr["conv"].max() >= CONVERSATIONS_PER_BLOCK  # conversations of later blocks
    chunks = list(spec_chunks(SPEC, 3, n, 9973))
    for name in COLS:
        assert np.array_equal(_concat(chunks, name), tr[name]), name
    Trace.from_columns({c: tr[c] for c in COLS}, sort=False)  # validates: sorted, turns consecutive, R = ΣZ


def test_stream_trace_depends_on_the_seed_and_is_reproducible():
    a = _concat(spec_chunks(SPEC, 5, 2000, 700), "R")
    b = _concat(spec_chunks(SPEC, 5, 2000, 64), "R")
    c = _concat(spec_chunks(SPEC, 6, 2000, 700), "R")
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_stream_trace_follows_the_spec():
    # E[M] = 1/(1-p) = 4 and E[Z] over turns: the prompt-response model's A_R / E[M] = 25 blocks per turn (SCM)
    tr = materialize(SPEC, 1, 200_000)
    conv = tr.conversations()
    done = conv["observed"] == conv["M"]
    assert abs(conv["M"][done].mean() - 4.0) < 0.1
    arr = np.sort(conv["arrival"])
    assert abs(1.0 / np.diff(arr).mean() - 1.5) < 0.03  # λ0


# -- Algorithm 1 -------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(1, 3100), N=st.sampled_from([1, 20, 150, 2275, 10**9]))
def test_content_stream_equals_whole_trace(trace, chunk, N):
    whole = simulate_content(trace["conv"], trace["R"], N)
    cs = ContentStream(N)
    hit = np.concatenate([cs.push(c.conv, c.R, c.last) for c in spec_chunks(SPEC, 11, 3000, chunk)])
    assert np.array_equal(hit, whole.hit)
    r = cs.result()
    assert (r.hit_numerator, r.demand_blocks, r.evictions, r.evicted_blocks, r.max_resident) == (
        whole.reused_blocks,
        whole.total_blocks,
        whole.evictions,
        whole.evicted_blocks,
        whole.max_resident,
    )
    assert r.n_hits == whole.n_hits and r.n_events == 3000 and r.h == whole.hit_ratio
    weight = np.maximum(trace.R_prev() - 1, 0)  # eq. (31)
    assert r.hit_numerator_practical == int(weight[whole.hit.astype(bool)].sum())


def test_content_stream_chunk_of_one_event(trace):
    whole = simulate_content(trace["conv"], trace["R"], 150)
    cs = ContentStream(150)
    last = trace["turn"] == trace["M"]
    hit = [int(cs.push(trace["conv"][i : i + 1], trace["R"][i : i + 1], last[i : i + 1])[0]) for i in range(3000)]
    assert hit == whole.hit.tolist()


def test_content_state_persists_between_chunks():
    # A(4) | A(6), B(5) | A(9): the stored content survives the chunk boundary (hand-worked, N = 10)
    cs = ContentStream(10)
    assert cs.push([0], [4], [False]).tolist() == [0]
    # A(6) hits the stored 4 (total 6); B(5) makes 11 > 10 and evicts the LRU end, A
    assert cs.push([0, 1], [6, 5], [False, False]).tolist() == [1, 0]
    assert cs.push([0], [9], [True]).tolist() == [0]  # A was evicted: a miss; 5 + 9 > 10 evicts B
    r = cs.result()
    assert (r.hit_numerator, r.evictions, r.demand_blocks) == (4, 2, 24)
    # a fresh state per chunk forgets: the second chunk's A(6) would be a miss
    assert ContentStream(10).push([0, 1], [6, 5], [False, False]).tolist() == [0, 0]


def test_content_slots_are_bounded_by_live_conversations_not_by_the_stream():
    n = 200_000
    cs = ContentStream(2275)
    for c in spec_chunks(SPEC, 2, n, 50_000):
        cs.push(c.conv, c.R, c.last)
    r = cs.result()
    # ~50,000 conversations went through; live ones (λ0 · E[duration] ≈ 1.5 · 405 ≈ 600) plus resident ones
    # (≤ N / smallest content) stay in the state
    assert r.peak_state < 3000 and cs.slots <= 4096
    big = ContentStream(10**12)  # nothing is ever evicted: finished conversations stay resident, slots grow
    for c in spec_chunks(SPEC, 2, 20_000, 5_000):
        big.push(c.conv, c.R, c.last)
    assert big.result().peak_state > 4000


def test_content_released_slot_is_reused_as_a_new_conversation():
    cs = ContentStream(5)
    cs.push([7], [3], [True])  # conversation 7: one turn, resident (3 ≤ 5)
    cs.push([8], [4], [True])  # 3 + 4 > 5: conversation 7 evicted and, being over, released
    assert cs.result().peak_state == 2
    # id 7 again is a new conversation: a miss, and R = 1 below its old R = 3 is no error
    assert cs.push([7], [1], [False]).tolist() == [0]


def test_content_push_refusals():
    with pytest.raises(ContentInputError, match="N"):
        ContentStream(-1)
    cs = ContentStream(10)
    with pytest.raises(ContentInputError, match="equal lengths"):
        cs.push([0, 1], [1], [False, False])
    with pytest.raises(ContentInputError, match="last must be a boolean"):
        cs.push([0], [1], [0])
    with pytest.raises(ContentInputError, match="conv must be >= 0"):
        cs.push([-1], [1], [False])
    cs.push([3], [5], [False])
    with pytest.raises(ContentInputError, match=r"nondecreasing.*event 1 .*conv 3"):
        cs.push([4, 3], [2, 4], [False, False])  # below the previous chunk's R = 5
    with pytest.raises(ContentInputError, match="failed on an earlier chunk"):
        cs.push([5], [1], [False])


# -- the vLLM block pool -----------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(1, 3100), N=st.sampled_from([30, 400, 5000]), engine=st.sampled_from(["vllm", "vllm-0.23"]))
def test_block_stream_equals_whole_trace(trace, chunk, N, engine):
    rq = block_requests(trace, block_size=16, source="blocks")
    whole = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=N, block_size=16, engine=engine)
    bs = BlockStream(N, 16, engine)
    out = np.concatenate([bs.push(*block_request_chunk(c, 16)) for c in spec_chunks(SPEC, 11, 3000, chunk)])
    assert np.array_equal(out, np.where(whole.rejected, -1, whole.hit_blocks))
    r = bs.result()
    assert (r.evictions, r.block_ops, r.max_resident, r.rejected) == (
        whole.evictions,
        whole.block_ops,
        whole.peak_blocks_in_use,
        whole.n_rejected,
    )
    ok = ~whole.rejected
    assert r.block_accesses == int((whole.hit_blocks + whole.new_blocks)[ok].sum())
    from kvhit.sim.vllm.block import block_hit_ratio, token_hit_ratio

    assert r.h == block_hit_ratio(whole) and r.token_hit_ratio == token_hit_ratio(whole)


def test_block_state_persists_between_chunks():
    # one conversation, 3 then 5 full blocks of 4 tokens: the second request hits the 3 cached blocks
    bs = BlockStream(100, 4)
    T1, o1, h1 = block_request_chunk(_chunk([0], [1], [2], [4], [4]), 4)
    T2, o2, h2 = block_request_chunk(_chunk([0], [2], [2], [6], [2]), 4)
    assert bs.push(T1, o1, h1).tolist() == [0]
    assert bs.push(T2, o2, h2).tolist() == [3]  # T = 6·4 − 1 = 23 tokens: (23 − 1) // 4 = 5 ≥ 3 hashable
    assert BlockStream(100, 4).push(T2, o2, h2).tolist() == [0]


def test_block_stream_refusals():
    for bad in (0, -3, True, 2**31):
        with pytest.raises(BlockSimError, match="N"):
            BlockStream(bad, 16)
    with pytest.raises(BlockSimError, match="engine"):
        BlockStream(10, 16, "sglang")
    with pytest.raises(BlockSimError, match="block_size"):
        BlockStream(10, 0)
    with pytest.raises(BlockSimError, match="hashes: request 0"):
        BlockStream(10, 4).push([9], [0, 1], [5])  # 9 tokens = 2 full blocks, 1 id given


# -- chunk arguments ---------------------------------------------------------------------------------------------


def test_chunk_and_event_arguments():
    assert check_chunk_args(1e8, 1e6) == (100_000_000, 1_000_000)
    assert check_chunk_args(None, 5) == (None, 5)
    for n, c, what in [
        (10, 0, "chunk"),
        (10, -2, "chunk"),
        (10, 1.5, "chunk"),
        (10, True, "chunk"),
        (10, "7", "chunk"),
        (10, 10**9, "chunk"),
        (0, 5, "n_events"),
        (2.5, 5, "n_events"),
        (float("nan"), 5, "n_events"),
        (10**13, 5, "n_events"),
    ]:
        with pytest.raises(SpecError, match=what):
            check_chunk_args(n, c)
    with pytest.raises(SpecError, match="n_events"):
        next(spec_chunks(SPEC, 0, None, 10))
    with pytest.raises(SpecError, match="seed"):
        next(spec_chunks(SPEC, -1, 10, 10))


# -- the driver: several capacities, warm-up -----------------------------------------------------------------------


def test_simulate_stream_warmup_measures_the_tail_only(trace):
    w = 1234
    res = simulate_stream(spec_chunks(SPEC, 11, 3000, 500), [150, 2275], warmup=w)
    for r in res:
        hit = simulate_content(trace["conv"], trace["R"], r.N).hit.astype(bool)
        rp = trace.R_prev()
        assert r.hit_numerator == int(rp[w:][hit[w:]].sum()) and r.demand_blocks == int(trace["R"][w:].sum())
        assert r.n_measured == 3000 - w and r.n_events == 3000
    with pytest.raises(ValueError, match="warmup"):
        simulate_stream(spec_chunks(SPEC, 11, 100, 50), [10], warmup=100)
    blk = simulate_stream(spec_chunks(SPEC, 11, 3000, 777), [400], policy="block", block_size=16, warmup=w)[0]
    rq = block_requests(trace, block_size=16, source="blocks")
    whole = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=400, block_size=16)
    nb = -(-rq.prompt_tokens // 16)
    ok = ~whole.rejected
    ok[:w] = False
    assert blk.hit_numerator == int(whole.hit_blocks[ok].sum()) and blk.demand_blocks == int(nb[ok].sum())


# -- Parquet by row groups -----------------------------------------------------------------------------------------


def _rewrite(tr: Trace, path, row_group_size: int, mutate=None) -> None:
    import pyarrow.parquet as pq

    src = path.with_suffix(".src.parquet")
    tr.write(src)
    tbl = pq.read_table(src)
    if mutate is not None:
        tbl = mutate(tbl)
    pq.write_table(tbl, path, row_group_size=row_group_size)


@pytest.mark.parametrize("chunk", [1, 97, 1000, 5000])
def test_parquet_chunks_equal_whole_trace(trace, tmp_path, chunk):
    p = tmp_path / "t.parquet"
    _rewrite(trace, p, row_group_size=311)
    chunks = list(parquet_chunks(p, chunk))
    for name in COLS:
        assert np.array_equal(_concat(chunks, name), trace[name]), name
    r = simulate_stream(parquet_chunks(p, chunk), [150])[0]
    assert r.hit_numerator == simulate_content(trace["conv"], trace["R"], 150).reused_blocks
    head = list(parquet_chunks(p, chunk, n_events=1001))
    assert sum(len(c) for c in head) == 1001


def _set(col, i, value):
    import pyarrow as pa

    def mutate(tbl):
        a = tbl.column(col).to_numpy().copy()
        a[i] = value(a) if callable(value) else value
        return tbl.set_column(tbl.schema.get_field_index(col), col, pa.array(a))

    return mutate


@pytest.mark.parametrize(
    ("col", "row", "value", "what"),
    [
        ("R", 2500, lambda a: a[2500] + 1, "R_j must equal"),
        ("time", 2000, 1e12, "not sorted by time"),
        ("turn", 2999, 0, "must be ≥ 1"),
        ("Z", 1700, 0, "Z_j ≥ 1"),
    ],
)
def test_parquet_chunks_refuse_a_broken_trace_naming_row_and_column(trace, tmp_path, col, row, value, what):
    p = tmp_path / "bad.parquet"
    _rewrite(trace, p, 400, _set(col, row, value))
    with pytest.raises(TraceError, match=what) as e:
        for _ in parquet_chunks(p, 333):
            pass
    assert str(p) in str(e.value) and "row " in str(e.value) and "column" in str(e.value)


def test_parquet_chunks_refuse_turn_gaps_across_chunks(trace, tmp_path):
    # drop one middle turn of a conversation: the next turn (in a later chunk) has a gap
    c = trace.conversations()
    conv = int(c["conv"][np.flatnonzero(c["observed"] >= 3)[0]])
    rows = np.flatnonzero(trace["conv"] == conv)
    keep = np.ones(trace.n_turns, bool)
    keep[rows[1]] = False
    p = tmp_path / "gap.parquet"
    _rewrite(trace.select(keep), p, 100)
    with pytest.raises(TraceError, match=rf"conv {conv}.*column 'turn'|column 'R'"):
        for _ in parquet_chunks(p, 1):
            pass


def test_parquet_chunks_refuse_non_traces(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        next(parquet_chunks(tmp_path / "none.parquet", 10))
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(TraceError, match="not a readable Parquet"):
        next(parquet_chunks(tmp_path / "x.parquet", 10))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"conv": [0]}), tmp_path / "plain.parquet")
    with pytest.raises(TraceError, match="not a kvhit trace"):
        next(parquet_chunks(tmp_path / "plain.parquet", 10))


def _chunk(conv, turn, M, R, Z, start=0):
    a = lambda x: np.asarray(x, np.int64)  # noqa: E731
    n = len(conv)
    return EventChunk(a(conv), a(turn), a(M), a(R), a(Z), np.zeros(n), np.zeros(n), start=start)


# -- the service ---------------------------------------------------------------------------------------------------


def _svc(**fields):
    from kvhit.service import registry

    return registry.run("stream", {"N": [150, 2275], **fields})


def test_service_stream_on_a_spec_is_chunk_independent_and_equals_the_library():
    a = _svc(spec=Path(__file__).resolve().parents[1] / "examples" / "scm.toml", events=3000, chunk=7, seed=11)
    b = _svc(spec=Path(__file__).resolve().parents[1] / "examples" / "scm.toml", events=3000, chunk=2999, seed=11)
    keep = ("h", "h_practical", "hit_numerator", "evictions", "n_measured")
    assert [{k: r[k] for k in keep} for r in a.rows] == [{k: r[k] for k in keep} for r in b.rows]
    lib = simulate_stream(spec_chunks(SPEC, 11, 3000, 100), [150, 2275], warmup=300)
    assert [r["hit_numerator"] for r in a.rows] == [r.hit_numerator for r in lib]
    assert a.warmup == 300 and a.events == 3000 and a.peak_rss_mib > 0 and a.events_per_s > 0


def test_service_stream_on_a_trace_file_equals_the_whole_trace(trace, tmp_path):
    p = tmp_path / "t.parquet"
    tr = Trace.from_columns({c: trace[c] for c in COLS}, {"block_size": 16}, sort=False)
    tr.write(p)
    res = _svc(trace=p, chunk=333, warmup=0)
    for r in res.rows:
        assert r["hit_numerator"] == simulate_content(trace["conv"], trace["R"], r["N"]).reused_blocks
    blk = _svc(trace=p, policy="block", events=2000, warmup=0)
    rq = block_requests(tr.select(np.arange(3000) < 2000), source="blocks")
    assert blk.block_size == 16 and blk.events == 2000
    for r in blk.rows:
        w = simulate_block(rq.prompt_tokens, rq.hash_offsets, rq.hashes, N=r["N"], block_size=16)
        assert r["hit_numerator"] == int(w.hit_blocks[~w.rejected].sum())


@pytest.mark.parametrize(
    ("fields", "msg"),
    [
        ({"events": 100, "block_size": 16}, "--block-size: applies to --policy block"),
        ({"events": 100, "engine": "vllm"}, "--engine: applies to --policy block"),
        ({}, "--events: required on a spec"),
        ({"events": 100, "warmup": 100}, "--warmup: 100 warm-up events leave none"),
        ({"events": 0}, "--events"),
        ({"events": 1.5}, "--events"),
        ({"events": 100, "chunk": 0}, "--chunk"),
        ({"events": 100, "chunk": 10**8}, "--chunk"),
        ({"events": 100, "policy": "block", "N": [2**40]}, "--N: a capacity of"),
    ],
)
def test_service_stream_refusals(fields, msg):
    from kvhit.service import InputError

    spec = Path(__file__).resolve().parents[1] / "examples" / "scm.toml"
    with pytest.raises(InputError, match=msg.replace("(", r"\(")):
        _svc(spec=spec, **fields)


def test_service_stream_refusals_on_a_trace(trace, tmp_path):
    from kvhit.service import InputError

    p = tmp_path / "t.parquet"
    Trace.from_columns({c: trace[c] for c in COLS}, sort=False).write(p)
    with pytest.raises(InputError, match="--events: 5,000 events asked, the trace has 3,000 rows"):
        _svc(trace=p, events=5000)
    with pytest.raises(InputError, match="--seed"):
        _svc(trace=p, seed=3)
    with pytest.raises(InputError, match="--trace and --spec"):
        _svc(trace=p, spec=Path("examples/scm.toml"))
    with pytest.raises(InputError, match="--lam0: applies to a spec"):
        _svc(trace=p, lam0=2.0)
    with pytest.raises(InputError, match="no such file"):
        _svc(trace=tmp_path / "none.parquet")
