"""Output paths and atomic writes, one behaviour for every command.

Rule (all commands, all outputs): an output path is checked **before any computing begins**. A file output
(``-o x.parquet``, ``--plot PREFIX``, ``--fig PREFIX``) must not be an existing directory; an output directory
(``reproduce -o DIR``) must not be an existing file. Missing parent directories are created — at write time, so
a refused request leaves nothing behind — but the nearest existing ancestor must be a directory in which a file can
be created (probed by creating and removing one: ``os.access`` says yes to root under /proc).
Files are written through a temporary file in the same directory renamed into place (no half-written output),
the temporary is removed on any exception and on SIGTERM (:func:`install_signal_handlers` turns SIGTERM into
``SystemExit`` so ``finally``/``except BaseException`` clean-ups run), and the final file's mode respects the
process umask (``0o666 & ~umask``), unlike ``tempfile.mkstemp``'s 0600.

NOT handled: concurrent writers to one path (last rename wins) and network file systems without atomic rename.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from kvhit.service.errors import InputError

__all__ = [
    "check_output_file",
    "check_output_dir",
    "atomic_write",
    "atomic_write_text",
    "umask_mode",
    "install_signal_handlers",
    "die_with_parent",
]


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    return q


def _probe(d: Path, p: Path, flag: str) -> None:
    """Create (and remove) a file in directory ``d``: ``os.access`` is always true for root, also under /proc or
    on a read-only mount, so writability is checked by writing, before any computing."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvhit-probe-", dir=d)
    except OSError as e:
        raise InputError(f"{flag}: {p}: cannot create a file in {d} ({e.strerror or e})") from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)


def _check_parent(p: Path, flag: str) -> None:
    anc = _nearest_existing(p.parent if str(p.parent) else Path("."))
    if not anc.is_dir():
        raise InputError(f"{flag}: {p}: {anc} is a file, not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise InputError(f"{flag}: {p}: directory {anc} is not writable")
    _probe(anc, p, flag)


def check_output_file(path: str | os.PathLike | None, flag: str, suffixes: tuple[str, ...] = ()) -> Path | None:
    """Check an output file path (or a PREFIX to which each of ``suffixes`` is appended) before computing."""
    if path is None:
        return None
    p = Path(path)
    if str(path).strip() == "":
        raise InputError(f"{flag}: empty path")
    targets = [p] if not suffixes else [p.with_name(p.name + s) for s in suffixes]
    for t in targets:
        if t.is_dir():
            raise InputError(f"{flag}: {t} is an existing directory, expected a file path")
        if t.exists() and not os.access(t, os.W_OK):
            raise InputError(f"{flag}: {t} exists and is not writable")
        _check_parent(t, flag)
    return p


def check_output_dir(path: str | os.PathLike | None, flag: str) -> Path | None:
    """Check an output directory before computing: an existing file is refused; a missing one is created later."""
    if path is None:
        return None
    p = Path(path)
    if str(path).strip() == "":
        raise InputError(f"{flag}: empty path")
    if p.exists() and not p.is_dir():
        raise InputError(f"{flag}: {p} is an existing file, expected a directory")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError(f"{flag}: directory {p} is not writable")
        _probe(p, p, flag)
    else:
        _check_parent(p, flag)
    return p


def umask_mode(base: int = 0o666) -> int:
    """``base`` with the process umask applied (read without changing it for other threads for long)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it into place (mode from umask).

    The temporary is removed on any exception, KeyboardInterrupt and (with :func:`install_signal_handlers`)
    SIGTERM; parent directories are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file renamed into place; nothing half-written on any
    error. Returns the path."""

    def w(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    return atomic_write(path, w)


def _sigterm(signum, frame):  # pragma: no cover - exercised by a subprocess test
    raise SystemExit(128 + signum)


_FORK = threading.local()  # per forking thread: whether _before_fork blocked SIGTERM (the child inherits it)


def _before_fork() -> None:
    """In the forking thread, while :func:`_sigterm` is installed: block SIGTERM across the fork, so that the child
    starts with it blocked and no SIGTERM can run :func:`_sigterm` in the child before :func:`_child_default_sigterm`
    has reset it (a pool terminated just after forking a worker sends exactly that SIGTERM)."""
    _FORK.blocked = False
    if signal.getsignal(signal.SIGTERM) is _sigterm:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        _FORK.blocked = signal.SIGTERM not in old


def _parent_after_fork() -> None:
    """The forking thread's signal mask as it was before :func:`_before_fork`."""
    if getattr(_FORK, "blocked", False):
        _FORK.blocked = False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _child_default_sigterm() -> None:
    """In a process forked from one that holds :func:`_sigterm`: SIGTERM back to its default action (death), then
    unblocked — a SIGTERM that arrived since the fork is delivered now and ends the child."""
    if signal.getsignal(signal.SIGTERM) is _sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if getattr(_FORK, "blocked", False):
        _FORK.blocked = False
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


_AT_FORK = [False]


def install_signal_handlers() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in the main thread so temporaries are cleaned up on the way out.

    A process *forked* from this one (the worker pools of ``sweep -j``, ``reproduce -j``, ShareGPT tokenisation)
    gets SIGTERM's default action back (``os.register_at_fork``, once per process): ``multiprocessing`` stops its
    workers with SIGTERM (``Pool.terminate``, called by ``with Pool(...)``; ``ProcessPoolExecutor`` on a broken
    pool) and expects them to die at once, whereas a worker that raises ``SystemExit`` inside the pool's shared
    queue lock can leave the pool hung for good — seen in a ``make test`` run (2026-12-03) and reproduced: a fork
    ``Pool`` of 2 used in a loop under this handler hangs within 78–88 pools, and finishes 300 in 2.8 s with the
    reset (``tests/test_procs.py``). SIGTERM is blocked in the forking thread across the fork and unblocked in the
    child only after the reset, so a SIGTERM sent between the fork and the reset (a pool terminated right after it
    forked a worker; seen once in a loaded ``make test``, 2026-12-03) kills the child instead of running
    :func:`_sigterm` inside the at-fork hook, where its ``SystemExit`` was ignored and the worker lived on. A
    handler the child installs itself, or another one than :func:`_sigterm`, is left alone; spawned processes start
    with default handlers anyway."""
    try:
        signal.signal(signal.SIGTERM, _sigterm)
    except ValueError:  # pragma: no cover - not the main thread
        pass
    if not _AT_FORK[0]:
        os.register_at_fork(
            before=_before_fork, after_in_parent=_parent_after_fork, after_in_child=_child_default_sigterm
        )
        _AT_FORK[0] = True


def die_with_parent() -> None:
    """Linux: this (worker) process gets SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), so a killed driver or
    server leaves no worker behind; elsewhere a no-op. Called first thing in a worker process. Linux sends the
    signal when the *thread* that started this process ends, not only its process: start such workers from a thread
    that outlives them (the main thread, or an owner thread as in :mod:`kvhit.web.pool`) — a worker started from a
    short-lived thread is killed when that thread returns."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # pragma: no cover - no prctl
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
