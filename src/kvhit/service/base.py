"""Base request/response models and the shared validators of the service layer.

Invariant: a request object that exists is valid — types, ranges, finiteness (``inf``/``nan`` refused),
integers that are integers (``2275.5`` is refused, never truncated), mutually exclusive inputs, and the memory a
request would need are all checked when it is built, before any computing begins. A response object is plain
data that serializes to strict JSON (:meth:`Response.to_json`: non-finite floats become ``null``,
``allow_nan=False``). The CLI and the planned web API (issue 14) share exactly these objects.

NOT modelled here: the domain itself — service functions call the library (workload → theory/estimate | sim →
plan) and only assemble its answers.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, ClassVar, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticSerializationError

from kvhit.service.errors import InputError

R = TypeVar("R", bound="Request")

__all__ = [
    "Request",
    "Response",
    "build",
    "strict_json",
    "jsonable",
    "check_capacity_memory",
    "available_memory_bytes",
]


class Request(BaseModel):
    """Base of every request: unknown fields refused, ``inf``/``nan`` refused, ints never truncated.

    ``FLAGS`` maps a field to the CLI flag that sets it (default ``--field-name``) so that errors name what the
    user typed.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True, validate_default=True)
    FLAGS: ClassVar[dict[str, str]] = {}

    @classmethod
    def flag(cls, field: str) -> str:
        return cls.FLAGS.get(field, "--" + field.replace("_", "-"))


class Response(BaseModel):
    """Base of every response: plain data, strict JSON via :meth:`to_json`."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=False, ser_json_inf_nan="null")

    def to_jsonable(self) -> Any:
        return jsonable(self.model_dump(mode="python"))

    def to_json(self, indent: int | None = 2) -> str:
        return strict_json(self.to_jsonable(), indent=indent)

    def to_json_bytes(self) -> bytes:
        """Compact strict JSON as UTF-8 bytes, the same data as :meth:`to_jsonable` (the JSON API's answer):
        pydantic's own serializer writes it in one pass (non-finite floats as ``null``: ``ser_json_inf_nan``
        above) — no Python-object copy of the answer first. A response that reshapes its data
        (overrides :meth:`to_jsonable`) or holds a value pydantic cannot write (a numpy integer in an ``Any``
        field) takes the :func:`strict_json` path."""
        if type(self).to_jsonable is Response.to_jsonable:
            try:
                return self.model_dump_json().encode()
            except PydanticSerializationError:
                pass
        return json.dumps(self.to_jsonable(), allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()


def jsonable(o: Any) -> Any:
    """Plain JSON data: numpy scalars/arrays to Python, non-finite floats to ``None`` (JSON ``null``)."""
    t = type(o)  # the exact built-in types first (a curve is thousands of floats): no isinstance chain for them
    if t is float:
        return o if math.isfinite(o) else None
    if t is int or t is str or t is bool or o is None:
        return o
    if t is list or t is tuple:
        return [jsonable(v) for v in o]
    if t is dict:
        return {str(k): jsonable(v) for k, v in o.items()}
    return _jsonable_other(o)


def _jsonable_other(o: Any) -> Any:
    if isinstance(o, BaseModel):
        return jsonable(o.model_dump(mode="python"))
    if isinstance(o, dict):
        return {str(k): jsonable(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [jsonable(v) for v in o]
    if isinstance(o, np.ndarray):
        return [jsonable(v) for v in o.tolist()]
    if isinstance(o, bool | np.bool_):
        return bool(o)
    if isinstance(o, int | np.integer):
        return int(o)
    if isinstance(o, float | np.floating):
        x = float(o)
        return x if math.isfinite(x) else None
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    if o is None or isinstance(o, str):
        return o
    if hasattr(o, "to_dict"):
        return jsonable(o.to_dict())
    raise TypeError(f"not JSON-serializable: {type(o).__name__}")


def strict_json(o: Any, indent: int | None = 2) -> str:
    """Strict JSON (RFC 8259): ``null`` for undefined numbers, never ``NaN``/``Infinity``."""
    return json.dumps(jsonable(o), indent=indent, allow_nan=False, ensure_ascii=False)


def _describe(err: dict, model: type[Request]) -> str:
    loc = [str(x) for x in err.get("loc", ())]
    field = loc[0] if loc else ""
    where = model.flag(field) if field else model.__name__
    if len(loc) > 1:
        where += "[" + "][".join(loc[1:]) + "]"
    msg = err.get("msg", "invalid")
    for pre in ("Value error, ", "Assertion failed, "):
        if msg.startswith(pre):
            msg = msg[len(pre) :]
    got = err.get("input")
    missing = got is None and len(loc) == 1 and str(err.get("type", "")).endswith("_type")  # an option not given
    if err.get("type") == "missing" or missing or (err.get("type") == "too_short" and got in ([], (), "")):
        return f"{where}: required"
    if err.get("type") == "extra_forbidden":
        return f"{where}: unknown field"
    if isinstance(got, float | int | str) and not isinstance(got, bool) or isinstance(got, bool):
        return f"{where}: {msg[0].lower() + msg[1:]} (got {got!r})"
    return f"{where}: {msg[0].lower() + msg[1:]}"


def build(model: type[R], /, **values: Any) -> R:
    """Build and validate a request; the first violation becomes a one-line :class:`InputError` naming the flag."""
    try:
        return model(**values)
    except ValidationError as e:
        errs = e.errors(include_url=False)
        raise InputError(_describe(errs[0], model)) from None


# -- memory a request would need ----------------------------------------------------------------------------------


def available_memory_bytes() -> int:
    """Physical memory of this machine (bytes); the cap used to refuse requests before allocating."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 16 * 2**30


#: Bytes per capacity block that a request at capacity N needs: the block-pool simulator (``kvhit.sim.vllm.block``:
#: block table 4×int32, free-list links 2×int32, block hash int64 = 32 B) and the engine-aware estimator's
#: per-capacity tables (``kvhit.estimate.engine``: float64 grids over 0..N, ≈ 16 B) — the larger bounds both.
BLOCK_SIM_BYTES_PER_BLOCK = 32


def check_capacity_memory(N: int, flag: str, bytes_per_block: int = BLOCK_SIM_BYTES_PER_BLOCK) -> None:
    """Refuse a simulated capacity whose block pool would not fit in half of this machine's memory."""
    need = int(N) * bytes_per_block
    have = available_memory_bytes() // 2
    if need > have:
        raise InputError(
            f"{flag}: a capacity of {int(N):,} blocks needs {need / 2**30:,.1f} GiB of simulator memory; "
            f"at most {have // bytes_per_block:,} blocks fit in half of this machine's {2 * have / 2**30:,.1f} GiB"
        )
