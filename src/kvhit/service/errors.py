"""The one error type of the service layer: bad input, said in one line.

Invariant: every refusal a front end shows is an :class:`InputError` whose message is a single line that names
the file / record / flag / field at fault. The CLI maps it to one stderr line and exit status 2; the planned web
API maps it to HTTP 422. Library exceptions that mean "bad input" (``SpecError``, ``TraceError``,
``ProductionTraceError``, ``HardwareError``, ``PlanError``, …, all ``ValueError`` subclasses; missing or
unreadable files; undecodable bytes) are translated at the service boundary by :func:`translating`.

NOT handled here: programming errors (``TypeError``, ``AssertionError``, …) stay tracebacks — they are bugs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["InputError", "one_line", "translating"]


class InputError(ValueError):
    """A request the service refuses; ``str(e)`` is one line naming the file/record/flag/field."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def one_line(message: str) -> str:
    """Collapse a (possibly multi-line) message to one line."""
    parts = [p.strip() for p in str(message).splitlines() if p.strip()]
    return "; ".join(parts) if parts else "invalid input"


@contextlib.contextmanager
def translating(where: str = "") -> Iterator[None]:
    """Re-raise library "bad input" exceptions as :class:`InputError` (prefixed with ``where`` when the library's
    message does not already name it)."""
    try:
        yield
    except InputError:
        raise
    except UnicodeDecodeError as e:
        raise InputError(f"{where + ': ' if where else ''}not UTF-8 text (byte {e.start}: {e.reason})") from None
    except FileNotFoundError as e:
        raise InputError(f"{e.filename or where}: no such file") from None
    except IsADirectoryError as e:
        raise InputError(f"{e.filename or where}: is a directory, expected a file") from None
    except PermissionError as e:
        raise InputError(f"{e.filename or where}: permission denied") from None
    except OverflowError as e:
        raise InputError(f"{where + ': ' if where else ''}a value is too large ({e})") from None
    except MemoryError:
        raise InputError(f"{where + ': ' if where else ''}not enough memory for this request") from None
    except (ValueError, KeyError) as e:
        msg = str(e) if not isinstance(e, KeyError) else f"missing field {e}"
        msg = msg.replace("pass block_size=", "pass --block-size")  # the library's argument is the CLI's flag
        if where and where not in msg:
            flag, _, path = where.partition(" ")
            named = flag.startswith("--") or flag.isupper()  # a flag, or a positional argument's name ("PATH")
            if named and path and msg.startswith(path):  # the path once: "--flag PATH: line 3: …"
                msg = f"{flag} {msg}"
            else:
                msg = f"{where}: {msg}"
        raise InputError(msg) from None
