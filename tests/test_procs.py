"""A process forked from one holding the command line's SIGTERM handler (SIGTERM → SystemExit,
kvhit.service.io.install_signal_handlers) takes SIGTERM's default action again: pool workers that inherited the
handler made ``with Pool(...)`` hang at its terminate (seen in a ``make test`` run; install_signal_handlers'
docstring)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from kvhit.service.io import _sigterm, install_signal_handlers

pytestmark = pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs the fork start method")


def _handler_is_default(_):
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def _other(signum, frame):  # a handler kvhit did not install
    pass


@pytest.fixture
def restore_sigterm():
    old = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, old)


def test_forked_pool_workers_get_the_default_action(restore_sigterm):
    install_signal_handlers()
    install_signal_handlers()  # twice: the fork hook is registered once (a second would be harmless but is not added)
    assert signal.getsignal(signal.SIGTERM) is _sigterm
    with mp.get_context("fork").Pool(2) as pool:
        assert pool.map(_handler_is_default, range(4)) == [True] * 4
    assert signal.getsignal(signal.SIGTERM) is _sigterm  # the owner's handler is untouched


def test_a_handler_kvhit_did_not_install_is_inherited_as_is(restore_sigterm):
    install_signal_handlers()
    signal.signal(signal.SIGTERM, _other)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, b"1" if signal.getsignal(signal.SIGTERM) is _other else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"


def test_pools_under_the_cli_handler_do_not_hang():
    """300 fork pools under the command line's handler, each stopped by ``with`` (SIGTERM), finish (without the
    reset they hung within ≈ 100 pools)."""
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        from kvhit.service.io import install_signal_handlers
        install_signal_handlers()
        ctx = mp.get_context("fork")
        for _ in range(300):
            with ctx.Pool(2) as pool:
                pool.map(abs, range(50))
        print("done")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr


def test_a_sigterm_between_fork_and_reset_kills_the_child():
    """The race behind a hang seen once in a loaded ``make test``: a pool that terminates right after forking a
    worker sends SIGTERM before the child's at-fork reset has run. Forced here: an at-fork hook registered *before*
    kvhit's (so it runs first in the child) sends the child SIGTERM. The child must die by SIGTERM; without the
    blocked mask, kvhit's handler ran inside the hook, its SystemExit was ignored and the child lived on (exit 7)."""
    code = textwrap.dedent(
        """
        import os, signal, sys
        os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
        from kvhit.service.io import install_signal_handlers
        install_signal_handlers()
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, status = os.waitpid(pid, 0)
        ok = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        # the parent's mask is as before the fork: SIGTERM not blocked, and its handler still kvhit's
        ok = ok and signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        print("killed" if ok else f"status {status}")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "killed", (r.stdout, r.stderr)
