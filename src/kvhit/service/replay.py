"""``replay``: send a trace to a running vLLM or SGLang server, record every request's prefix-cache hit, and (``check``)
compare it with kvhit's simulation of exactly the recorded sequence and with the engine-aware estimator.

Invariant: what is compared is what was sent — the prompts as built at send time (chat history with the
server's own outputs), the outputs as returned — and the server's configuration is read from the server
(``vllm:cache_config_info``), never assumed silently: an assumed ``--block-size`` that differs from the
server's is refused; an assumed ``--num-gpu-blocks`` is used for the simulation and reported (a negative
control). A replay that cannot start is refused in one line (exit 2); one that fails midway keeps its log,
marked partial, and says why in one line. A concurrent replay is simulated with kvhit's model of vLLM's
scheduler (``concurrent_model="scheduler"``, the default: chunked prefill, decode blocks step by step,
preemption; arrivals at the measured send times, steps paced by the measured finish times) and with holds from
the measured times (``"holds"``: from send to finish, or — with ``server_log`` and the server's per-request
timings — from each request's first schedule to its last token on the server's clock, the client's holds then
reported beside them as ``"holds_client_clock"``); all are reported, per request and in aggregate, and none
gates the exit status — only a sequential replay is exact by construction (:mod:`kvhit.replay.check`).

SGLang servers (``engine="sglang"``, or detected by ``auto``): the configuration is read from ``/server_info``
(page size, ``max_total_num_tokens``, radix eviction policy and its config); the check runs kvhit's SGLang model
(:func:`kvhit.replay.check.simulate_recorded_sglang`). Refused in one line before anything is sent: a server that
does not report ``cached_tokens`` (no ``--enable-cache-report``); with ``check``, a server whose radix cache is
off, whose policy kvhit does not model, that runs a cache feature kvhit does not model here (HiCache,
speculative decoding, LMCache, disaggregation, streaming sessions), or that reports no page size / pool size
(``--pool-tokens`` gives the latter); an assumed ``--block-size`` (page size) that differs from the server's.
``--pool-tokens`` and ``--evict-policy`` simulate another pool or policy than the server's (negative controls,
reported). Concurrent SGLang replays are simulated with holds only (no model of SGLang's scheduler).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from kvhit.service.base import Request, Response
from kvhit.service.errors import InputError, translating
from kvhit.service.io import atomic_write, check_output_file

__all__ = ["ReplayRequest", "ReplayResponse", "replay"]


class ReplayRequest(Request):
    """The inputs of ``kvhit replay``, validated: each field's description states its unit, range and default."""

    endpoint: str = Field(description="Base URL of the server, e.g. http://127.0.0.1:8000; required.")
    model: str | None = Field(None, description="Served model name; default: the server's only model.")
    trace: Path | None = Field(None, description="kvhit Parquet trace (`kvhit trace generate/sharegpt`).")
    blocks_trace: Path | None = Field(
        None, description="Production block-id trace: Mooncake .jsonl, or WEKA .json file/directory."
    )
    tokens_per_block: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Tokens per trace block (block-count and block-id traces); 1–65,536; "
        "default: the trace's block size.",
    )
    output_tokens: int = Field(
        16, ge=1, le=65536, description="Output tokens per request when the trace has none; 1–65,536; default 16."
    )
    max_output: int | None = Field(
        None, ge=1, le=65536, description="Cap on the trace's output lengths; 1–65,536; default: none."
    )
    system_prompt_tokens: int = Field(
        0,
        ge=0,
        le=65536,
        description="Shared system prompt tokens opening every conversation (chat traces); 0–65,536; default 0.",
    )
    concurrency: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Closed loop with at most K requests in flight; 1–4,096; default 1 (sequential).",
    )
    speedup: float | None = Field(
        None,
        gt=0,
        le=1e6,
        description="Send at the trace's arrival times divided by S (instead of --concurrency); > 0; default: none.",
    )
    max_in_flight: int = Field(
        64, ge=1, le=4096, description="With --speedup: requests in flight at most; 1–4,096; default 64."
    )
    limit: int | None = Field(None, ge=1, description="Replay only the first n requests; ≥ 1; default: all.")
    warmup: int = Field(
        0, ge=0, description="Conversations (in arrival order) left out of the aggregate ratios; ≥ 0; default 0."
    )
    exclude_drain: bool = Field(
        False,
        description="Leave out of the aggregates the requests after the last conversation's arrival (trace time): "
        "the population drains there, a lighter load than the trace's rate; default: kept.",
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed of the token ids; integer ≥ 0; default 0.")
    log: Path | None = Field(None, description="Parquet log of every request (kept, marked partial, on failure).")
    check: bool = Field(False, description="Compare with kvhit's simulation and estimator (exit 1 on mismatch).")
    reset: bool = Field(
        True,
        description="Empty the prefix cache first: POST /reset_prefix_cache (vLLM with VLLM_SERVER_DEV_MODE=1) or "
        "/flush_cache (SGLang).",
    )
    block_size: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="Block size kvhit assumes; 1–65,536; refused if the server's differs; default: the server's.",
    )
    num_gpu_blocks: int | None = Field(
        None, ge=2, description="Block count kvhit simulates (incl. the null block); ≥ 2; default: the server's."
    )
    output_cached: Literal["m-1", "m", "0"] = Field(
        "m-1", description="Generated tokens whose KV the simulation keeps: m-1 (vLLM) | m | 0 (controls)."
    )
    concurrent_model: Literal["scheduler", "holds"] = Field(
        "scheduler",
        description="Concurrent replays: the model whose hits are the simulated column: scheduler (vLLM's "
        "scheduler, steps paced by the measured finish times) | holds (blocks held from send to finish; with "
        "--server-log, from first schedule to last token on the server's clock); both are reported.",
    )
    max_num_batched_tokens: int = Field(
        2048,
        ge=1,
        le=1 << 24,
        description="The server's token budget per step (vLLM --max-num-batched-tokens), for the scheduler model; "
        "default 2048 (vLLM's OpenAI-server default on CPU; 8192 on H100/H200).",
    )
    max_num_seqs: int = Field(
        128,
        ge=1,
        le=1 << 20,
        description="The server's --max-num-seqs, for the scheduler model; default 128 (vLLM's OpenAI-server default "
        "on CPU; 1024 on H100/H200).",
    )
    timeout_s: float = Field(600.0, gt=0, le=86400, description="Seconds to wait for one response; > 0; default 600.")
    retries: int = Field(
        3, ge=0, le=100, description="Retries of a connection that cannot be opened; 0–100; default 3."
    )

    engine: Literal["auto", "vllm", "sglang"] = Field(
        "auto",
        description="The server's engine: auto (vllm: metrics on /metrics → vLLM; SGLang's /server_info → SGLang) | "
        "vllm | sglang; default auto.",
    )
    pool_tokens: int | None = Field(
        None,
        ge=1,
        le=1 << 40,
        description="SGLang: KV pool size kvhit simulates, in tokens; ≥ 1; default: the server's "
        "max_total_num_tokens (another value is a negative control, reported).",
    )
    evict_policy: str | None = Field(
        None,
        description="SGLang: radix eviction policy kvhit simulates (lru, fifo, mru, filo, lfu, slru, priority, tlru); "
        "default: the server's --radix-eviction-policy (another one is a negative control, reported).",
    )
    sglang_cache: Literal["unified", "radix"] = Field(
        "unified",
        description="SGLang: the cache class kvhit models: unified (UnifiedRadixCache, what SGLang 0.5.23 builds for a "
        "full-attention model) | radix (RadixCache); default unified.",
    )

    server_log: Path | None = Field(
        None,
        description="vLLM: the server's log (started with --enable-log-requests and a logging config that stamps "
        "lines with their Unix time, live/vllm_logging.json): a concurrent check's scheduler model then takes "
        "each request's arrival from the server's 'Added request' line (the engine's clock) instead of the "
        "client's send time, and holds run from each request's first schedule to its last token on that clock; "
        "default: none (the client's clock).",
    )

    kv_events: Path | None = Field(
        None,
        description="vLLM, with --server-log: the server's KV-cache events as JSON lines (live/kv_events.py record "
        "… EVENTS.jsonl while the replay runs; the server started with --kv-events-config): the scheduler model's "
        "steps that store a block only their request can compute end at the times the engine published for them "
        "(the step clock, reported as scheduler_step_clock beside the server's clock); default: none.",
    )

    FLAGS = {
        "log": "--log",
        "trace": "--trace",
        "blocks_trace": "--blocks-trace",
        "server_log": "--server-log",
        "kv_events": "--kv-events",
    }


class ReplayResponse(Response):
    """What ``kvhit replay`` measured on the server (counter deltas, per-request log) and, with ``--check``, kvhit's
    simulation of the recorded sequence beside it."""

    endpoint: str
    model: str
    mode: str = Field(description="sequential | closed-loop K | timed (speedup S)")
    source: str
    requests: int
    completed: int
    partial: bool
    error: str | None = None
    wall_s: float
    server: dict[str, Any]
    counters: dict[str, Any] = Field(description="Prefix-cache counter deltas over the replay (tokens).")
    measured: dict[str, Any]
    check: dict[str, Any] | None = None
    log: str | None = None
    notes: list[str] = Field(default_factory=list)


def _load_plan(req: ReplayRequest):
    from kvhit.replay.tokens import plan_from_production, plan_from_trace
    from kvhit.service.inputs import read_blocks_trace, read_trace

    if (req.trace is None) == (req.blocks_trace is None):
        raise InputError("--trace or --blocks-trace: give one workload source")
    if req.trace is not None:
        tr = read_trace(req.trace)
        b = req.tokens_per_block or tr.block_size
        if b is None and not ("cum_tokens" in tr.cols and "response_tokens" in tr.cols):
            raise InputError(f"--tokens-per-block: required, the trace {req.trace} has block counts and no block size")
        with translating(f"--trace {req.trace}"):
            plan = plan_from_trace(
                tr,
                tokens_per_block=int(b or 1),
                output_tokens=req.output_tokens,
                max_output=req.max_output,
                system_prompt_tokens=req.system_prompt_tokens,
                seed=req.seed,
            )
    else:
        if req.system_prompt_tokens:
            raise InputError("--system-prompt-tokens: applies to chat traces (--trace), not to --blocks-trace")
        pt = read_blocks_trace(req.blocks_trace, "sequential", None, None, req.seed)
        with translating(f"--blocks-trace {req.blocks_trace}"):
            plan = plan_from_production(
                pt,
                tokens_per_block=req.tokens_per_block,
                output_tokens=req.output_tokens,
                max_output=req.max_output,
                seed=req.seed,
            )
    if req.limit is not None:
        plan = plan.head(req.limit)
    return plan


def _notes(req: ReplayRequest, plan) -> list[str]:
    notes = list(plan.notes)
    k = plan.capped()
    if k:
        notes.append(f"{k:,} of {plan.n:,} output lengths capped at --max-output {req.max_output} tokens")
    return notes


def _write_log(path: Path, plan, run, sim, meta: dict, sims: dict | None = None, anchors=None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = plan.n
    plen = np.array([-1 if p is None else p.shape[0] for p in run.prompts], np.int64)
    cols = {
        "request": pa.array(np.arange(n, dtype=np.int64)),
        "conversation": pa.array(plan.conv),
        "turn": pa.array(plan.turn),
        "trace_time": pa.array(plan.time),
        "prompt_tokens": pa.array(plen),
        "max_tokens": pa.array(plan.max_tokens),
        "completion_tokens": pa.array(run.completion_tokens),
        "cached_tokens": pa.array(run.cached_tokens),
        "simulated_hit_tokens": pa.array(sim if sim is not None else np.full(n, -1, np.int64)),
        "t_send": pa.array(run.t_send),
        "t_done": pa.array(run.t_done),
        "status": pa.array(run.status),
        # the ids as sent and returned: a log is enough to re-run any check offline (kvhit.replay.check)
        "prompt_ids": pa.array([None if p is None else p.tolist() for p in run.prompts], pa.list_(pa.int64())),
        "output_ids": pa.array([None if o is None else o.tolist() for o in run.outputs], pa.list_(pa.int64())),
        "prev_request": pa.array(np.asarray(plan.prev, np.int64)),
        # the server's own timings (vLLM --enable-per-request-metrics; NaN when it does not return them)
        "server_queue_ms": pa.array(run.queue_ms),
        "server_ttft_ms": pa.array(run.ttft_ms),
        "server_generation_ms": pa.array(run.gen_ms),
        # the response ids (vLLM: cmpl-<X-Request-Id>) and, with --server-log, the Unix time of each request's
        # "Added request" line (NaN: none): live/recheck.py re-runs the anchored check from these
        "response_id": pa.array(run.response_id or [None] * n, pa.string()),
        "server_added_unix": pa.array(anchors if anchors is not None else np.full(n, np.nan)),
    }
    for name, v in (sims or {}).items():
        cols[name] = pa.array(v)
    table = pa.table(cols).replace_schema_metadata({b"kvhit_replay": json.dumps(meta).encode()})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


def _stationarity(plan, window: np.ndarray) -> dict[str, Any]:
    """Whether the measured window saw the conversation population at a steady level
    (:func:`kvhit.workload.stationarity.check_window` on the trace times: the reference level is the median
    active count over the measured requests, the warm-up must last one mean conversation)."""
    from kvhit.workload.stationarity import check_window

    st = check_window(plan.time, plan.conv, window)
    keep = ("stationary", "message", "in_band_share", "reference_active", "warmup_s", "mean_duration_s", "window")
    d = st.to_dict()
    return {k: d[k] for k in keep}


def replay(req: ReplayRequest, progress=None) -> ReplayResponse:
    """Replay, record and (``check``) compare; see the module docstring."""
    from kvhit.replay import check as ck
    from kvhit.replay.client import ReplayError, run_plan

    if req.speedup is not None and req.concurrency is not None:
        raise InputError("--speedup and --concurrency: give one timing (trace arrival times, or a closed loop)")
    log = check_output_file(req.log, "--log")
    if req.server_log is not None and not req.server_log.is_file():
        raise InputError(f"--server-log {req.server_log}: no such file")
    if req.kv_events is not None:
        if req.server_log is None:
            raise InputError("--kv-events: needs --server-log (the step clock runs on the server's clock)")
        if not req.kv_events.is_file():
            raise InputError(f"--kv-events {req.kv_events}: no such file")
    plan = _load_plan(req)
    notes = _notes(req, plan)
    sequential = req.speedup is None and (req.concurrency or 1) == 1
    mode = (
        "sequential"
        if sequential
        else f"closed loop, {req.concurrency} in flight"
        if req.speedup is None
        else f"trace timing, speedup {req.speedup:g}"
    )
    need = plan.prompt_bound() + plan.max_tokens
    src = f"--trace {req.trace}" if req.trace is not None else f"--blocks-trace {req.blocks_trace}"

    def on_probe(info, model):
        if info.max_model_len is not None and (need > info.max_model_len).any():
            r = int(np.argmax(need > info.max_model_len))
            raise ReplayError(
                f"{src}: request {r} (conversation {int(plan.conv[r])}, turn {int(plan.turn[r])}) needs "
                f"{int(need[r]):,} tokens (prompt + output), more than the server's max_model_len "
                f"{info.max_model_len:,} (replay fewer requests with --limit, or shorter ones)"
            )
        if info.engine == "sglang":
            _check_sglang_server(req, info)
            return
        for name in ("pool_tokens", "evict_policy"):
            if getattr(req, name) is not None:
                raise ReplayError(f"{req.flag(name)}: applies to SGLang servers; {req.endpoint} is a vLLM server")
        if req.block_size is not None and info.block_size is not None and info.block_size != req.block_size:
            raise ReplayError(
                f"--block-size {req.block_size}: the server at {req.endpoint} uses blocks of {info.block_size} tokens"
            )
        if req.check and info.block_size is None:
            raise ReplayError(f"--check: the server at {req.endpoint} reports no block_size in vllm:cache_config_info")
        if req.check and info.prefix_caching is False:
            notes.append("the server reports enable_prefix_caching=False: it will hit nothing")

    try:
        info, run = run_plan(
            plan,
            req.endpoint,
            req.model,
            concurrency=req.concurrency or (1 if req.speedup is None else None),
            speedup=req.speedup,
            max_in_flight=req.max_in_flight,
            retries=req.retries,
            timeout_s=req.timeout_s,
            reset=req.reset,
            progress=progress,
            on_probe=on_probe,
            engine=req.engine,
        )
    except ReplayError as e:
        raise InputError(str(e)) from None
    if not req.reset:
        notes.append("the prefix cache was not reset first: the check assumes it was empty")
    anchors = None
    anchor_error = None
    if req.server_log is not None:
        from kvhit.replay.serverlog import ServerLogError, anchor_times

        if info.engine != "vllm" or sequential:
            notes.append("--server-log: used by the scheduler model of a concurrent vLLM replay only; ignored here")
        else:
            ids = [run.response_id[r] if s == "ok" else None for r, s in enumerate(run.status)]
            try:
                anchors = anchor_times(req.server_log, ids)
            except ServerLogError as e:
                anchor_error = str(e)
    ok = np.array([s == "ok" for s in run.status], bool)
    plen = np.array([0 if p is None else p.shape[0] for p in run.prompts], np.int64)
    # conversations in arrival order; the first `warmup` are left out of the aggregates
    first = {}
    for c in plan.conv.tolist():
        first.setdefault(c, len(first))
    rank = np.array([first[c] for c in plan.conv.tolist()], np.int64)
    window = ok & (rank >= req.warmup)
    if req.exclude_drain and plan.n:
        # the last conversation's first turn: after it no conversation arrives and the active population drains
        t_first = {}
        for c, t in zip(plan.conv.tolist(), plan.time.tolist(), strict=True):
            t_first[c] = min(t, t_first.get(c, t))
        window &= plan.time <= max(t_first.values())
    steady = _stationarity(plan, window)
    dq = dh = None
    if run.counters_before is not None and run.counters_after is not None:
        dq = run.counters_after[0] - run.counters_before[0]
        dh = run.counters_after[1] - run.counters_before[1]
    if not info.counters:
        notes.append(
            "the SGLang server exports no sglang:prompt_tokens_total / sglang:cached_tokens_total (start it with "
            "--enable-metrics): only the per-request cached_tokens are compared"
        )
    counters = {
        "queries": dq,
        "hits": dh,
        "ratio": (dh / dq) if dq else None,
        "sum_prompt_tokens": int(plen[ok].sum()),
        "sum_cached_tokens": int(run.cached_tokens[ok].sum()),
    }
    pb, pa_ = run.preemptions_before, run.preemptions_after
    counters["preemptions"] = None if pb is None or pa_ is None else int(pa_ - pb)
    counters["equal_to_per_request_sums"] = (
        dq is not None and int(dq) == counters["sum_prompt_tokens"] and int(dh) == counters["sum_cached_tokens"]
    )
    meas_T = int(plen[window].sum())
    measured = {
        "requests": int(window.sum()),
        "prompt_tokens": meas_T,
        "cached_tokens": int(run.cached_tokens[window].sum()),
        "token_hit_ratio": float(run.cached_tokens[window].sum() / meas_T) if meas_T else None,
        "stationarity": steady,
    }
    sim = None
    check = None
    sims_log = None
    if req.check and ok.any() and info.engine == "sglang":
        sim, check = _check_sglang(req, info, plan, run, ok, plen, window, sequential, steady, notes)
    elif req.check and ok.any():
        b = int(info.block_size)
        G = int(req.num_gpu_blocks or info.num_gpu_blocks)
        if req.num_gpu_blocks is not None and req.num_gpu_blocks != info.num_gpu_blocks:
            notes.append(f"simulated at --num-gpu-blocks {req.num_gpu_blocks}; the server has {info.num_gpu_blocks}")
        idx = np.flatnonzero(ok)
        prompts = [run.prompts[r] for r in idx]
        outputs = [run.outputs[r] for r in idx]
        concurrent = None
        if sequential:
            sim_ok = ck.simulate_recorded(
                prompts, outputs, block_size=b, num_gpu_blocks=G, output_cached=req.output_cached
            )
        else:
            hkw = dict(block_size=b, num_gpu_blocks=G, output_cached=req.output_cached)
            holds = ck.simulate_recorded(prompts, outputs, t_send=run.t_send[idx], t_done=run.t_done[idx], **hkw)
            holds_client = None
            span = ck.server_clock_holds(
                None if anchors is None else anchors[idx], (run.queue_ms[idx], run.ttft_ms[idx], run.gen_ms[idx])
            )
            if span is not None:  # holds on the server's clock; the client's clock beside it
                holds_client = holds
                holds = ck.simulate_recorded(prompts, outputs, t_send=span[0], t_done=span[1], **hkw)
            pos = np.full(plan.n, -1, np.int64)
            pos[idx] = np.arange(idx.size)
            pv = np.asarray(plan.prev, np.int64)[idx]
            prev_ok = np.where(pv >= 0, pos[np.maximum(pv, 0)], -1)
            skw = dict(
                block_size=b,
                num_gpu_blocks=G,
                t_send=run.t_send[idx],
                t_done=run.t_done[idx],
                prev=prev_ok,
                server_ms=(run.queue_ms[idx], run.ttft_ms[idx], run.gen_ms[idx]),
                max_num_batched_tokens=req.max_num_batched_tokens,
                max_num_seqs=req.max_num_seqs,
            )
            sched, info_s = ck.simulate_recorded_scheduler(
                prompts, outputs, server_added=None if anchors is None else anchors[idx], **skw
            )
            if anchors is not None and info_s["clock"] != "anchored (server log)":
                notes.append(
                    "--server-log: the server returned no per-request timings (start it with "
                    "--enable-per-request-metrics): the scheduler model uses the client's clock"
                )
            client_clock = None
            step_clock = None
            if info_s["clock"] == "anchored (server log)":  # the client's clock beside it, for comparison
                client_clock, _ = ck.simulate_recorded_scheduler(prompts, outputs, **skw)
                if req.kv_events is not None:
                    from kvhit.replay.kvevents import KvEventsError, read_kv_events

                    try:
                        batches = read_kv_events(req.kv_events, b)
                        step_clock, info_k = ck.simulate_recorded_scheduler(
                            prompts, outputs, server_added=anchors[idx], kv_events=batches, **skw
                        )
                    except KvEventsError as e:
                        anchor_error = str(e)
            use = req.concurrent_model
            if use == "scheduler" and req.output_cached != "m-1":
                use = "holds"
                notes.append(f"--output-cached {req.output_cached}: a control of the holds model; simulated with holds")
            sim_ok = sched if use == "scheduler" else holds
            lat = run.t_done[idx] - run.t_send[idx]
            concurrent = {"model": use}
            models = [("scheduler", sched), ("holds", holds)]
            if client_clock is not None:
                models.append(("scheduler_client_clock", client_clock))
            if holds_client is not None:
                models.append(("holds_client_clock", holds_client))
            if step_clock is not None:
                models.append(("scheduler_step_clock", step_clock))
            for name, h in models:
                rr = ck.compare(run.cached_tokens[idx], h, plen[idx], mask=window[idx])
                ra = ck.compare(run.cached_tokens[idx], h, plen[idx])
                concurrent[name] = {
                    "mismatching_requests": ra.mismatches,
                    "requests_compared": ra.n,
                    "simulated_token_hit_ratio": rr.simulated_ratio,
                    "simulated_minus_measured": rr.simulated_ratio - rr.measured_ratio,
                }
            sl = info_s.pop("simulated_latency")
            info_s.pop("preemptions_per_request")
            info_s.pop("store_times", None)
            info_s["latency_mean_abs_error_s"] = float(np.nanmean(np.abs(sl - lat)))
            info_s["measured_latency_mean_s"] = float(np.mean(lat))
            concurrent["scheduler"].update(info_s)
            if step_clock is not None:
                concurrent["scheduler_step_clock"].update(
                    preemptions=info_k["preemptions"],
                    **{k: v if isinstance(v, dict) else int(v) for k, v in info_k["step_clock"].items()},
                )
            sims_log = {"simulated_hit_tokens_holds": np.full(plan.n, -1, np.int64)}
            sims_log["simulated_hit_tokens_holds"][idx] = holds
            sims_log["simulated_hit_tokens_scheduler"] = np.full(plan.n, -1, np.int64)
            sims_log["simulated_hit_tokens_scheduler"][idx] = sched
            if holds_client is not None:
                sims_log["simulated_hit_tokens_holds_client_clock"] = np.full(plan.n, -1, np.int64)
                sims_log["simulated_hit_tokens_holds_client_clock"][idx] = holds_client
            if step_clock is not None:
                sims_log["simulated_hit_tokens_scheduler_step_clock"] = np.full(plan.n, -1, np.int64)
                sims_log["simulated_hit_tokens_scheduler_step_clock"][idx] = step_clock
            concurrent["holds"]["clock"] = (
                "server (first schedule to last token)" if holds_client is not None else "client (send to finish)"
            )
        sim = np.full(plan.n, -1, np.int64)
        sim[idx] = sim_ok
        res = ck.compare(run.cached_tokens[idx], sim_ok, plen[idx], mask=window[idx])
        allres = ck.compare(run.cached_tokens[idx], sim_ok, plen[idx])
        tr = ck.recorded_trace(plan.conv[idx], plan.turn[idx], plan.time[idx], plen[idx], run.completion_tokens[idx], b)
        est = None
        try:
            est = ck.estimate_recorded(tr, G - 1, b, rows=window[idx])
        except ValueError as e:
            notes.append(f"estimator not evaluated: {e}")
        if est is not None and not steady["stationary"]:
            notes.append(
                "the engine-aware estimator is a steady-state model and the measured window is not stationary "
                f"({steady['message']}): its number is not a prediction for this window "
                "(--warmup K and --exclude-drain measure the steady part of a long enough trace)"
            )
        first_mm = _first_mismatch(allres.first_mismatch, idx, plan, plen, run, sim)
        check = {
            "engine": "vllm",
            "block_size": b,
            "num_gpu_blocks": G,
            "usable_blocks": G - 1,
            "output_cached": req.output_cached,
            **_comparison(sequential, allres, res, est, first_mm, bool(steady["stationary"])),
            "concurrent": concurrent,
        }
    resp = ReplayResponse(
        endpoint=req.endpoint,
        model=run.model,
        mode=mode,
        source=plan.source,
        requests=plan.n,
        completed=run.n_ok,
        partial=run.partial,
        error=run.error,
        wall_s=run.wall_s,
        server={
            "engine": info.engine,
            "block_size": info.block_size,
            "num_gpu_blocks": info.num_gpu_blocks,
            "max_model_len": info.max_model_len,
            "enable_prefix_caching": info.prefix_caching,
            "pool_tokens": info.pool_tokens,
            "radix_eviction_policy": info.evict_policy,
        },
        counters=counters,
        measured=measured,
        check=check,
        log=str(log) if log is not None else None,
        notes=notes,
    )
    if log is not None:
        meta = resp.to_jsonable()
        meta["created_unix"] = time.time()
        # the Unix time of t_send = 0 and the X-Request-Id prefix (request r: f"{prefix}-{r}")
        meta["t0_unix"] = run.t0_unix if np.isfinite(run.t0_unix) else None
        meta["request_id_prefix"] = run.request_id_prefix
        _write_log(log, plan, run, sim, meta, sims_log, anchors)
    if anchor_error is not None:
        raise InputError(anchor_error + (f" (the replay's log is kept: {log})" if log is not None else ""))
    return resp


def _sglang_budget(info) -> int:
    """T-LRU's tail budget ``max(threshold − next_prompt_estimate, 0)`` from ``--radix-eviction-policy-config``."""
    cfg = info.policy_config or {}
    try:
        return max(int(cfg.get("threshold", 0)) - int(cfg.get("next_prompt_estimate", 0)), 0)
    except (TypeError, ValueError):
        return 0


def _check_sglang_server(req: ReplayRequest, info) -> None:
    """One-line refusals for an SGLang server, before anything is sent (see the module docstring)."""
    from kvhit.replay.client import ReplayError
    from kvhit.service.engines import SGLANG_POLICIES

    ep = req.endpoint
    if req.num_gpu_blocks is not None:
        raise ReplayError(f"--num-gpu-blocks: a vLLM flag; SGLang's pool is in tokens ({ep}): give --pool-tokens")
    if req.output_cached != "m-1":
        raise ReplayError(f"--output-cached {req.output_cached}: a vLLM control; SGLang caches T + m − 1 tokens")
    if info.cache_report is False:
        raise ReplayError(
            f"--endpoint {ep}: the SGLang server does not report cached_tokens (start it with --enable-cache-report)"
        )
    if req.block_size is not None and info.block_size is not None and info.block_size != req.block_size:
        raise ReplayError(
            f"--block-size {req.block_size}: the SGLang server at {ep} uses pages of {info.block_size} tokens"
        )
    if req.evict_policy is not None and req.evict_policy not in SGLANG_POLICIES:
        raise ReplayError(
            f"--evict-policy {req.evict_policy}: not an SGLang 0.5.23 policy ({', '.join(SGLANG_POLICIES)})"
        )
    if not req.check:
        return
    if info.prefix_caching is False:
        raise ReplayError(
            f"--check: the SGLang server at {ep} runs with --disable-radix-cache: it caches nothing, there is no "
            "prefix cache to check"
        )
    if info.unmodelled:
        k, v = next(iter(info.unmodelled.items()))
        raise ReplayError(
            f"--check: the SGLang server at {ep} runs with {k}={v}, which kvhit's SGLang model does not cover here"
        )
    if req.evict_policy is None and info.evict_policy not in SGLANG_POLICIES:
        raise ReplayError(
            f"--check: the SGLang server at {ep} evicts with radix_eviction_policy={info.evict_policy!r}, which kvhit "
            f"does not model ({', '.join(SGLANG_POLICIES)}); --evict-policy simulates another"
        )
    pol = req.evict_policy or info.evict_policy
    if pol == "tlru" and req.sglang_cache != "unified":
        raise ReplayError("--sglang-cache radix: SGLang 0.5.23 offers T-LRU on UnifiedRadixCache only")
    if info.block_size is None:
        raise ReplayError(f"--check: the SGLang server at {ep} reports no page_size in /server_info")
    if req.pool_tokens is None and info.pool_tokens is None:
        raise ReplayError(
            f"--pool-tokens: the SGLang server at {ep} reports no max_total_num_tokens; give its KV pool in tokens"
        )
    pool = req.pool_tokens or info.pool_tokens
    if pool < info.block_size:
        raise ReplayError(f"--pool-tokens {pool}: less than one page of {info.block_size} tokens")


def _check_sglang(req, info, plan, run, ok, plen, window, sequential, steady, notes):
    """The recorded sequence through kvhit's SGLang model; returns (per-request simulated hits, check dict)."""
    from kvhit.replay import check as ck

    p = int(info.block_size)
    pool = int(req.pool_tokens or info.pool_tokens)
    if req.pool_tokens is not None and req.pool_tokens != info.pool_tokens:
        notes.append(f"simulated at --pool-tokens {req.pool_tokens:,}; the server's pool is {info.pool_tokens} tokens")
    pol = req.evict_policy or info.evict_policy
    if req.evict_policy is not None and req.evict_policy != info.evict_policy:
        notes.append(f"simulated with --evict-policy {req.evict_policy}; the server evicts with {info.evict_policy}")
    budget = _sglang_budget(info) if pol == "tlru" else 0
    idx = np.flatnonzero(ok)
    prompts = [run.prompts[r] for r in idx]
    outputs = [run.outputs[r] for r in idx]
    kw = dict(page_size=p, pool_tokens=pool, evict_policy=pol, cache=req.sglang_cache, tlru_tail_budget=budget)
    concurrent = None
    if sequential:
        sim_ok = ck.simulate_recorded_sglang(prompts, outputs, **kw)
    else:
        sim_ok = ck.simulate_recorded_sglang(prompts, outputs, t_send=run.t_send[idx], t_done=run.t_done[idx], **kw)
        rr = ck.compare(run.cached_tokens[idx], sim_ok, plen[idx], mask=window[idx])
        ra = ck.compare(run.cached_tokens[idx], sim_ok, plen[idx])
        concurrent = {
            "model": "holds",
            "holds": {
                "mismatching_requests": ra.mismatches,
                "requests_compared": ra.n,
                "simulated_token_hit_ratio": rr.simulated_ratio,
                "simulated_minus_measured": rr.simulated_ratio - rr.measured_ratio,
            },
        }
        notes.append(
            "a concurrent SGLang replay is simulated with holds from the measured times (kvhit has no model of "
            "SGLang's scheduler: batching, the new_token_ratio reservation and retraction are not modelled)"
        )
    sim = np.full(plan.n, -1, np.int64)
    sim[idx] = sim_ok
    res = ck.compare(run.cached_tokens[idx], sim_ok, plen[idx], mask=window[idx])
    allres = ck.compare(run.cached_tokens[idx], sim_ok, plen[idx])
    est = None
    applies = bool(steady["stationary"]) and pol == "lru"
    if pol != "lru":
        notes.append(f"estimator not evaluated: SGLang's estimator models LRU eviction, the policy is {pol}")
    else:
        tr = ck.recorded_trace(plan.conv[idx], plan.turn[idx], plan.time[idx], plen[idx], run.completion_tokens[idx], p)
        try:
            est = ck.estimate_recorded_sglang(tr, pool, p, rows=window[idx])
        except ValueError as e:
            notes.append(f"estimator not evaluated: {e}")
        if est is not None and not steady["stationary"]:
            notes.append(
                "the SGLang estimator is a steady-state model and the measured window is not stationary "
                f"({steady['message']}): its number is not a prediction for this window (not applicable)"
            )
    applies = applies and est is not None
    first_mm = _first_mismatch(allres.first_mismatch, idx, plan, plen, run, sim)
    check = {
        "engine": "sglang",
        "block_size": p,
        "page_size": p,
        "num_gpu_blocks": None,
        "usable_blocks": None,
        "pool_tokens": pool,
        "evict_policy": pol,
        "sglang_cache": req.sglang_cache,
        "tlru_tail_budget": budget,
        "output_cached": "m-1",
        **_comparison(sequential, allres, res, est, first_mm, applies),
        "concurrent": concurrent,
    }
    return sim, check


def _first_mismatch(fm, idx, plan, plen, run, sim) -> dict | None:
    """The first request (in the compared order ``idx``) whose simulated hit differs from the measured one."""
    if fm is None:
        return None
    r = int(idx[fm])
    return {
        "request": r,
        "conversation": int(plan.conv[r]),
        "turn": int(plan.turn[r]),
        "prompt_tokens": int(plen[r]),
        "completion_tokens": int(run.completion_tokens[r]),
        "measured_cached_tokens": int(run.cached_tokens[r]),
        "simulated_hit_tokens": int(sim[r]),
    }


def _comparison(sequential, allres, res, est, first_mm, applies) -> dict:
    """The fields every engine's check reports: per-request comparison, aggregates, estimator, verdict."""
    return {
        "per_request": sequential,
        "requests_compared": allres.n,
        "mismatching_requests": allres.mismatches,
        "first_mismatch": first_mm,
        "simulated_rejected": allres.rejected,
        "measured_token_hit_ratio": res.measured_ratio,
        "simulated_token_hit_ratio": res.simulated_ratio,
        "estimated_token_hit_ratio": est,
        "simulated_minus_measured": res.simulated_ratio - res.measured_ratio,
        "estimated_minus_measured": None if est is None else est - res.measured_ratio,
        "estimator_applies": applies,
        "simulated_hit_tokens_all": allres.simulated_hit_tokens,
        "measured_hit_tokens_all": allres.measured_hit_tokens,
        "passed": (allres.mismatches == 0) if sequential else None,
    }
