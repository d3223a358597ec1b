"""Chat logs → kvhit traces with a model's own tokenizer and chat template.

Invariant. Every request of the log becomes the token ids an engine would see: its messages (and tools) are
rendered by the model directory's Jinja chat template exactly as ``transformers``' ``apply_chat_template``
renders them (same sandboxed Jinja environment, ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, the
``tojson``/``raise_exception``/``strftime_now`` helpers, the tokenizer's special tokens as template variables,
messages with ``None`` values dropped, ``add_generation_prompt=True``) and encoded by the directory's
``tokenizer.json`` with ``add_special_tokens=False`` (the template writes the BOS token itself). Request j of a
trace conversation is the request whose prompt extends request j−1's prompt: ``new_tokens`` of turn j are the
ids after the previous turn's prompt, so the turn-j prompt is the concatenation of ``new_tokens`` of turns
1..j (the trace invariant of :mod:`kvhit.workload.trace`).

Log shapes (detected per file; :func:`read_chat_log`)
-----------------------------------------------------
* **Request logs, JSONL** (one request per line): OpenAI chat-completions requests (``messages``, optional
  ``tools``, ``model``) and Anthropic Messages requests (top-level ``system``, content blocks ``text``,
  ``tool_use``, ``tool_result``, ``thinking``; ``tools`` with ``input_schema``). A line may wrap the request
  under ``request`` or ``body`` with the timestamp beside it. Anthropic requests are converted to the OpenAI
  message form the templates read: ``system`` → a first system message, ``tool_use`` → assistant
  ``tool_calls``, ``tool_result`` → ``tool`` messages, ``thinking`` → ``reasoning_content``, tools →
  ``{"type": "function", "function": {name, description, parameters}}``.
* **Conversation files**: a JSON array of records (ShareGPT ``conversations`` with ``from``/``value``, vLLM's
  multi-turn benchmark files ``{"id", "messages"}``, LMSYS/WildChat ``conversation``) or JSONL of records with
  ``conversations``/``conversation``. Each record is one conversation; its k-th user message is request k,
  whose prompt is every message before it plus it, rendered with the generation prompt (the assistant
  messages of the record are the responses the next requests' prompts carry).

Content given as a list of parts is joined: the ``text`` parts, separated by ``"\\n"`` (vLLM's rendering of
content parts for string-content templates); a non-text part (image, audio, document) is refused. Tool-call
``arguments`` given as a JSON string are parsed into an object (as vLLM does before templating).

Time and conversations
----------------------
Timestamps (``timestamp``, ``created``, ``created_at``, ``time``, ``request_time``, ``arrival_time``: seconds,
milliseconds or microseconds since the epoch, told apart by magnitude, or ISO 8601) become arrival times,
relative to the first request. A request log without any timestamp is spaced ``spacing`` seconds apart in
file order; a log where only some lines carry one is refused. A conversation file without per-message
timestamps starts each conversation at its record's timestamp (when every record has one) or at Poisson(``lam0``)
arrivals, with exponential(``gap``) gaps between turns, from ``numpy.random.default_rng(seed)``.

Threading. A request that names its conversation (``conversation_id``, ``session_id``, ``thread_id``,
``metadata.conversation_id``/``session_id``, or a conversation file's record) continues that conversation's
previous request when that request's prompt is a proper token prefix of its own. A request that names none
continues the earlier request whose prompt is its longest proper token prefix (what a prefix cache sees), if
that request has not been continued yet. Every other request starts a new trace conversation: a branch
(the prefix was continued already), a prompt that edits its history (e.g. a template that drops earlier
reasoning) and an exact repeat of an earlier prompt; :class:`ChatTraceReport` counts each kind. Sharing
between such conversations (a common system prompt, a regenerated answer) is still seen by the block
simulators, which identify blocks by chained hashes of the token ids.

Models. A log naming several models is refused unless ``model=`` selects one (the others are counted in the
report): one trace is one model's tokens.

Not modelled: multimodal content, ``continue_final_message``, ``documents`` (RAG) inputs, per-request
``chat_template_kwargs`` (e.g. ``enable_thinking``: the template's default is used), and the responses a
request log does not carry (a request log's trace has no ``response_tokens``).

Speed. The text between occurrences of the tokenizer's plain added tokens (``lstrip``/``rstrip``/
``single_word``/``normalized`` all false — the tokenizer splits its input at those first and encodes each
piece on its own) is encoded once per distinct piece and memoised; the first piece of a prompt is encoded in
its own context (a ``Metaspace`` pre-tokenizer treats the start of the input specially). A deterministic
sample of prompts is also encoded whole; if any differs, every prompt is encoded whole
(``ChatTraceReport.piece_memo`` says which was used).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from kvhit.workload.hashing import fmix64

__all__ = [
    "ChatError",
    "ChatModel",
    "ChatRequest",
    "ChatLog",
    "ChatTraceReport",
    "load_chat_model",
    "read_chat_log",
    "render_prompt",
    "tokenize_requests",
    "thread_requests",
    "build_chat_trace",
    "trace_from_prompts",
    "granule_hashes",
]

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TIME_KEYS = ("timestamp", "created", "created_at", "time", "request_time", "arrival_time")
CONV_KEYS = ("conversation_id", "session_id", "thread_id")
USER_ROLES = {"user": "user", "human": "user"}
ASSISTANT_ROLES = {"assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant"}
ASSISTANT_ROLES |= {"bing": "assistant", "model": "assistant"}
OTHER_ROLES = {"system": "system", "developer": "system", "tool": "tool", "function": "tool", "ipython": "tool"}
ROLES = USER_ROLES | ASSISTANT_ROLES | OTHER_ROLES
#: every how-many-th prompt the piece memo is checked against a whole-text encoding (plus the first 32)
CHECK_EVERY = 512


class ChatError(ValueError):
    """Bad chat-log input or model directory; the message is one line naming the file (and line) at fault."""


# ---------------------------------------------------------------------------------------------------------------
# the model directory: tokenizer.json + chat template
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ChatModel:
    """A local model directory's tokenizer and chat template (see :func:`load_chat_model`)."""

    path: str
    tokenizer: Any  # tokenizers.Tokenizer
    template: str
    tool_template: str | None
    special_tokens: dict[str, str]
    split_tokens: list[str]
    fingerprint: str
    _compiled: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return Path(self.path).name


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def load_chat_model(path: str | Path) -> ChatModel:
    """Read ``tokenizer.json`` and the chat template (``chat_template.jinja``, else ``tokenizer_config.json``'s
    ``chat_template``: a string or a list of named templates, ``default`` and optionally ``tool_use``)."""
    from tokenizers import Tokenizer

    d = Path(path)
    if not d.is_dir():
        raise ChatError(f"{d}: not a directory (--model-dir takes a local model directory)")
    tj = d / "tokenizer.json"
    if not tj.is_file():
        raise ChatError(
            f"{d}: no tokenizer.json (a Hugging Face fast tokenizer is needed; slow-only models are not read)"
        )
    try:
        tok = Tokenizer.from_file(str(tj))
    except Exception as e:  # tokenizers raises a plain Exception on malformed files
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ChatError(f"{tj}: not a readable tokenizer ({why})") from None
    cfg: dict[str, Any] = {}
    cfg_path = d / "tokenizer_config.json"
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ChatError(f"{cfg_path}: not JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise ChatError(f"{cfg_path}: not a JSON object")
    template: str | None = None
    tool_template: str | None = None
    jinja_file = d / "chat_template.jinja"
    if jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    else:
        ct = cfg.get("chat_template")
        if isinstance(ct, str):
            template = ct
        elif isinstance(ct, list):
            named = {t.get("name"): t.get("template") for t in ct if isinstance(t, dict)}
            template = named.get("default")
            tool_template = named.get("tool_use")
    if not isinstance(template, str) or not template:
        raise ChatError(
            f"{d}: no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template)"
        )
    special = {k: t for k in SPECIAL_TOKEN_KEYS if (t := _token_text(cfg.get(k))) is not None}
    raw = json.loads(tj.read_text(encoding="utf-8")) if tj.stat().st_size < 64 << 20 else {}
    split = sorted(
        {
            a["content"]
            for a in raw.get("added_tokens", [])
            if a.get("content")
            and not (a.get("lstrip") or a.get("rstrip") or a.get("single_word") or a.get("normalized"))
        },
        key=lambda s: (-len(s), s),
    )
    h = hashlib.sha256()
    h.update(tj.read_bytes())
    h.update(template.encode())
    h.update((tool_template or "").encode())
    h.update(json.dumps(special, sort_keys=True).encode())
    return ChatModel(str(d), tok, template, tool_template, special, split, h.hexdigest()[:16])


def _compile(model: ChatModel, source: str) -> Any:
    c = model._compiled.get(source)
    if c is not None:
        return c
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class _Generation(jinja2.ext.Extension):  # transformers' {% generation %} tag, rendered as its body
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        c = env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatError(f"{model.path}: chat template does not compile (line {e.lineno}: {e.message})") from None
    model._compiled[source] = c
    return c


def render_prompt(
    model: ChatModel, messages: list[dict], tools: list[dict] | None = None, *, add_generation_prompt: bool = True
) -> str:
    """The prompt text ``apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False)``
    renders (raises :class:`jinja2.TemplateError` and friends; callers turn them into :class:`ChatError`)."""
    source = model.tool_template if (tools and model.tool_template) else model.template
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
    kw = dict(model.special_tokens)
    return _compile(model, source).render(
        messages=msgs, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **kw
    )


# ---------------------------------------------------------------------------------------------------------------
# reading logs
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ChatRequest:
    """One request of a log: where it came from, when, which model and conversation, and what it sends."""

    line: int
    time: float | None
    model: str | None
    conversation: str | None
    messages: list[dict]
    tools: list[dict] | None = None


@dataclass
class ChatLog:
    """The requests of a log file in file order, its shape (``requests`` or ``conversations``) and formats seen."""

    path: str
    shape: str
    requests: list[ChatRequest]
    formats: dict[str, int]


class _Bad(Exception):
    pass


def _time(v: Any) -> float:
    if isinstance(v, bool):
        raise _Bad(f"timestamp {v!r} is not a number or an ISO 8601 time")
    if isinstance(v, int | float):
        x = float(v)
        if not math.isfinite(x):
            raise _Bad(f"timestamp {v!r} is not finite")
        return x / 1e6 if abs(x) >= 1e14 else x / 1e3 if abs(x) >= 1e11 else x
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
        except ValueError:
            try:
                return _time(float(v))
            except ValueError:
                raise _Bad(f"timestamp {v!r} is not a number or an ISO 8601 time") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return dt.timestamp()
    raise _Bad(f"timestamp {v!r} is not a number or an ISO 8601 time")


def _find_time(*objs: Any) -> float | None:
    for o in objs:
        if isinstance(o, dict):
            for k in TIME_KEYS:
                if o.get(k) is not None:
                    return _time(o[k])
    return None


def _find_conv(*objs: Any) -> str | None:
    for o in objs:
        if not isinstance(o, dict):
            continue
        for k in CONV_KEYS:
            if o.get(k) is not None:
                return str(o[k])
        md = o.get("metadata")
        if isinstance(md, dict):
            for k in CONV_KEYS:
                if md.get(k) is not None:
                    return str(md[k])
    return None


def _parts_text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for p in content:
            if isinstance(p, str):
                texts.append(p)
            elif isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("text"), str):
                texts.append(p["text"])
            else:
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise _Bad(f"{where}: content part of type {kind!r} (only text is modelled)")
        return "\n".join(texts)
    raise _Bad(f"{where}: content must be a string or a list of parts, got {type(content).__name__}")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    if not isinstance(calls, list):
        raise _Bad(f"{where}: tool_calls must be a list")
    out = []
    for c in calls:
        if not isinstance(c, dict):
            raise _Bad(f"{where}: a tool call is not an object")
        c = dict(c)
        fn = c.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                args = json.loads(fn["arguments"])
            except json.JSONDecodeError:
                args = None
            if isinstance(args, dict):
                c["function"] = dict(fn, arguments=args)
        out.append(c)
    return out


def _openai_messages(msgs: Any) -> list[dict]:
    if not isinstance(msgs, list) or not msgs:
        raise _Bad("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(msgs):
        where = f"message {i}"
        if not isinstance(m, dict):
            raise _Bad(f"{where} is not an object")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _Bad(f"{where}: unknown role {role!r}")
        mm = dict(m)
        mm["role"] = ROLES[role]
        mm["content"] = _parts_text(m.get("content"), where)
        if m.get("tool_calls") is not None:
            mm["tool_calls"] = _tool_calls(m["tool_calls"], where)
        elif mm["content"] is None:
            raise _Bad(f"{where}: no content")
        out.append(mm)
    return out


def _is_anthropic(req: dict) -> bool:
    if "system" in req or "anthropic_version" in req:
        return True
    tools = req.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return True
    for m in req.get("messages") or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list) and any(
            isinstance(p, dict) and p.get("type") in ("tool_use", "tool_result", "thinking") for p in c
        ):
            return True
    return False


def _anthropic_messages(req: dict) -> tuple[list[dict], list[dict] | None]:
    out: list[dict] = []
    system = req.get("system")
    if system is not None:
        out.append({"role": "system", "content": _parts_text(system, "system")})
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _Bad("'messages' must be a non-empty list")
    for i, m in enumerate(msgs):
        where = f"message {i}"
        if not isinstance(m, dict):
            raise _Bad(f"{where} is not an object")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise _Bad(f"{where}: unknown role {role!r} (Anthropic messages are user or assistant)")
        c = m.get("content")
        if isinstance(c, str):
            out.append({"role": role, "content": c})
            continue
        if not isinstance(c, list):
            raise _Bad(f"{where}: content must be a string or a list of blocks")
        texts: list[str] = []
        calls: list[dict] = []
        thinking: list[str] = []
        for p in c:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "text" and isinstance(p.get("text"), str):
                texts.append(p["text"])
            elif kind == "thinking" and isinstance(p.get("thinking"), str):
                thinking.append(p["thinking"])
            elif kind == "tool_use" and role == "assistant":
                fn = {"name": p.get("name"), "arguments": p.get("input", {})}
                calls.append({"id": p.get("id"), "type": "function", "function": fn})
            elif kind == "tool_result" and role == "user":
                if texts:
                    out.append({"role": "user", "content": "\n".join(texts)})
                    texts = []
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": p.get("tool_use_id"),
                        "content": _parts_text(p.get("content", ""), f"{where} tool_result"),
                    }
                )
            else:
                raise _Bad(f"{where}: content block of type {kind!r} (only text, thinking, tool_use, tool_result)")
        if texts or calls or thinking or not out or out[-1]["role"] != "tool":
            mm: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
            if calls:
                mm["tool_calls"] = calls
            if thinking:
                mm["reasoning_content"] = "\n".join(thinking)
            if texts or calls or thinking:
                out.append(mm)
    tools = req.get("tools")
    conv_tools = None
    if tools is not None:
        if not isinstance(tools, list):
            raise _Bad("'tools' must be a list")
        conv_tools = []
        for t in tools:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise _Bad("a tool has no name")
            fn = {"name": t["name"], "description": t.get("description", ""), "parameters": t.get("input_schema", {})}
            conv_tools.append({"type": "function", "function": fn})
    return out, conv_tools


def _request(obj: Any, line: int) -> tuple[ChatRequest, str]:
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    req = obj
    for k in ("request", "body"):
        if isinstance(obj.get(k), dict) and "messages" in obj[k]:
            req = obj[k]
            break
    if "messages" not in req:
        raise _Bad("no 'messages' (not an OpenAI or Anthropic request)")
    if not isinstance(req["messages"], list) or not req["messages"]:
        raise _Bad("'messages' must be a non-empty list")
    model = req.get("model", obj.get("model"))
    if _is_anthropic(req):
        msgs, tools = _anthropic_messages(req)
        fmt = "anthropic"
    else:
        msgs = _openai_messages(req["messages"])
        tools = req.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise _Bad("'tools' must be a list")
        fmt = "openai"
    t = _find_time(obj, req)
    conv = _find_conv(obj, req)
    return ChatRequest(line, t, str(model) if model is not None else None, conv, msgs, tools or None), fmt


def _conversation(obj: Any, line: int, index: int) -> tuple[list[ChatRequest], str]:
    if not isinstance(obj, dict):
        raise _Bad("not a JSON object")
    shapes = {"conversations": "sharegpt", "conversation": "lmsys", "messages": "vllm-multi-turn"}
    key = next((k for k in shapes if k in obj), None)
    if key is None:
        raise _Bad("no 'conversations', 'conversation' or 'messages' list")
    fmt, msgs = shapes[key], obj[key]
    if not isinstance(msgs, list) or not msgs:
        raise _Bad(f"'{key}' must be a non-empty list")
    norm: list[dict] = []
    times: list[Any] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _Bad(f"message {i} is not an object")
        role = m.get("from", m.get("role"))
        if not isinstance(role, str) or role not in ROLES:
            raise _Bad(f"message {i}: unknown role {role!r}")
        text = m.get("value", m.get("content"))
        text = _parts_text(text, f"message {i}")
        if text is None:
            raise _Bad(f"message {i}: no text ('value'/'content')")
        norm.append({"role": ROLES[role], "content": text})
        times.append(m.get("timestamp"))
    conv = obj.get("id", obj.get("conversation_id", obj.get("conversation_hash")))
    conv = f"{conv}" if conv is not None else f"record-{index}"
    model = obj.get("model")
    base = _find_time(obj)
    out = []
    for k, m in enumerate(norm):
        if m["role"] != "user":
            continue
        t = _time(times[k]) if times[k] is not None else None
        out.append(ChatRequest(line, t, str(model) if model is not None else None, conv, norm[: k + 1]))
    if not out:
        raise _Bad("no user message")
    if base is not None and out[0].time is None:
        out[0].time = base
    return out, fmt


def _json_array_records(text: str, path: Path) -> Iterator[tuple[int, Any]]:
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    line = 1 + text.count("\n", 0, i)
    n = len(text)
    ws = " \t\r\n"
    while True:
        while i < n and text[i] in ws:
            if text[i] == "\n":
                line += 1
            i += 1
        if i >= n:
            raise ChatError(f"{path}:{line}: the JSON array is not closed (truncated file?)")
        if text[i] == "]":
            return
        try:
            obj, j = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise ChatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        yield line, obj
        line += text.count("\n", i, j)
        i = j
        while i < n and text[i] in ws:
            if text[i] == "\n":
                line += 1
            i += 1
        if i < n and text[i] == ",":
            i += 1
        elif i < n and text[i] != "]":
            raise ChatError(f"{path}:{line}: expected ',' or ']' between records")


def read_chat_log(path: str | Path) -> ChatLog:
    """Read a chat log (see the module docstring for the shapes); raise :class:`ChatError` naming file and line."""
    p = Path(path)
    if not p.is_file():
        raise ChatError(f"{p}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ChatError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    stripped = text.lstrip()
    if not stripped:
        raise ChatError(f"{p}: empty file")
    formats: dict[str, int] = {}
    requests: list[ChatRequest] = []
    if stripped[0] == "[":
        shape = "conversations"
        for index, (line, obj) in enumerate(_json_array_records(text, p)):
            try:
                reqs, fmt = _conversation(obj, line, index)
            except _Bad as e:
                raise ChatError(f"{p}:{line}: record {index}: {e}") from None
            requests.extend(reqs)
            formats[fmt] = formats.get(fmt, 0) + 1
    else:
        shape = ""
        for line, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ChatError(f"{p}:{line}: not valid JSON ({e.msg})") from None
            kind = (
                "conversations"
                if isinstance(obj, dict) and ("conversations" in obj or "conversation" in obj)
                else "requests"
                if isinstance(obj, dict)
                and ("messages" in obj or any(isinstance(obj.get(k), dict) for k in ("request", "body")))
                else None
            )
            if kind is None:
                raise ChatError(
                    f"{p}:{line}: unknown log shape (expected an OpenAI/Anthropic request with 'messages' or a "
                    f"conversation record with 'conversations'/'conversation')"
                )
            if shape and kind != shape:
                raise ChatError(f"{p}:{line}: a {kind[:-1]} record in a file of {shape} (mixed log shapes)")
            shape = kind
            try:
                if kind == "requests":
                    r, fmt = _request(obj, line)
                    requests.append(r)
                else:
                    reqs, fmt = _conversation(obj, line, len(formats) and sum(formats.values()))
                    requests.extend(reqs)
            except _Bad as e:
                raise ChatError(f"{p}:{line}: {e}") from None
            formats[fmt] = formats.get(fmt, 0) + 1
    if not requests:
        raise ChatError(f"{p}: no records")
    return ChatLog(str(p), shape, requests, formats)


# ---------------------------------------------------------------------------------------------------------------
# rendering + tokenizing
# ---------------------------------------------------------------------------------------------------------------


def _render_all(model: ChatModel, log: ChatLog) -> list[str]:
    import jinja2

    texts = []
    for r in log.requests:
        try:
            texts.append(render_prompt(model, r.messages, r.tools))
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ChatError(f"{log.path}:{r.line}: the chat template of {model.path} fails to render ({msg})") from None
    return texts


def _encode_whole(tok: Any, texts: list[str]) -> list[np.ndarray]:
    out = []
    for k in range(0, len(texts), 256):
        enc = tok.encode_batch(texts[k : k + 256], add_special_tokens=False)
        out.extend(np.asarray(e.ids, dtype=np.int32) for e in enc)
    return out


def tokenize_requests(model: ChatModel, texts: list[str], *, memo: bool = True) -> tuple[list[np.ndarray], bool]:
    """Token ids of each prompt text (``add_special_tokens=False``); returns ``(ids, piece_memo_used)``."""
    tok = model.tokenizer
    if not memo or not model.split_tokens or not texts:
        return _encode_whole(tok, texts), False
    pat = re.compile("(" + "|".join(re.escape(s) for s in model.split_tokens) + ")")
    specials = set(model.split_tokens)
    special_ids = {s: tok.token_to_id(s) for s in specials}
    if any(v is None for v in special_ids.values()):
        return _encode_whole(tok, texts), False
    cache: dict[tuple[str, bool], np.ndarray] = {}
    split = [pat.split(t) for t in texts]
    todo: dict[tuple[str, bool], None] = {}
    for parts in split:
        for k, piece in enumerate(parts):
            if piece and (k % 2 == 0):
                key = (piece, k == 0)
                if key not in cache and key not in todo:
                    todo[key] = None
    keys = list(todo)
    firsts = [k for k in keys if k[1]]
    rest = [k for k in keys if not k[1]]
    for group in (firsts, rest):
        enc = _encode_whole(tok, [k[0] for k in group])
        cache.update(zip(group, enc, strict=True))
    empty = np.zeros(0, np.int32)
    out = []
    for parts in split:
        seg = []
        for k, piece in enumerate(parts):
            if not piece:
                continue
            if k % 2:
                seg.append(np.asarray([special_ids[piece]], np.int32))
            else:
                seg.append(cache[(piece, k == 0)])
        out.append(np.concatenate(seg) if seg else empty)
    check = sorted(set(range(min(32, len(texts)))) | set(range(0, len(texts), CHECK_EVERY)))
    whole = _encode_whole(tok, [texts[i] for i in check])
    if any(not np.array_equal(out[i], w) for i, w in zip(check, whole, strict=True)):
        return _encode_whole(tok, texts), False
    return out, True


# ---------------------------------------------------------------------------------------------------------------
# threading
# ---------------------------------------------------------------------------------------------------------------


_SEED = np.uint64(0x6B76686974636861)  # "kvhitcha"
_MUL = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True)
def _granule_kernel(tok_off, tokens, g, out_off):  # pragma: no cover - compiled
    n = tok_off.shape[0] - 1
    out = np.empty(out_off[n], np.int64)
    for r in range(n):
        h = _SEED
        s = tok_off[r]
        for i in range(out_off[r + 1] - out_off[r]):
            for j in range(s + i * g, s + (i + 1) * g):
                h = fmix64(h * _MUL + fmix64(np.uint64(tokens[j]) ^ _MUL))
            out[out_off[r] + i] = np.int64(h)
    return out


def granule_hashes(ids: list[np.ndarray], g: int) -> tuple[np.ndarray, np.ndarray]:
    """Chained hashes of every full ``g``-token piece of every prompt: ``(offsets int64[n+1], hashes int64[…])``;
    piece i of prompt r hashes the whole prefix ``r[: (i+1)·g]`` (equal prefixes ↦ equal hashes; different ones
    collide with probability ~2⁻⁶⁴ per pair). Internal to threading: the engines' block hashes are
    :mod:`kvhit.sim.vllm.blockids`'."""
    lens = np.array([q.size for q in ids], np.int64)
    tok_off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64)
    out_off = np.concatenate([[0], np.cumsum(lens // g)]).astype(np.int64)
    return out_off, _granule_kernel(tok_off, flat, np.int64(g), out_off)


@dataclass
class Threads:
    """``parent[r]``: the request that request r continues (−1: it starts a trace conversation); ``reason[r]``:
    ``"id"``/``"prefix"`` (continues), ``"new"``, ``"branch"``, ``"edited"``, ``"repeat"`` (starts one)."""

    parent: np.ndarray
    reason: list[str]


def thread_requests(ids: list[np.ndarray], conv: list[str | None], *, granule: int = 16) -> Threads:
    """Thread requests given in arrival order (see the module docstring): a request with a conversation id
    continues that conversation's latest request when it is a proper token prefix; one without continues the
    earlier, not yet continued request whose prompt is its longest proper token prefix.

    The search walks a hash trie of ``granule``-token pieces (:func:`granule_hashes`): O(log(prompt / granule))
    set probes per request to find the deepest shared piece, then the candidates ending below it.
    """
    n = len(ids)
    g = int(granule)
    off, hs = granule_hashes(ids, g)
    parent = np.full(n, -1, np.int64)
    reason = ["new"] * n
    continued = np.zeros(n, bool)
    seen: set[int] = set()  # chained hashes of every g-piece prefix of earlier prompts
    ends: dict[int, list[int]] = {}  # chained hash of an earlier prompt's full pieces -> the requests ending there
    ROOT = 0
    last_of_conv: dict[str, int] = {}
    for r in range(n):
        q = ids[r]
        h = hs[off[r] : off[r + 1]]
        c = conv[r]
        if c is not None and c in last_of_conv:
            p = last_of_conv[c]
            P = ids[p]
            if P.size < q.size and np.array_equal(q[: P.size], P):
                parent[r], reason[r] = p, "id"
            else:
                reason[r] = "repeat" if np.array_equal(P, q) else "edited"
        elif c is None:
            # longest k with the first k pieces present (monotone): binary search
            lo, hi = 0, h.size
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if int(h[mid - 1]) in seen:
                    lo = mid
                else:
                    hi = mid - 1
            best, best_len, exact = -1, -1, False
            for k in range(lo, -1, -1):  # nodes deeper in the trie hold longer prompts: the first match is longest
                cands = ends.get(ROOT if k == 0 else int(h[k - 1]))
                if not cands:
                    continue
                for p in reversed(cands):  # latest first
                    P = ids[p]
                    if P.size > q.size or not np.array_equal(q[k * g : P.size], P[k * g :]):
                        continue
                    if P.size == q.size:
                        exact = True
                    elif P.size > best_len or (P.size == best_len and continued[best] and not continued[p]):
                        best, best_len = p, P.size
                if best >= 0:
                    break
            if best >= 0:
                if continued[best]:
                    reason[r] = "branch"
                else:
                    parent[r], reason[r] = best, "prefix"
            elif exact:
                reason[r] = "repeat"
        if parent[r] >= 0:
            continued[parent[r]] = True
        if c is not None:
            last_of_conv[c] = r
        seen.update(h.tolist())
        kq = q.size // g
        node = ROOT if kq == 0 else int(h[kq - 1])
        ends.setdefault(node, []).append(r)
    return Threads(parent, reason)


# ---------------------------------------------------------------------------------------------------------------
# the trace
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ChatTraceReport:
    """What :func:`build_chat_trace` read and made."""

    source: str
    shape: str
    formats: dict[str, int]
    model_dir: str
    tokenizer_fingerprint: str
    model: str | None
    n_requests: int
    n_other_models: dict[str, int]
    n_conversations: int
    threading: dict[str, int]
    prompt_tokens: int
    timestamps: str
    piece_memo: bool
    seconds: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _arrivals(log: ChatLog, reqs: list[ChatRequest], spacing: float, lam0: float, gap: float, seed: int) -> tuple:
    have = [r.time is not None for r in reqs]
    if all(have):
        t = np.array([r.time for r in reqs], np.float64)
        return t - t.min(), "log"
    if log.shape == "requests":
        if any(have):
            r = reqs[have.index(False)]
            raise ChatError(f"{log.path}:{r.line}: no timestamp, but other lines of the log carry one")
        return np.arange(len(reqs), dtype=np.float64) * float(spacing), f"file order, {spacing:g} s apart"
    # conversations: record timestamps (when every record has one) or Poisson conversation arrivals; exponential
    # gaps between turns
    rng = np.random.default_rng(seed)
    firsts = [i for i, r in enumerate(reqs) if i == 0 or r.conversation != reqs[i - 1].conversation]
    known = all(reqs[i].time is not None for i in firsts)
    t = np.zeros(len(reqs))
    start = 0.0
    for i, r in enumerate(reqs):
        if i == 0 or r.conversation != reqs[i - 1].conversation:
            if known:
                t[i] = float(r.time)  # type: ignore[arg-type]
            else:
                start += rng.exponential(1.0 / lam0)
                t[i] = start
        else:
            t[i] = t[i - 1] + rng.exponential(gap)
    if known:
        return t - t.min(), f"record timestamps, exponential gaps of mean {gap:g} s between turns, seed {seed}"
    return t, f"Poisson conversations at {lam0:g}/s, exponential gaps of mean {gap:g} s, seed {seed}"


def build_chat_trace(
    log_path: str | Path,
    model_dir: str | Path,
    *,
    block_size: int = 16,
    model: str | None = None,
    spacing: float = 1.0,
    lam0: float = 1.0,
    gap: float = 60.0,
    seed: int = 0,
    memo: bool = True,
):
    """Read a chat log, render and tokenize every request with the model directory, thread the requests and
    build the trace (token ids kept in ``new_tokens``). Returns ``(trace, report, ids, times)``: ``ids[r]`` the
    full prompt of trace row r and ``times`` its arrival (rows in trace order)."""
    import time as _t

    from kvhit.workload.blocks import BLOCK_RULE

    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ChatError(f"--block-size: expected a positive integer, got {block_size!r}")
    if not (spacing >= 0 and math.isfinite(spacing)):
        raise ChatError(f"--spacing: expected a finite number ≥ 0, got {spacing!r}")
    if not (lam0 > 0 and math.isfinite(lam0)) or not (gap >= 0 and math.isfinite(gap)):
        raise ChatError("--lam0 must be > 0 and --gap ≥ 0")
    secs: dict[str, float] = {}
    t0 = _t.perf_counter()
    cm = load_chat_model(model_dir)
    log = read_chat_log(log_path)
    secs["read"] = _t.perf_counter() - t0
    names: dict[str, int] = {}
    for r in log.requests:
        names[r.model or ""] = names.get(r.model or "", 0) + 1
    if model is None:
        named = sorted(k for k in names if k)
        if len(named) > 1:
            raise ChatError(
                f"{log.path}: requests for {len(named)} models ({', '.join(named[:4])}"
                f"{', …' if len(named) > 4 else ''}); choose one with --model (one trace is one model's tokens)"
            )
        keep = np.arange(len(log.requests))
        others: dict[str, int] = {}
    else:
        keep = np.array([i for i, r in enumerate(log.requests) if r.model == model], np.int64)
        others = {k or "(none)": v for k, v in names.items() if k != model}
        if not keep.size:
            raise ChatError(f"{log.path}: no request for model {model!r} (models: {', '.join(sorted(names))})")
    # arrivals from the whole log (a filtered request keeps its place on the log's time axis)
    times, tsource = _arrivals(log, log.requests, spacing, lam0, gap, seed)
    reqs = [log.requests[i] for i in keep]
    times = times[keep] - times[keep].min()
    order = np.argsort(times, kind="stable")
    reqs = [reqs[i] for i in order]
    times = times[order]
    t1 = _t.perf_counter()
    sub = ChatLog(log.path, log.shape, reqs, log.formats)
    texts = _render_all(cm, sub)
    secs["render"] = _t.perf_counter() - t1
    t1 = _t.perf_counter()
    ids, used_memo = tokenize_requests(cm, texts, memo=memo)
    del texts
    secs["tokenize"] = _t.perf_counter() - t1
    for r, q in zip(reqs, ids, strict=True):
        if q.size == 0:
            raise ChatError(f"{log.path}:{r.line}: the rendered prompt has no tokens")
    t1 = _t.perf_counter()
    th = thread_requests(ids, [r.conversation for r in reqs])
    n = len(reqs)
    counts: dict[str, int] = {}
    for x in th.reason:
        counts[x] = counts.get(x, 0) + 1
    secs["thread"] = _t.perf_counter() - t1
    meta = {
        "source": f"chat:{log.path}",
        "block_size": int(block_size),
        "block_rule": BLOCK_RULE,
        "tokenizer": f"{cm.path} (tokenizer.json, {cm.fingerprint})",
        "template": "chat_template of the model directory (apply_chat_template rendering, add_generation_prompt)",
        "model": model or next((k for k in names if k), None),
        "timestamps": tsource,
        "threading": counts,
    }
    tr, perm = trace_from_prompts(ids, times, th.parent, block_size, meta, where=log.path)
    full = [ids[i] for i in perm]
    C = tr.n_conversations
    rep = ChatTraceReport(
        source=log.path,
        shape=log.shape,
        formats=log.formats,
        model_dir=cm.path,
        tokenizer_fingerprint=cm.fingerprint,
        model=meta["model"],
        n_requests=n,
        n_other_models=others,
        n_conversations=C,
        threading=counts,
        prompt_tokens=int(sum(q.size for q in ids)),
        timestamps=tsource,
        piece_memo=used_memo,
        seconds=secs,
    )
    return tr, rep, full, times[perm]


def trace_from_prompts(
    ids: list[np.ndarray], times: np.ndarray, parent: np.ndarray, block_size: int, meta: dict, where: str = "trace"
):
    """The kvhit trace of requests given in arrival order with their full prompts ``ids`` and the request each
    continues (``parent``, −1 for a conversation's first turn; a parent's prompt must be a proper prefix).
    Returns ``(trace, perm)``: trace row i is request ``perm[i]``."""
    from kvhit.workload.blocks import block_accounting
    from kvhit.workload.trace import Trace

    n = len(ids)
    parent = np.asarray(parent, np.int64)
    times = np.asarray(times, np.float64)
    conv = np.full(n, -1, np.int64)
    turn = np.zeros(n, np.int64)
    C = 0
    for r in range(n):
        p = parent[r]
        if p < 0:
            conv[r], turn[r] = C, 1
            C += 1
        else:
            conv[r], turn[r] = conv[p], turn[p] + 1
    M = np.bincount(conv, minlength=C)[conv]
    plen = np.array([q.size for q in ids], np.int64)
    prev_len = np.where(parent >= 0, plen[np.maximum(parent, 0)], 0)
    new_tokens = [q[int(k) :] for q, k in zip(ids, prev_len, strict=True)]
    cm_order = np.lexsort((turn, conv))
    Mc = np.bincount(conv, minlength=C)
    acc = block_accounting(Mc, (plen - prev_len)[cm_order], np.zeros(n, np.int64), block_size)
    inv = np.empty(n, np.int64)
    inv[cm_order] = np.arange(n)
    conv_arrival = np.zeros(C)
    conv_arrival[conv[turn == 1]] = times[turn == 1]
    cols = {
        "conv": conv,
        "conv_arrival": conv_arrival[conv],
        "turn": turn,
        "time": times,
        "M": M,
        "Z": acc["Z"][inv],
        "R": acc["R"][inv],
        "prompt_tokens": plen - prev_len,
        "cum_tokens": plen,
        "R_full": plen // block_size,
        "R_phys": -(-plen // block_size),
    }
    tr = Trace.from_columns(cols, dict(meta, block_size=int(block_size)), {"new_tokens": new_tokens}, where=where)
    return tr, np.lexsort((turn, conv, times))
