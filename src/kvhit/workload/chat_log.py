"""Chat logs read into requests: request logs (OpenAI, Anthropic) and conversation files, as messages.

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

Timestamps are read from the keys of :data:`TIME_KEYS` (seconds, milliseconds or microseconds since the epoch,
told apart by magnitude, or ISO 8601) and conversation ids from :data:`CONV_KEYS` (or a record of a conversation
file); turning them into arrival times and trace conversations is :mod:`kvhit.workload.chat`'s.

Invariant: :func:`read_chat_log` keeps the requests in file order, each with the line (or record) it came from;
every malformed record is refused with :class:`ChatError`, one line naming the file and line.

NOT modelled here: rendering or tokenizing (:mod:`kvhit.workload.chat_model`), multimodal content (a non-text
part is refused), ``continue_final_message``, ``documents`` (RAG) inputs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["ChatError", "ChatRequest", "ChatLog", "read_chat_log", "TIME_KEYS", "CONV_KEYS"]


TIME_KEYS = ("timestamp", "created", "created_at", "time", "request_time", "arrival_time")
CONV_KEYS = ("conversation_id", "session_id", "thread_id")
USER_ROLES = {"user": "user", "human": "user"}
ASSISTANT_ROLES = {"assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant"}
ASSISTANT_ROLES |= {"bing": "assistant", "model": "assistant"}
OTHER_ROLES = {"system": "system", "developer": "system", "tool": "tool", "function": "tool", "ipython": "tool"}
ROLES = USER_ROLES | ASSISTANT_ROLES | OTHER_ROLES


class ChatError(ValueError):
    """Bad chat-log input or model directory; the message is one line naming the file (and line) at fault."""


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
