"""A model directory's tokenizer and chat template: a request's messages → the token ids an engine would see.

Invariant. Every request becomes the token ids an engine would see: its messages (and tools) are
rendered by the model directory's Jinja chat template exactly as ``transformers``' ``apply_chat_template``
renders them (same sandboxed Jinja environment, ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, the
``tojson``/``raise_exception``/``strftime_now`` helpers, the tokenizer's special tokens as template variables,
messages with ``None`` values dropped, ``add_generation_prompt=True``) and encoded by the directory's
``tokenizer.json`` with ``add_special_tokens=False`` (the template writes the BOS token itself).

Speed. The text between occurrences of the tokenizer's plain added tokens (``lstrip``/``rstrip``/
``single_word``/``normalized`` all false — the tokenizer splits its input at those first and encodes each
piece on its own) is encoded once per distinct piece and memoised; the first piece of a prompt is encoded in
its own context (a ``Metaspace`` pre-tokenizer treats the start of the input specially). A deterministic
sample of prompts is also encoded whole; if any differs, every prompt is encoded whole
(``kvhit.workload.chat.ChatTraceReport.piece_memo`` says which was used).

NOT modelled here: per-request ``chat_template_kwargs`` (e.g. ``enable_thinking``: the template's default is
used), slow-only tokenizers (a ``tokenizer.json`` is needed), and which request continues which
(:mod:`kvhit.workload.chat_thread`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from kvhit.workload.chat_log import ChatError

__all__ = ["ChatModel", "load_chat_model", "render_prompt", "tokenize_requests"]


SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
#: every how-many-th prompt the piece memo is checked against a whole-text encoding (plus the first 32)
CHECK_EVERY = 512


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
