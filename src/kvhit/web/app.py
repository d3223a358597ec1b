"""The web front end: a JSON API over :mod:`kvhit.service` and the planner page, as one FastAPI app.

Invariant: the API adds transport only — every request body is validated by the service layer's own request
model (:data:`kvhit.service.registry.COMMANDS`) and answered by its function; a refusal (the service's
:class:`~kvhit.service.InputError`, one line naming the field/flag) is HTTP 422 ``{"detail": line, "field": …}``.
The API never reads or writes a path a client names: input files come as uploads (deleted when the request or
job ends), output files (plots) are refused. Bodies and uploads are size-limited (413). Long commands (simulate,
curve, trace stats, tiers, plan with ``verify`` or an uploaded trace) are jobs (``kvhit.web.jobs``): 202 with a
job id to poll (progress) or cancel; results are cached by the hash of the inputs (fields and uploaded bytes).

NOT modelled here: anything the service computes or checks; authentication (the server binds 127.0.0.1 by
default and is meant for one user or a trusted network).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.datastructures import UploadFile

from kvhit.service import InputError, list_presets
from kvhit.service.registry import COMMANDS, path_fields
from kvhit.web.jobs import JobManager, QueueFull

__all__ = ["create_app", "MAX_BODY_BYTES", "MAX_UPLOAD_BYTES"]

#: Largest JSON body (bytes) and largest uploaded file (bytes) the API accepts.
MAX_BODY_BYTES = 1 << 20
MAX_UPLOAD_BYTES = 512 << 20
#: Most capacities one estimate request may ask for over HTTP (a 100,000-point answer is ~19 MB and 25 s).
MAX_HTTP_CAPACITIES = 10_000

#: Commands always run as jobs (long); ``plan`` is one unless it uses the paper's closed form (see ``handle``).
JOB = ("simulate", "stream", "curve", "stats", "tiers", "block-stats", "trace-estimate", "fleet", "fleet-plan",
       "fleet-curve")  # fmt: skip
#: Input-file fields a client may upload, per command; ``model_config`` is a config.json for ``model``.
UPLOADS = {
    "estimate": (),
    "kv": ("model_config",),
    "plan": ("trace", "blocks_trace", "model_config"),
    "planner": ("model_config",),
    "simulate": ("trace", "blocks_trace"),
    "stream": ("trace",),
    "curve": ("trace", "blocks_trace", "model_config"),
    "stats": ("path",),
    "tiers": ("trace", "blocks_trace", "model_config"),
    "block-stats": ("path",),
    "trace-estimate": ("trace", "blocks_trace"),
    "fleet": ("trace", "blocks_trace"),
    "fleet-plan": ("trace", "blocks_trace", "model_config"),
    "fleet-curve": ("trace", "blocks_trace", "model_config"),
}
ROUTES = {c: f"/api/{c}" for c in COMMANDS} | {
    "stats": "/api/trace/stats",
    "block-stats": "/api/trace/block-stats",
    "trace-estimate": "/api/trace/estimate",
    "fleet-plan": "/api/fleet/plan",
    "fleet-curve": "/api/fleet/curve",
}

STATIC = resources.files("kvhit.web") / "static"


class Refused(Exception):
    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field = status, detail, field


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _field_of(msg: str, model) -> str | None:
    """The request field a one-line service message names (by its CLI flag or field name), if any."""
    head = msg.split(":", 1)[0].split(" ", 1)[0].split("[", 1)[0]
    for name in model.model_fields:
        if head in (model.flag(name), name):
            return name
    return head[2:].replace("-", "_") if head.startswith("--") else None


class _Limit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes (413) — by Content-Length, or while reading."""

    def __init__(self, app, limit_for) -> None:
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, what = self.limit_for(scope)
        headers = dict(scope.get("headers") or [])
        cl = headers.get(b"content-length")
        if cl is not None and cl.isdigit() and int(cl) > limit:
            return await _send_413(send, limit, what)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _send_413(send, limit, what)


class _TooLarge(Exception):
    pass


def _size(n: int) -> str:
    """Bytes as a person reads them: 512 MiB, 1 MiB, 200,000 bytes."""
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k:,} {unit}"
    return f"{n:,} bytes"


async def _send_413(send, limit: int, what: str | None = None) -> None:
    body = json.dumps({"detail": what or f"request body: larger than the limit of {_size(limit)}"}).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _safe_name(name: str | None, fallback: str) -> str:
    base = os.path.basename(name or "") or fallback
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base)[:100].lstrip(".")
    return base or fallback


async def _parse(request: Request, command: str, max_upload: int) -> tuple[dict[str, Any], dict, Path | None, str]:
    """The request fields, a {temporary path: client file name} map, the upload directory, and the input hash."""
    model, _ = COMMANDS[command]
    ctype = request.headers.get("content-type", "")
    files: dict[str, UploadFile] = {}
    if ctype.startswith("multipart/form-data"):
        from starlette.formparsers import MultiPartException

        try:
            form = await request.form(max_part_size=MAX_BODY_BYTES)
        except MultiPartException as e:
            if "maximum size" in str(e):
                raise Refused(413, f"multipart field: larger than the limit of {_size(MAX_BODY_BYTES)}") from None
            raise Refused(422, f"request body: malformed multipart ({e})") from None
        raw = form.get("request", "{}")
        for k, v in form.multi_items():
            if k == "request":
                continue
            if not isinstance(v, UploadFile) or k not in UPLOADS[command]:
                allowed = ", ".join(UPLOADS[command]) or "none"
                raise Refused(422, f"{k}: not a file part of {command} (file parts: {allowed})", k)
            files[k] = v
        if isinstance(raw, UploadFile):
            raw = (await raw.read()).decode("utf-8", "replace")
    else:
        body = await request.body()
        mime = ctype.split(";", 1)[0].strip().lower()
        if body.strip() and mime != "application/json":
            raise Refused(415, f"request body: content-type {mime or '(none)'}; send application/json or multipart")
        raw = body.decode("utf-8", "replace") or "{}"
    try:
        fields = json.loads(raw)
    except json.JSONDecodeError as e:
        raise Refused(422, f"request body: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise Refused(422, "request body: JSON nested too deeply") from None
    if not isinstance(fields, dict):
        raise Refused(422, "request body: expected a JSON object of request fields")
    _strict_types(model, fields)
    n = fields.get("N") if command in ("estimate", "planner") else None
    if isinstance(n, list) and len(n) > MAX_HTTP_CAPACITIES:
        raise Refused(
            413,
            f"N: {len(fields['N']):,} capacities; at most {MAX_HTTP_CAPACITIES:,} over HTTP (use kvhit estimate)",
            "N",
        )
    for name in path_fields(model):
        if fields.get(name) is not None:
            how = f"upload it as file part '{name}'" if name in UPLOADS[command] else "file outputs are CLI-only"
            raise Refused(422, f"{name}: file paths are not accepted over HTTP; {how}", name)
    m = fields.get("model")
    if isinstance(m, str) and (os.sep in m or m.endswith(".json") or os.path.exists(m)):
        raise Refused(422, "model: a preset name over HTTP; upload a config.json as file part 'model_config'", "model")
    digest = _digest(command, fields)
    tmpdir: Path | None = None
    rename: dict[str, str] = {}
    try:
        for name, up in files.items():
            if tmpdir is None:
                tmpdir = Path(tempfile.mkdtemp(prefix="kvhit-upload-"))
            if name == "model_config":  # the model is named after its directory: the client's file name
                stem = _safe_name(up.filename, "config.json").removesuffix(".json") or "config"
                (tmpdir / name / stem).mkdir(parents=True)
                dest = tmpdir / name / stem / "config.json"
            else:
                (tmpdir / name).mkdir()
                dest = tmpdir / name / _safe_name(up.filename, "upload")
            size = 0
            h = hashlib.sha256()
            with open(dest, "wb") as f:
                while chunk := await up.read(1 << 20):
                    size += len(chunk)
                    if size > max_upload:
                        raise Refused(413, f"{name}: larger than the upload limit of {max_upload:,} bytes", name)
                    h.update(chunk)
                    f.write(chunk)
            digest.update(f"{name}={h.hexdigest()};{dest.name}".encode())
            rename[str(dest)] = up.filename or dest.name
            fields["model" if name == "model_config" else name] = str(dest)
    except BaseException:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)
        raise
    return fields, rename, tmpdir, digest.hexdigest()


def _json_kinds(schema: dict, defs: dict) -> set[str]:
    """The JSON types a (pydantic) schema accepts, following $ref and anyOf/oneOf/allOf."""
    if "$ref" in schema:
        return _json_kinds(defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), defs)
    kinds = set()
    t = schema.get("type")
    if isinstance(t, str):
        kinds.add(t)
    elif isinstance(t, list):
        kinds.update(t)
    if "enum" in schema or "const" in schema:
        vals = schema.get("enum", [schema.get("const")])
        kinds.update("boolean" if isinstance(v, bool) else "string" if isinstance(v, str) else "number" for v in vals)
    for k in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(k, []):
            kinds |= _json_kinds(sub, defs)
    if not kinds:
        kinds = {"any"}
    return kinds


@functools.cache
def _field_kinds(model) -> dict[str, tuple[frozenset[str], frozenset[str] | None]]:
    """Per field of a request model: the JSON types its value may have, and those of a list's items (None: no list
    form). Built once per model — the JSON schema takes ~1 ms to generate, more than the slider's answer."""
    schema = model.model_json_schema()
    defs, props = schema.get("$defs", {}), schema.get("properties", {})
    out = {}
    for name, sch in props.items():
        items = [s.get("items", {}) for s in [sch, *sch.get("anyOf", [])] if "items" in s]
        item_kinds = frozenset(set().union(*(_json_kinds(i, defs) for i in items))) if items else None
        out[name] = (frozenset(_json_kinds(sch, defs)), item_kinds)
    return out


def _strict_types(model, fields: dict) -> None:
    """Refuse a JSON boolean where a number or string is expected and a string where a number is expected (pydantic
    would read ``true`` as 1.0 and ``"5"`` as 5): the JSON API takes its types as they are, never coerced."""
    kinds_of = _field_kinds(model)
    for name, value in fields.items():
        if name not in kinds_of:
            continue  # unknown fields: refused by the model itself
        kinds, item_kinds = kinds_of[name]
        values = [value]
        if isinstance(value, list) and item_kinds is not None:
            kinds, values = item_kinds, value
        if "any" in kinds:
            continue
        for v in values:
            if isinstance(v, bool) and "boolean" not in kinds:
                raise Refused(422, f"{name}: expected {'/'.join(sorted(kinds - {'null'}))}, got {json.dumps(v)}", name)
            if isinstance(v, str) and "string" not in kinds and kinds & {"number", "integer"}:
                raise Refused(422, f"{name}: expected a number, got the string {json.dumps(v)[:40]}", name)


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """A hash of kvhit's own source files: a persisted answer is served only to the very code that computed it (the
    version number alone does not change between commits — a stale answer missing newer fields was served)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _digest(command: str, fields: dict):
    """The input hash of a request (its uploads' bytes are added by the caller); with kvhit's version and a hash of
    its source, so a persisted answer of other kvhit code is never served."""
    from kvhit import __version__

    digest = hashlib.sha256()
    digest.update(f"{__version__}\0{_code_fingerprint()}\0{command}".encode())
    digest.update(json.dumps(fields, sort_keys=True, default=str).encode())
    return digest


#: The planner page's first question (``app.js``: ShareGPT, vLLM ≥ 0.24, the default grid): answered at start-up
#: with ``warm`` so the first chart is a cache hit. The curve does not depend on the model (the GiB axis is drawn
#: from /api/kv), so one answer per block size serves every model.
FIRST_CHART = {"n_min": 100, "n_max": 100000, "points": 200, "policies": ["vllm"], "sharegpt": True}


def _clean(msg: str, rename: dict[str, str]) -> str:
    for tmp, name in rename.items():
        msg = msg.replace(tmp, name)
    return msg


def _warm_up() -> None:
    from kvhit.service.registry import run

    scm = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}
    with contextlib.suppress(Exception):
        run("estimate", {"N": [100, 1000], **scm})
        run("plan", {"engine": "paper", "kv_gb": 40, "target": 0.3, **scm})
        run("planner", {"N": [100, 1000], "kv_gb": 40, "target": 0.3, **scm})


def create_app(
    workers: int = 2,
    max_body: int = MAX_BODY_BYTES,
    max_upload: int = MAX_UPLOAD_BYTES,
    warm: bool = False,
    persist: Path | None = None,
    api_workers: int = 0,
) -> FastAPI:
    """The app: ``/`` the planner page, ``/api/...`` the JSON API, ``/docs`` its OpenAPI documentation;
    ``warm``: answer a small estimate and plan in the background at start-up (imports, first compilations) and
    queue the page's first chart; ``persist``: a directory keeping the answers on the bundled workload across
    restarts (``kvhit serve``: the kvhit cache directory); ``api_workers``: processes answering the synchronous
    commands (estimate, kv, plan's closed form) in parallel (:class:`kvhit.web.pool.ApiPool`), each warmed at
    start-up — until they are, and with 0, those answers run in this process's thread pool (one interpreter:
    concurrent requests queue on its lock). ``GET /api/health`` says when the start-up work is done and which
    processes answered."""
    from kvhit.web.pool import ApiPool

    jobs = JobManager(workers=workers, persist=persist)
    apipool = ApiPool(api_workers) if api_workers > 0 else None
    warmed = threading.Event()  # the start-up work (warm-up answers, the first chart's job) is done
    here: collections.Counter[int] = collections.Counter()  # answers given in this process (api_workers 0)

    def warm_up(first_chart) -> None:
        _warm_up()
        while first_chart is not None and first_chart.status in ("queued", "running"):
            time.sleep(0.1)
        warmed.set()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if apipool is not None:
            apipool.start()
        if warm:  # imports and first compilations off the first user's request
            first_chart = None
            with contextlib.suppress(Exception):
                first_chart = jobs.submit("curve", dict(FIRST_CHART), _digest("curve", FIRST_CHART).hexdigest())
            threading.Thread(target=warm_up, args=(first_chart,), daemon=True).start()
        else:
            warmed.set()
        yield
        jobs.shutdown()
        if apipool is not None:
            apipool.close()

    app = FastAPI(
        title="kvhit",
        summary="Predict, simulate and plan KV-cache hit ratios (the kvhit service layer over HTTP).",
        lifespan=lifespan,
    )
    app.state.jobs = jobs
    sync_cache: dict[str, Any] = {}

    def error(status: int, detail: str, field: str | None = None) -> JSONResponse:
        return JSONResponse({"detail": detail, "field": field}, status_code=status)

    async def handle(request: Request, command: str) -> Response:
        model, _ = COMMANDS[command]
        try:
            fields, rename, tmpdir, key = await _parse(request, command, max_upload)
        except Refused as e:
            return error(e.status, e.detail, e.field)
        from kvhit.service.registry import run

        # plan answers at once only with the paper's closed-form estimator (eq. 39); the engine-aware predictors
        # sample the workload (seconds to minutes), so they run as jobs like the simulations.
        as_job = command in JOB or (command == "plan" and (bool(tmpdir) or fields.get("engine") != "paper"))
        try:
            from kvhit.service import build

            build(model, **fields)  # types and ranges now, before queueing anything
        except InputError as e:
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
            msg = _clean(str(e), rename)
            return error(422, msg, _field_of(msg, model))
        if as_job:
            try:
                job = jobs.submit(command, fields, key, tmpdir=tmpdir, rename=rename)
            except QueueFull as e:
                return error(429, str(e))
            return JSONResponse(job.view(), status_code=202, headers={"Location": f"/api/jobs/{job.id}"})
        try:  # a synchronous answer: its uploads are deleted as soon as it is answered, on every path
            if key in sync_cache:
                return Response(sync_cache[key], media_type="application/json")
            out = None
            if apipool is not None and apipool.ready.is_set():
                from concurrent.futures.process import BrokenProcessPool

                try:
                    pool = apipool.current()
                    pid, out = await asyncio.wrap_future(apipool.submit(command, fields))
                    apipool.count(pid)
                except BrokenProcessPool:  # a worker died: answered here; the pool is replaced meanwhile
                    apipool.broken(pool)
            if out is None:
                out = await run_in_threadpool(lambda: run(command, fields).to_json_bytes())
                if apipool is not None:
                    apipool.count(os.getpid())
                else:
                    here[os.getpid()] += 1
        except InputError as e:
            msg = _clean(str(e), rename)
            return error(422, msg, _field_of(msg, model))
        finally:
            if tmpdir is not None:
                shutil.rmtree(tmpdir, ignore_errors=True)
        if len(sync_cache) >= 64:  # bounded: a 10,000-point estimate is ~2 MB of JSON
            sync_cache.pop(next(iter(sync_cache)))
        sync_cache[key] = out
        return Response(out, media_type="application/json")

    def doc(command: str) -> dict:
        model, fn = COMMANDS[command]
        schema = model.model_json_schema()
        props = {"request": {"type": "string", "description": f"JSON object of {model.__name__} fields"}}
        props |= {f: {"type": "string", "format": "binary"} for f in UPLOADS[command]}
        return {
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {"schema": schema},
                    "multipart/form-data": {"schema": {"type": "object", "properties": props}},
                },
            },
            "responses": {
                "200": {"description": "The answer (synchronous commands)"},
                "202": {"description": "A job: poll GET /api/jobs/{id}"},
                "413": {"description": "Body or upload too large"},
                "422": {"description": "Refused input: {detail: one line naming the field, field}"},
            },
        }

    def add(command: str) -> None:
        model, fn = COMMANDS[command]

        async def endpoint(request: Request) -> Response:
            return await handle(request, command)

        endpoint.__name__ = "post_" + command.replace("-", "_")
        summary = (fn.__doc__ or "").strip().split("\n")[0] or f"kvhit {command}"
        app.post(
            ROUTES[command],
            summary=f"{command}" + (" (job)" if command in JOB else ""),
            description=(model.__doc__ or summary) + f"\n\nFields: see the {model.__name__} schema.",
            openapi_extra=doc(command),
            tags=["jobs" if command in JOB else "answers"],
        )(endpoint)

    for c in COMMANDS:
        add(c)

    @app.get("/api/jobs/{job_id}", tags=["jobs"], summary="A job's status, progress and (when done) result")
    async def get_job(job_id: str):
        job = jobs.get(job_id)
        if job is None:
            return error(404, f"job {job_id}: no such job")
        return job.view()

    @app.delete("/api/jobs/{job_id}", tags=["jobs"], summary="Cancel a job")
    async def cancel_job(job_id: str):
        job = jobs.cancel(job_id)
        if job is None:
            return error(404, f"job {job_id}: no such job")
        return job.view()

    @app.get("/api/health", tags=["answers"], summary="Whether the start-up work is done and the API workers are warm")
    async def health():
        """``warm``: the start-up work is done (warm-up answers, the first chart's job); ``api_workers_ready``: the
        worker pool answers (its live ``api_worker_pids``); ``answered_by``: synchronous answers per process id
        (``server_pid``: answered in this process)."""
        out = {"server_pid": os.getpid(), "warm": warmed.is_set()}
        if apipool is None:
            return out | {
                "api_workers": 0,
                "api_workers_ready": False,
                "api_worker_pids": [],
                "answered_by": {str(p): n for p, n in here.items()},
            }
        return out | apipool.view()

    @app.get("/api/presets", tags=["answers"], summary="Model and accelerator presets")
    async def presets():
        return list_presets()

    @app.get("/", include_in_schema=False)
    async def index():
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return Response(status_code=204)

    @app.get("/static/plotly.min.js", include_in_schema=False)
    async def plotly_js():
        return FileResponse(_plotly_js(), media_type="text/javascript")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str):
        types = {".js": "text/javascript", ".css": "text/css"}
        f = STATIC / name
        if "/" in name or not name.endswith(tuple(types)) or not f.is_file():
            return error(404, f"{name}: not found")
        return Response(f.read_bytes(), media_type=types[Path(name).suffix])

    def limit_for(scope) -> tuple[int, str]:
        ctype = dict(scope.get("headers") or []).get(b"content-type", b"")
        if ctype.startswith(b"multipart/"):  # at most three files (trace, blocks trace, config) and the fields
            return max_upload * 3 + max_body, (
                f"request body: larger than the upload limit ({_size(max_upload)} per file, "
                f"{_size(max_body)} of fields)"
            )
        return max_body, f"request body: larger than the limit of {_size(max_body)}"

    app.add_middleware(_Limit, limit_for=limit_for)
    return app
