"""The ``kvhit`` root command, loading each command's module only when that command runs or shows its help.

``kvhit --help`` is rendered from :data:`COMMANDS` (name → module(s) that register it, first paragraph of its
help) without importing a command module, the service layer, numpy or pydantic; ``kvhit <command> ...`` imports the
module(s) of that one command. Invariant: the root's options, the command names, their order and their help are
those of the eagerly built :data:`kvhit.cli.app` (tests/test_cli_lazy.py compares both renderings and the table
against the real commands). NOT done lazily: a command's own ``--help`` (it needs the command's options, hence its
module and the service request model its help texts come from).
"""

from __future__ import annotations

from typing import Any

from kvhit.cli._root import HELP, root_callback

__all__ = ["COMMANDS", "root"]

# fmt: off
#: name → (modules that register the command on kvhit.cli._common.app, the first paragraph of its help), in the
#: order of ``kvhit --help`` (typer lists the sub-command groups ``trace`` and ``fleet`` after the commands).
COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "estimate": (("kvhit.cli.estimate",),
                 "Mean-field estimate from a workload spec: moments, T_C, h_max and h (base eq. (25), practical eq. "
                 "(32))."),
    "simulate": (("kvhit.cli.simulate",),
                 "Simulate the hit ratio: Algorithm 1 (content) or the vLLM block cache, on a trace, a spec, or a "
                 "production\nblock-id trace (--blocks-trace: Mooncake FAST'25 .jsonl or WEKA Claude-Code .json; "
                 "both engine orders).\n--engine sglang: SGLang 0.5.23's radix cache, --N in tokens (its KV pool), "
                 "token hit ratio, optional\nin-flight holds (--prefill-tokens-per-s, --decode-tokens-per-s)."),
    "stream": (("kvhit.cli.stream",),
               "Simulate a long trace in bounded memory: a spec's stream trace generated in chunks (--events, e.g. "
               "1e8), or a\nParquet trace read by row groups; Algorithm 1 (content) or the vLLM block cache, one "
               "pass for every --N."),
    "demo": (("kvhit.cli.demo",),
             "The real job: ShareGPT → Qwen3 block trace (cached), its statistics, the paper's estimate at N = 2,275"
             "\n(the paper's App. E capacity) beside the whole-content simulation and the vLLM block cache (both "
             "orders)."),
    "plan": (("kvhit.cli.plan",),
             "How much HBM, what hit ratio, how much traffic: (a) h at the KV memory available, (b) the KV memory "
             "for\na target h, (c) the largest λ0 keeping the target, (d) prefill tokens saved per second."),
    "kv": (("kvhit.cli.plan",),
           "KV bytes per token and block for a model, the block capacity N on an accelerator or a KV budget, and "
           "the\ncapacity of a host (DRAM) KV tier per engine."),
    "reproduce": (("kvhit.cli.reproduce",),
                  "Reproduce the paper's Experiments 1–2 (App. E): Figs. 2–6, results.json and report.md in --out."),
    "curve": (("kvhit.cli.curve",),
              "Hit ratio at every capacity: exact simulated curves (one pass each) beside the estimators' curves."),
    "tiers": (("kvhit.cli.tiers",),
              "Total hit ratio h(HBM, DRAM) of a trace behind a host-memory KV tier (vLLM native, simple eager/lazy, "
              "LMCache,\nSGLang HiCache)."),
    "serve": (("kvhit.cli.serve",),
              "The planner page and the JSON API (OpenAPI at /docs) over the service layer; opens nothing by "
              "itself."),
    "sweep": (("kvhit.cli.sweep",),
              "Run a design grid (engines × capacities × λ0 × replicas × routers × workloads × replications) "
              "through the\nservice layer into a Parquet dataset, one row per point and replication; `kvhit sweep "
              "report DIR` tables and\nplots it."),
    "explain": (("kvhit.cli.explain",),
                "Where the hit ratio goes: reusable share → capacity → engine → concurrency → routing → host tier."),
    "replay": (("kvhit.cli.replay",),
               "Replay a trace against a running vLLM or SGLang server (OpenAI completions, token-id prompts) "
               "and record\neach request's prefix-cache hit (usage.prompt_tokens_details.cached_tokens) "
               "and the server's counters."),
    "trace": (("kvhit.cli.trace", "kvhit.cli.explain"), "Build and inspect traces (Parquet)."),
    "fleet": (("kvhit.cli.fleet",), "R replicas behind a router (exact simulation)."),
}
# fmt: on


def _real(name: str):
    """The command ``name`` as typer builds it from :data:`kvhit.cli._common.app`, importing only its modules."""
    import importlib

    import typer

    for mod in COMMANDS[name][0]:
        importlib.import_module(mod)
    from kvhit.cli._common import app

    group = typer.main.get_command(app)
    return group.commands[name]


def root():
    """The root click group of ``kvhit``: the eager app's options and command table, each command loaded on use."""
    import typer
    from typer.core import TyperCommand, TyperGroup

    class LazyGroup(TyperGroup):
        """A typer group whose commands are stubs (name and help) until one is resolved to run or to show help."""

        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            for n, (_, text) in COMMANDS.items():
                self.commands[n] = TyperCommand(name=n, help=text)
            self._listing = False
            self._loaded: dict[str, Any] = {}

        def list_commands(self, ctx) -> list[str]:
            return list(COMMANDS)

        def get_command(self, ctx, cmd_name: str):
            if cmd_name not in COMMANDS:
                return None
            if self._listing:
                return self.commands[cmd_name]
            if cmd_name not in self._loaded:
                self._loaded[cmd_name] = _real(cmd_name)
            return self._loaded[cmd_name]

        def format_help(self, ctx, formatter) -> None:
            self._listing = True
            try:
                return super().format_help(ctx, formatter)
            finally:
                self._listing = False

    app = typer.Typer(
        cls=LazyGroup, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=HELP
    )
    app.callback()(root_callback)
    return typer.main.get_command(app)
