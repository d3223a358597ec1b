"""``kvhit replay``: a trace against a running vLLM or SGLang server, checked request by request against kvhit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from kvhit.cli._common import _call, _fmt, _opt, _print_json, _table, app, console, err_console, svc

RR = svc.ReplayRequest


@app.command()
def replay(
    endpoint: Annotated[str, _opt(RR, "endpoint", "--endpoint")],
    trace: Annotated[Path | None, _opt(RR, "trace", "--trace")] = None,
    blocks_trace: Annotated[Path | None, _opt(RR, "blocks_trace", "--blocks-trace")] = None,
    model: Annotated[str | None, _opt(RR, "model", "--model")] = None,
    check: Annotated[bool, _opt(RR, "check", "--check")] = False,
    log: Annotated[Path | None, _opt(RR, "log", "--log", "-o")] = None,
    concurrency: Annotated[int | None, _opt(RR, "concurrency", "--concurrency")] = None,
    speedup: Annotated[float | None, _opt(RR, "speedup", "--speedup")] = None,
    max_in_flight: Annotated[int, _opt(RR, "max_in_flight", "--max-in-flight")] = 64,
    tokens_per_block: Annotated[int | None, _opt(RR, "tokens_per_block", "--tokens-per-block")] = None,
    output_tokens: Annotated[int, _opt(RR, "output_tokens", "--output-tokens")] = 16,
    max_output: Annotated[int | None, _opt(RR, "max_output", "--max-output")] = None,
    system_prompt_tokens: Annotated[int, _opt(RR, "system_prompt_tokens", "--system-prompt-tokens")] = 0,
    limit: Annotated[int | None, _opt(RR, "limit", "--limit")] = None,
    warmup: Annotated[int, _opt(RR, "warmup", "--warmup")] = 0,
    exclude_drain: Annotated[bool, _opt(RR, "exclude_drain", "--exclude-drain")] = False,
    seed: Annotated[int, _opt(RR, "seed", "--seed")] = 0,
    reset: Annotated[bool, _opt(RR, "reset", "--reset/--no-reset")] = True,
    block_size: Annotated[int | None, _opt(RR, "block_size", "--block-size")] = None,
    num_gpu_blocks: Annotated[int | None, _opt(RR, "num_gpu_blocks", "--num-gpu-blocks")] = None,
    output_cached: Annotated[str, _opt(RR, "output_cached", "--output-cached")] = "m-1",
    concurrent_model: Annotated[str, _opt(RR, "concurrent_model", "--concurrent-model")] = "scheduler",
    max_num_batched_tokens: Annotated[int, _opt(RR, "max_num_batched_tokens", "--max-num-batched-tokens")] = 2048,
    max_num_seqs: Annotated[int, _opt(RR, "max_num_seqs", "--max-num-seqs")] = 128,
    timeout_s: Annotated[float, _opt(RR, "timeout_s", "--timeout")] = 600.0,
    retries: Annotated[int, _opt(RR, "retries", "--retries")] = 3,
    engine: Annotated[str, _opt(RR, "engine", "--engine")] = "auto",
    pool_tokens: Annotated[int | None, _opt(RR, "pool_tokens", "--pool-tokens")] = None,
    evict_policy: Annotated[str | None, _opt(RR, "evict_policy", "--evict-policy")] = None,
    sglang_cache: Annotated[str, _opt(RR, "sglang_cache", "--sglang-cache")] = "unified",
    server_log: Annotated[Path | None, _opt(RR, "server_log", "--server-log")] = None,
    kv_events: Annotated[Path | None, _opt(RR, "kv_events", "--kv-events")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print strict JSON instead of tables.")] = False,
) -> None:
    """Replay a trace against a running vLLM or SGLang server (OpenAI completions, token-id prompts) and record
    each request's prefix-cache hit (usage.prompt_tokens_details.cached_tokens) and the server's counters.

    --check simulates exactly the recorded sequence with kvhit's vLLM engine (block size and count read from the
    server's vllm:cache_config_info, N = num_gpu_blocks − 1, prompt + first m − 1 generated tokens cached) and
    prints measured vs simulated vs estimated; exit 1 on any per-request mismatch of a sequential replay. A concurrent
    replay is simulated with kvhit's model of vLLM's scheduler (arrivals at the measured send times, steps paced by
    the measured finish times; --max-num-batched-tokens and --max-num-seqs as the server runs) and with holds from
    the measured times, both reported per request and in aggregate (not gating the exit status); --server-log FILE
    (the vLLM server's log, with --enable-log-requests and Unix-time stamps: live/vllm_logging.json) anchors the
    scheduler model and the holds on the engine's own clock (each request's "Added request" line; holds then run
    from the first schedule to the last token), the client's clock reported beside them; --kv-events EVENTS.jsonl
    (the server's KV-cache events, live/kv_events.py record) adds the scheduler model on the step clock (steps that
    store a block only their request can compute end when the engine published them). A replay that fails
    midway keeps its --log, marked partial, and exits 1. Against an SGLang server (detected from /server_info, or
    --engine sglang) --check simulates with kvhit's SGLang model instead (page size, pool and eviction policy read from
    the server); its concurrent replays are simulated with holds only.

    SGLang servers (detected from /server_info, or --engine sglang; start them with --enable-cache-report, and
    --enable-metrics for the counters): --check reads the page size, the KV pool (max_total_num_tokens) and the
    radix eviction policy from /server_info and simulates the recorded sequence with kvhit's SGLang model
    (prompt + first m − 1 generated tokens cached, hits capped at T − 1 tokens in whole pages); a concurrent
    SGLang replay is simulated with holds only. --pool-tokens and --evict-policy simulate another pool or policy
    (negative controls).
    """
    res = _call(
        svc.replay,
        RR,
        _progress_label="replaying",
        endpoint=endpoint,
        trace=trace,
        blocks_trace=blocks_trace,
        model=model,
        check=check,
        log=log,
        concurrency=concurrency,
        speedup=speedup,
        max_in_flight=max_in_flight,
        tokens_per_block=tokens_per_block,
        output_tokens=output_tokens,
        max_output=max_output,
        system_prompt_tokens=system_prompt_tokens,
        limit=limit,
        warmup=warmup,
        exclude_drain=exclude_drain,
        seed=seed,
        reset=reset,
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        output_cached=output_cached,
        concurrent_model=concurrent_model,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        timeout_s=timeout_s,
        retries=retries,
        engine=engine,
        pool_tokens=pool_tokens,
        evict_policy=evict_policy,
        sglang_cache=sglang_cache,
        server_log=server_log,
        kv_events=kv_events,
    )
    if as_json:
        _print_json(res)
    else:
        _render(res)
    if res.error is not None:
        msg = res.error + (f"; partial log kept: {res.log}" if res.log else "")
        err_console.print(Text.assemble(("error: ", "bold red"), msg), highlight=False)
        raise typer.Exit(1)
    if res.check is not None and res.check["per_request"] and res.check["mismatching_requests"]:
        fm = res.check["first_mismatch"]
        err_console.print(
            Text.assemble(
                ("mismatch: ", "bold red"),
                f"{res.check['mismatching_requests']:,} of {res.check['requests_compared']:,} requests differ; first: "
                f"request {fm['request']} (conversation {fm['conversation']}, turn {fm['turn']}): server cached "
                f"{fm['measured_cached_tokens']:,} tokens, kvhit simulated {fm['simulated_hit_tokens']:,}",
            ),
            highlight=False,
        )
        raise typer.Exit(1)


def _render(res) -> None:
    s = res.server
    if s.get("engine") == "sglang":
        conf = (
            f"SGLang, pages of {s['block_size']} tokens, a pool of {_fmt(s['pool_tokens'], 0)} tokens, "
            f"radix_eviction_policy {s['radix_eviction_policy']}"
        )
    else:
        conf = f"blocks of {s['block_size']} tokens, {s['num_gpu_blocks']} blocks (incl. the null block)"
    console.print(
        f"{res.endpoint} ({res.model}): {conf}, max_model_len {s['max_model_len']}; {res.mode}; "
        f"{res.completed:,} of {res.requests:,} requests in {res.wall_s:,.1f} s",
        markup=False,
    )
    c = res.counters
    m = res.measured
    rows = [
        ["server counters (whole replay)", _fmt(c["queries"], 0), _fmt(c["hits"], 0), _fmt(c["ratio"])]
        if c["queries"] is not None
        else ["server counters", "–", "–", "not exported"],
        [
            f"measured cached_tokens ({m['requests']:,} requests)",
            _fmt(m["prompt_tokens"]),
            _fmt(m["cached_tokens"]),
            _fmt(m["token_hit_ratio"]),
        ],
    ]
    ck = res.check
    if ck is not None:
        what = (
            f"C = {ck['pool_tokens']:,} tokens, {ck['evict_policy']}"
            if ck.get("engine") == "sglang"
            else f"N = {ck['usable_blocks']} blocks"
        )
        rows.append(
            [
                f"kvhit simulated ({what})",
                _fmt(m["prompt_tokens"]),
                "–",
                _fmt(ck["simulated_token_hit_ratio"]),
            ]
        )
        rows.append(["kvhit engine-aware estimate", "–", "–", _fmt(ck["estimated_token_hit_ratio"])])
    _table("prefix cache: token hit ratio", ["", "prompt tokens", "hit tokens", "ratio"], rows)
    if ck is not None:
        if ck["per_request"]:
            console.print(
                f"per request: {ck['mismatching_requests']:,} of {ck['requests_compared']:,} differ from kvhit's "
                "simulation" + (" (exact)" if not ck["mismatching_requests"] else ""),
                markup=False,
            )
        elif ck.get("engine") == "sglang":
            x = ck["concurrent"]["holds"]
            console.print(
                f"concurrent, holds from measured times: {x['mismatching_requests']:,} of "
                f"{x['requests_compared']:,} requests differ; simulated − measured = "
                f"{x['simulated_minus_measured']:+.4f}",
                markup=False,
            )
        else:
            cc = ck["concurrent"]
            anchored = "scheduler_client_clock" in cc
            h_anchored = "holds_client_clock" in cc
            for name, what in (
                ("scheduler", "vLLM's scheduler" + (" on the server's clock" if anchored else "")),
                ("scheduler_client_clock", "vLLM's scheduler on the client's clock"),
                (
                    "holds",
                    "holds on the server's clock (first schedule to last token)"
                    if h_anchored
                    else "holds from measured times",
                ),
                ("holds_client_clock", "holds on the client's clock (send to finish)"),
                ("scheduler_step_clock", "vLLM's scheduler on the step clock (KV events)"),
            ):
                if name not in cc:
                    continue
                x = cc[name]
                mark = " (the simulated row)" if cc["model"] == name else ""
                console.print(
                    f"concurrent, {what}{mark}: {x['mismatching_requests']:,} of {x['requests_compared']:,} requests "
                    f"differ; simulated − measured = {x['simulated_minus_measured']:+.4f}",
                    markup=False,
                )
            sc = cc["scheduler"]
            if sc["clock"].startswith("anchored"):
                how = "arrivals at the server log's 'Added request' times, steps paced by the server's own timings"
            elif sc["clock"].startswith("measured"):
                how = "steps paced by the measured finish times" + (
                    " and the server's own timings" if "server" in sc["clock"] else ""
                )
            else:
                t = sc["step_time"]
                how = (
                    f"step = {t['a'] * 1e3:.2f} ms + {t['b'] * 1e6:.2f} µs/token, HTTP overhead "
                    f"{(t['d_in'] + t['d_out']) * 1e3:.2f} ms" + (", fitted" if sc["step_time_fitted"] else "")
                )
            console.print(
                f"scheduler model: {how}; {sc['preemptions']:,} preemptions "
                f"({sc['preempted_requests']:,} requests); latency error {sc['latency_mean_abs_error_s'] * 1e3:.1f} ms "
                f"(mean abs; measured mean {sc['measured_latency_mean_s'] * 1e3:.1f} ms)",
                markup=False,
            )
    st = m.get("stationarity")
    if st is not None and not st["stationary"]:
        console.print(f"warning: measured window {st['message']}", markup=False)
    if not c["equal_to_per_request_sums"]:
        console.print(
            "note: the counter deltas differ from the sums of the responses (another client used the server?)",
            markup=False,
        )
    for n in res.notes:
        console.print(f"note: {n}", markup=False)
    if res.log:
        console.print(f"log: {res.log}" + (" (partial)" if res.partial else ""), markup=False)
