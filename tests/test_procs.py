"""Forked pool workers take SIGTERM's default action again (kvhit._procs): the command line's handler
(SIGTERM → SystemExit, kvhit.service.io.install_signal_handlers) inherited by a pool worker made ``with Pool(...)``
hang at its terminate (seen in a ``make test`` run; reproduced in kvhit/_procs.py's docstring)."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest

from kvhit.service.io import _sigterm, install_signal_handlers

pytestmark = pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs the fork start method")


def _handler_is_default(_):
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def _sweep_init():
    from kvhit.sweep.backends import _worker_init

    _worker_init("p", {})  # install() is stubbed by the test (forked workers inherit the stub)


def _cache_init():
    from kvhit.workload.cache import _init_worker
    from kvhit.workload.tokenize import QWEN3_TEMPLATE

    _init_worker(pickle.dumps("tok"), QWEN3_TEMPLATE, False)


def _paper_init():
    from kvhit.experiments.paper import _init_pool_worker

    _init_pool_worker(None, None, ())


@pytest.fixture
def cli_handler():
    old = signal.getsignal(signal.SIGTERM)
    install_signal_handlers()
    assert signal.getsignal(signal.SIGTERM) is _sigterm
    yield
    signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("init", [None, _sweep_init, _cache_init, _paper_init])
def test_pool_workers_reset_sigterm(cli_handler, init, monkeypatch):
    """Each of kvhit's fork-pool initializers leaves the worker with the default SIGTERM action; without one the
    worker keeps the command line's handler (the control)."""
    import kvhit.sweep.backends as backends

    monkeypatch.setattr(backends, "install", lambda *a: None)
    with mp.get_context("fork").Pool(2, initializer=init) as pool:
        got = pool.map(_handler_is_default, range(4))
    assert got == [init is not None] * 4
    assert signal.getsignal(signal.SIGTERM) is _sigterm  # the owner's handler is untouched


def test_pools_under_the_cli_handler_do_not_hang():
    """300 fork pools under the command line's handler, each stopped by ``with`` (SIGTERM), finish (they hung
    within ≈ 100 pools before the reset)."""
    code = textwrap.dedent(
        """
        import multiprocessing as mp
        from kvhit._procs import default_sigterm
        from kvhit.service.io import install_signal_handlers
        install_signal_handlers()
        ctx = mp.get_context("fork")
        for _ in range(300):
            with ctx.Pool(2, initializer=default_sigterm) as pool:
                pool.map(abs, range(50))
        print("done")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
