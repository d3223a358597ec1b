"""Send a :class:`~kvhit.replay.tokens.ReplayPlan` to an OpenAI-compatible server and record what happened.

Two engines are understood: vLLM and SGLang (``engine="auto"`` tells them apart: ``vllm:`` metrics on
``/metrics`` mean vLLM; otherwise a ``GET /server_info`` — ``/get_server_info`` on older servers — that returns
SGLang's server arguments and ``max_total_num_tokens`` means SGLang).

The server is driven through ``POST /v1/completions`` with token-id prompts (``prompt: [ids]``,
``max_tokens``, ``min_tokens`` = ``max_tokens`` and ``ignore_eos`` so the output has the asked length,
``temperature`` 0, ``return_token_ids`` so a chat history can include what was generated). Per request it
records the prompt sent, the output ids, the send and finish times and ``usage.prompt_tokens_details.
cached_tokens`` (the server's prefix-cache hit for that request). Before and after the run it reads the
server's Prometheus ``/metrics``: ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total``
(tokens) and ``vllm:cache_config_info`` (``block_size``, ``num_gpu_blocks``).

SGLang (0.5.23, read from the wheel: ``entrypoints/http_server.py``, ``utils/common.py`` ``build_server_info``,
``entrypoints/openai/usage_processor.py``, ``observability/metrics_collector.py``): the cache configuration comes
from ``GET /server_info`` — the resolved server arguments (``page_size``, ``radix_eviction_policy``,
``radix_eviction_policy_config``, ``disable_radix_cache``, ``enable_cache_report``, ``enable_hierarchical_cache``,
``enable_metrics``) and the scheduler's ``max_total_num_tokens`` (the KV pool in tokens); the per-request hit is
the same ``usage.prompt_tokens_details.cached_tokens`` (only with ``--enable-cache-report``; it is the request's
``meta_info.cached_tokens``); the counters, when the server runs with ``--enable-metrics``, are
``sglang:prompt_tokens_total`` and ``sglang:cached_tokens_total`` (summed over ``cache_source``), both counted
when a request finishes; the cache is emptied with ``POST /flush_cache`` (refused while requests run).

Timing: ``concurrency=K`` runs a closed loop in trace order (at most K requests in flight; K = 1 is the
sequential replay, exactly repeatable after a cache reset); ``speedup=S`` sends each request at its trace
arrival time divided by S (never before the previous turn of its conversation finished), with at most
``max_in_flight`` requests in flight. A connection that cannot be opened is retried (``retries`` times, with
backoff); nothing else is retried — a request the server may have seen is never sent twice. A failure stops the
replay: what finished is kept and the result is marked partial with a one-line reason.

Invariant: nothing here prints; errors that mean bad input (no server, not vLLM, unknown model, counters
missing, a prompt too long) are :class:`ReplayError` with one line naming the endpoint or flag.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np

from .tokens import ReplayPlan, chat_prompt

__all__ = ["ReplayError", "ReplayRun", "ServerInfo", "parse_metrics", "probe", "run_plan"]

ENGINES = ("auto", "vllm", "sglang")
QUERIES = "vllm:prefix_cache_queries_total"
PREEMPTIONS = "vllm:num_preemptions_total"
HITS = "vllm:prefix_cache_hits_total"
CACHE_INFO = "vllm:cache_config_info"
SG_QUERIES = "sglang:prompt_tokens_total"
SG_HITS = "sglang:cached_tokens_total"


class ReplayError(ValueError):
    """A replay that cannot start (one line naming the endpoint/flag)."""


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition → ``{name: [(labels, value), …]}`` (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        try:
            v = float(m.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, v))
    return out


def _counter(metrics: dict, name: str, model: str | None) -> float | None:
    rows = metrics.get(name)
    if rows is None:
        return None
    sel = [v for lab, v in rows if model is None or lab.get("model_name", model) == model]
    return float(sum(sel)) if sel else None


@dataclass(frozen=True)
class ServerInfo:
    """What the server said about itself: served models, ``max_model_len``, its cache configuration."""

    endpoint: str
    models: tuple[str, ...]
    max_model_len: int | None
    block_size: int | None
    num_gpu_blocks: int | None
    prefix_caching: bool | None
    cache_config: dict[str, str] = field(default_factory=dict)
    #: ``"vllm"`` or ``"sglang"``
    engine: str = "vllm"
    #: SGLang: the KV pool in tokens (``max_total_num_tokens``), the radix eviction policy and its config, whether
    #: ``cached_tokens`` is reported (``--enable-cache-report``) and the ``sglang:`` counters exported
    pool_tokens: int | None = None
    evict_policy: str | None = None
    policy_config: dict | None = None
    cache_report: bool | None = None
    counters: bool = True
    #: SGLang server arguments kvhit does not model, when set (HiCache, speculative decoding, …): name → value
    unmodelled: dict = field(default_factory=dict)


async def _get(client: httpx.AsyncClient, url: str, endpoint: str) -> httpx.Response:
    try:
        return await client.get(url)
    except httpx.ConnectError as e:
        raise ReplayError(f"--endpoint {endpoint}: no server answers ({_reason(e)})") from None
    except httpx.TimeoutException:
        raise ReplayError(f"--endpoint {endpoint}: the server did not answer GET {url} in time") from None
    except httpx.HTTPError as e:
        raise ReplayError(f"--endpoint {endpoint}: GET {url} failed ({_reason(e)})") from None


def _reason(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[-1] if s and s[-1] else type(e).__name__


async def probe(
    client: httpx.AsyncClient, endpoint: str, model: str | None, engine: str = "auto"
) -> tuple[ServerInfo, str]:
    """Check that ``endpoint`` is a vLLM or SGLang server (``engine``: ``auto``, ``vllm`` or ``sglang``) serving
    ``model`` and reporting its prefix-cache hits; returns its :class:`ServerInfo` and the model name to use (the
    only served one when ``model`` is None)."""
    if engine not in ENGINES:
        raise ReplayError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")
    r = await _get(client, "/v1/models", endpoint)
    try:
        data = r.json()["data"]
        models = tuple(str(m["id"]) for m in data)
    except Exception:
        raise ReplayError(
            f"--endpoint {endpoint}: not an OpenAI-compatible server (GET /v1/models: HTTP {r.status_code})"
        ) from None
    if model is None:
        if len(models) != 1:
            raise ReplayError(f"--model: the server serves {list(models)}; name one")
        model = models[0]
    elif model not in models:
        raise ReplayError(f"--model {model}: the server at {endpoint} serves {list(models)}, not {model!r}")
    mml = next((m.get("max_model_len") for m in data if str(m["id"]) == model), None)
    mml = int(mml) if isinstance(mml, int | float) and not isinstance(mml, bool) else None
    r = await _get(client, "/metrics", endpoint)
    metrics = parse_metrics(r.text) if r.status_code == 200 else {}
    is_vllm = any(k.startswith("vllm:") for k in metrics)
    if engine == "vllm" or (engine == "auto" and is_vllm):
        if not is_vllm:
            raise ReplayError(
                f"--endpoint {endpoint}: not a vLLM server (GET /metrics: HTTP {r.status_code}, no vllm: metrics); "
                "kvhit replay reads vLLM's prefix-cache counters"
            )
        return _vllm_info(endpoint, models, mml, metrics, model), model
    sinfo = await _sglang_server_info(client, endpoint)
    if sinfo is None:
        if engine == "sglang":
            raise ReplayError(
                f"--endpoint {endpoint}: not an SGLang server (neither GET /server_info nor /get_server_info returns "
                "SGLang's server arguments)"
            )
        raise ReplayError(
            f"--endpoint {endpoint}: not a vLLM server (GET /metrics: HTTP {r.status_code}, no vllm: metrics) and not "
            "an SGLang server (no server arguments on GET /server_info); kvhit replay reads their prefix-cache reports"
        )
    return _sglang_info(endpoint, models, mml, metrics, model, sinfo), model


def _vllm_info(endpoint, models, mml, metrics, model) -> ServerInfo:
    for name in (QUERIES, HITS):
        if _counter(metrics, name, model) is None:
            raise ReplayError(
                f"--endpoint {endpoint}: /metrics has no {name} for model {model!r} "
                "(a vLLM older than the prefix-cache counters, or a server without them)"
            )
    cfg: dict[str, str] = {}
    for lab, _v in metrics.get(CACHE_INFO, []):
        cfg = lab
        break

    def _int(k):
        try:
            return int(cfg[k])
        except (KeyError, ValueError):
            return None

    pc = cfg.get("enable_prefix_caching")
    return ServerInfo(
        endpoint=endpoint,
        models=models,
        max_model_len=mml,
        block_size=_int("block_size"),
        num_gpu_blocks=_int("num_gpu_blocks"),
        prefix_caching=None if pc is None else pc.lower() == "true",
        cache_config=dict(cfg),
    )


async def _sglang_server_info(client: httpx.AsyncClient, endpoint: str) -> dict | None:
    """SGLang's ``/server_info`` (``/get_server_info`` before it was renamed), or None if neither answers with
    SGLang's server arguments."""
    for path in ("/server_info", "/get_server_info"):
        r = await _get(client, path, endpoint)
        if r.status_code != 200:
            continue
        try:
            d = r.json()
        except Exception:
            continue
        if isinstance(d, dict) and ("radix_eviction_policy" in _flat(d) or "disable_radix_cache" in _flat(d)):
            return d
    return None


def _flat(d: dict) -> dict:
    """Server arguments at the top level, then one level down (a namespaced dump), then in the first
    ``internal_states`` entry (per data-parallel rank), first found wins."""
    out: dict = {}
    for st in d.get("internal_states") or []:
        if isinstance(st, dict):
            out.update({k: v for k, v in st.items() if not isinstance(v, dict)})
            break
    for v in d.values():
        if isinstance(v, dict):
            out.update({k: x for k, x in v.items() if not isinstance(x, dict)})
    out.update({k: v for k, v in d.items() if not isinstance(v, dict)})
    return out


def _find(d: dict, key: str):
    """``d[key]`` at the top level, else in a namespace one level down, else in the first ``internal_states``."""
    if key in d:
        return d[key]
    for v in d.values():
        if isinstance(v, dict) and key in v:
            return v[key]
    st = d.get("internal_states") or []
    return st[0].get(key) if st and isinstance(st[0], dict) else None


def _as_int(v) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


#: SGLang server arguments whose non-default value changes the cache kvhit would have to model
_SGLANG_UNMODELLED = {
    "enable_hierarchical_cache": lambda v: bool(v),
    "speculative_algorithm": lambda v: v not in (None, "", "NONE", "none"),
    "enable_lmcache": lambda v: bool(v),
    "disaggregation_mode": lambda v: v not in (None, "", "null"),
    "enable_streaming_session": lambda v: bool(v),
}


def _sglang_info(endpoint, models, mml, metrics, model, d: dict) -> ServerInfo:
    f = _flat(d)
    disabled = f.get("disable_radix_cache")
    pol = f.get("radix_eviction_policy")
    cfg = _find(d, "radix_eviction_policy_config")  # a dict: _flat keeps scalars only
    if isinstance(cfg, str):
        import json

        try:
            cfg = json.loads(cfg)
        except ValueError:
            cfg = None
    has_counters = _counter(metrics, SG_QUERIES, model) is not None
    ctx = _as_int(f.get("context_len")) or _as_int(f.get("context_length"))
    return ServerInfo(
        endpoint=endpoint,
        models=models,
        max_model_len=mml or ctx,
        block_size=_as_int(f.get("page_size")),
        num_gpu_blocks=None,
        prefix_caching=None if disabled is None else not bool(disabled),
        cache_config={k: str(f[k]) for k in ("page_size", "max_total_num_tokens", "radix_eviction_policy") if k in f},
        engine="sglang",
        pool_tokens=_as_int(f.get("max_total_num_tokens")),
        evict_policy=None if pol is None else str(pol),
        policy_config=cfg if isinstance(cfg, dict) else None,
        cache_report=None if "enable_cache_report" not in f else bool(f["enable_cache_report"]),
        counters=has_counters,
        unmodelled={k: f[k] for k, bad in _SGLANG_UNMODELLED.items() if k in f and bad(f[k])},
    )


async def counters(
    client: httpx.AsyncClient, endpoint: str, model: str, timeout=None, engine: str = "vllm"
) -> tuple[float, float]:
    """``(queries, hits)`` token counters now (vLLM: prefix-cache queries and hits; SGLang: prompt tokens and
    cached tokens of the finished requests)."""
    if timeout is not None:
        try:
            r = await client.get("/metrics", timeout=timeout)
        except httpx.HTTPError as e:
            raise ReplayError(f"--endpoint {endpoint}: GET /metrics failed ({_reason(e)})") from None
    else:
        r = await _get(client, "/metrics", endpoint)
    m = parse_metrics(r.text)
    if engine == "sglang":
        q, h = _counter(m, SG_QUERIES, model), _counter(m, SG_HITS, model)
        if q is not None and h is None:  # cached_tokens_total appears with the first hit
            h = 0.0
    else:
        q, h = _counter(m, QUERIES, model), _counter(m, HITS, model)
    if q is None or h is None:
        raise ReplayError(f"--endpoint {endpoint}: /metrics lost the prefix-cache counters")
    return q, h


async def _preemptions(client: httpx.AsyncClient, model: str) -> float | None:
    """``vllm:num_preemptions_total`` now (None if the server does not export it or does not answer)."""
    try:
        r = await client.get("/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    return _counter(parse_metrics(r.text), PREEMPTIONS, model)


async def reset_prefix_cache(client: httpx.AsyncClient, endpoint: str, engine: str = "vllm") -> None:
    if engine == "sglang":
        try:
            r = await client.post("/flush_cache")
        except httpx.HTTPError as e:
            raise ReplayError(f"--endpoint {endpoint}: POST /flush_cache failed ({_reason(e)})") from None
        if r.status_code >= 400:
            msg = " ".join(r.text.split())[:200]
            raise ReplayError(
                f"--endpoint {endpoint}: POST /flush_cache: HTTP {r.status_code} ({msg}; SGLang flushes only an "
                "idle server)"
            )
        return
    try:
        r = await client.post("/reset_prefix_cache")
    except httpx.HTTPError as e:
        raise ReplayError(f"--endpoint {endpoint}: POST /reset_prefix_cache failed ({_reason(e)})") from None
    if r.status_code == 404:
        raise ReplayError(
            f"--endpoint {endpoint}: POST /reset_prefix_cache is not served (start vLLM with "
            "VLLM_SERVER_DEV_MODE=1, or pass --no-reset on a server whose cache is empty)"
        )
    if r.status_code >= 400:
        raise ReplayError(f"--endpoint {endpoint}: POST /reset_prefix_cache: HTTP {r.status_code}")


@dataclass
class ReplayRun:
    """What a replay recorded (arrays of the plan's length; unsent requests have status ``"not-sent"``)."""

    model: str
    prompts: list[np.ndarray | None]
    outputs: list[np.ndarray | None]
    t_send: np.ndarray
    t_done: np.ndarray
    cached_tokens: np.ndarray
    prompt_tokens_reported: np.ndarray
    completion_tokens: np.ndarray
    status: list[str]
    counters_before: tuple[float, float] | None = None
    counters_after: tuple[float, float] | None = None
    #: per request, the server's own timings when it returns them (vLLM ``--enable-per-request-metrics``:
    #: ``metrics.queue_time_ms``, ``time_to_first_token_ms`` from first scheduling, ``generation_time_ms``); NaN if not
    queue_ms: np.ndarray | None = None
    ttft_ms: np.ndarray | None = None
    gen_ms: np.ndarray | None = None
    #: ``vllm:num_preemptions_total`` before and after (None when the server does not export it)
    preemptions_before: float | None = None
    preemptions_after: float | None = None
    #: per request, the response's ``id`` (vLLM: ``cmpl-`` + the ``X-Request-Id`` header kvhit sends); None if unsent
    response_id: list[str | None] | None = None
    #: the Unix time of the replay's time origin (``t_send``/``t_done`` are seconds after it)
    t0_unix: float = math.nan
    #: the ``X-Request-Id`` of request ``r`` is ``f"{request_id_prefix}-{r}"``
    request_id_prefix: str = ""
    error: str | None = None
    wall_s: float = 0.0

    @property
    def partial(self) -> bool:
        return self.error is not None or any(s != "ok" for s in self.status)

    @property
    def n_ok(self) -> int:
        return sum(s == "ok" for s in self.status)


class _Fatal(Exception):
    pass


async def _complete(client, model, r, prompt, max_tokens, retries, backoff, endpoint, engine="vllm", rid=None):
    body = {
        "model": model,
        "prompt": [int(x) for x in prompt],
        "max_tokens": int(max_tokens),
        "min_tokens": int(max_tokens),
        "ignore_eos": True,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    for attempt in range(retries + 1):
        try:
            resp = await client.post(
                "/v1/completions", json=body, headers=None if rid is None else {"X-Request-Id": rid}
            )
            break
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            if attempt == retries:
                raise _Fatal(
                    f"the server at {endpoint} stopped accepting connections at request {r} "
                    f"({_reason(e)}; {retries} retries)"
                ) from None
            await asyncio.sleep(backoff * 2**attempt)
        except httpx.HTTPError as e:
            raise _Fatal(f"request {r}: the connection to {endpoint} failed mid-request ({_reason(e)})") from None
    if resp.status_code != 200:
        try:
            msg = resp.json().get("error", {}).get("message") or resp.text
        except Exception:
            msg = resp.text
        raise _Fatal(f"request {r}: the server answered HTTP {resp.status_code}: {' '.join(str(msg).split())[:300]}")
    d = resp.json()
    ch = d["choices"][0]
    usage = d.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if "cached_tokens" not in details or details["cached_tokens"] is None:
        flag = "SGLang with --enable-cache-report" if engine == "sglang" else "vLLM with --enable-prompt-tokens-details"
        raise _Fatal(f"request {r}: the response has no usage.prompt_tokens_details.cached_tokens (start {flag})")
    out = ch.get("token_ids")
    if out is None:
        raise _Fatal(f"request {r}: the response has no choices[0].token_ids (a server without return_token_ids)")
    met = d.get("metrics") or {}

    def _ms(k):
        v = met.get(k)
        return float(v) if isinstance(v, int | float) else float("nan")

    return (
        np.asarray(out, np.int64),
        int(details["cached_tokens"]),
        int(usage.get("prompt_tokens", -1)),
        int(usage.get("completion_tokens", len(out))),
        (_ms("queue_time_ms"), _ms("time_to_first_token_ms"), _ms("generation_time_ms")),
        None if d.get("id") is None else str(d["id"]),
    )


async def _run_async(
    plan: ReplayPlan,
    endpoint: str,
    model: str | None,
    *,
    concurrency: int | None,
    speedup: float | None,
    max_in_flight: int,
    retries: int,
    backoff: float,
    timeout_s: float,
    reset: bool,
    progress: Callable[[int, int], None] | None,
    on_probe: Callable[[ServerInfo, str], None] | None,
    engine: str = "auto",
) -> tuple[ServerInfo, ReplayRun]:
    n = plan.n
    limits = httpx.Limits(max_connections=max(concurrency or max_in_flight, 1) + 2)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(base_url=endpoint.rstrip("/"), timeout=timeout, limits=limits) as client:
        info, model = await probe(client, endpoint, model, engine)
        eng = info.engine
        if on_probe is not None:
            on_probe(info, model)
        if reset:
            await reset_prefix_cache(client, endpoint, eng)
        run = ReplayRun(
            model=model,
            prompts=[None] * n,
            outputs=[None] * n,
            t_send=np.full(n, np.nan),
            t_done=np.full(n, np.nan),
            cached_tokens=np.full(n, -1, np.int64),
            queue_ms=np.full(n, np.nan),
            ttft_ms=np.full(n, np.nan),
            gen_ms=np.full(n, np.nan),
            prompt_tokens_reported=np.full(n, -1, np.int64),
            completion_tokens=np.full(n, -1, np.int64),
            status=["not-sent"] * n,
            response_id=[None] * n,
            # a per-run prefix keeps the ids of several replays against one server (one server log) apart
            request_id_prefix=f"kvhit-{uuid.uuid4().hex[:12]}",
        )
        if info.counters:
            run.counters_before = await counters(client, endpoint, model, engine=eng)
        run.preemptions_before = await _preemptions(client, model)
        done_ev = [asyncio.Event() for _ in range(n)]
        t0 = time.monotonic()
        run.t0_unix = time.time() - (time.monotonic() - t0)
        finished = 0

        async def one(r: int) -> None:
            nonlocal finished
            p = int(plan.prev[r])
            if plan.chat and p >= 0:
                prompt = chat_prompt(run.prompts[p], run.outputs[p], plan.new_ids[r])
            else:
                prompt = np.asarray(plan.new_ids[r], np.int64)
            run.prompts[r] = prompt
            run.status[r] = "in-flight"
            run.t_send[r] = time.monotonic() - t0
            out, cached, pt, ct, tm, run.response_id[r] = await _complete(
                client,
                model,
                r,
                prompt,
                plan.max_tokens[r],
                retries,
                backoff,
                endpoint,
                eng,
                rid=f"{run.request_id_prefix}-{r}",
            )
            run.t_done[r] = time.monotonic() - t0
            run.outputs[r] = out
            run.cached_tokens[r] = cached
            run.prompt_tokens_reported[r] = pt
            run.completion_tokens[r] = ct
            run.queue_ms[r], run.ttft_ms[r], run.gen_ms[r] = tm
            run.status[r] = "ok"
            done_ev[r].set()
            finished += 1
            if progress is not None:
                progress(finished, n)

        tasks: list[asyncio.Task] = []
        try:
            if speedup is None:
                sem = asyncio.Semaphore(int(concurrency or 1))

                async def slot(r):
                    try:
                        await one(r)
                    finally:
                        sem.release()

                for r in range(n):
                    p = int(plan.prev[r])
                    if p >= 0:
                        await done_ev[p].wait()
                    await sem.acquire()
                    tasks.append(asyncio.create_task(slot(r)))
                    # surface a failure at once instead of after the whole dispatch
                    for t in tasks[-(int(concurrency or 1) + 1) :]:
                        if t.done() and t.exception() is not None:
                            raise t.exception()
                await asyncio.gather(*tasks)
            else:
                sem = asyncio.Semaphore(max_in_flight)
                tz = float(plan.time[0]) if n else 0.0

                async def timed(r):
                    p = int(plan.prev[r])
                    delay = (float(plan.time[r]) - tz) / speedup - (time.monotonic() - t0)
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if p >= 0:
                        await done_ev[p].wait()
                    async with sem:
                        await one(r)

                tasks = [asyncio.create_task(timed(r)) for r in range(n)]
                await asyncio.gather(*tasks)
        except _Fatal as e:
            run.error = str(e)
        except ReplayError as e:
            run.error = str(e)
        finally:
            for t in tasks:
                if not t.done():
                    t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            for r in range(n):
                if run.status[r] == "in-flight":
                    run.status[r] = "failed"
            run.wall_s = time.monotonic() - t0
        if not info.counters:
            pass
        elif run.error is None:
            run.counters_after = await counters(client, endpoint, model, engine=eng)
            run.preemptions_after = await _preemptions(client, model)
        else:  # the server may be gone or hung: a short look, and no counters if it does not answer
            try:
                run.counters_after = await counters(client, endpoint, model, timeout=5.0, engine=eng)
            except ReplayError:
                run.counters_after = None
        return info, run


def run_plan(
    plan: ReplayPlan,
    endpoint: str,
    model: str | None = None,
    *,
    concurrency: int | None = 1,
    speedup: float | None = None,
    max_in_flight: int = 64,
    retries: int = 3,
    backoff: float = 0.5,
    timeout_s: float = 600.0,
    reset: bool = True,
    progress: Callable[[int, int], None] | None = None,
    on_probe: Callable[[ServerInfo, str], None] | None = None,
    engine: str = "auto",
) -> tuple[ServerInfo, ReplayRun]:
    """Replay ``plan`` against ``endpoint`` (see the module docstring). Raises :class:`ReplayError` when the
    replay cannot start; a failure after it started is returned in :attr:`ReplayRun.error`."""
    if speedup is not None and not (math.isfinite(speedup) and speedup > 0):
        raise ReplayError(f"--speedup: expected a number > 0, got {speedup!r}")
    return asyncio.run(
        _run_async(
            plan,
            endpoint,
            model,
            concurrency=concurrency,
            speedup=speedup,
            max_in_flight=max_in_flight,
            retries=retries,
            backoff=backoff,
            timeout_s=timeout_s,
            reset=reset,
            progress=progress,
            on_probe=on_probe,
            engine=engine,
        )
    )
