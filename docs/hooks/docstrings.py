"""mkdocs hooks: every module, class and function of the API reference has a docstring (``on_pre_build``), and
pages written on other branches join the nav when present (``on_config``).

``mkdocs build --strict`` (``make docs``) turns the warnings logged here into a failed build, so a public object
added without a docstring fails CI. Public: not underscore-prefixed, in a module whose path has no
underscore-prefixed part, defined in kvhit (re-exports are checked where they are defined). Methods are not
checked yet (313 lack one today, most of them implementations of a documented protocol such as
``IntDist.pmf``); modules, classes and module-level functions are.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("mkdocs.plugins.kvhit.docstrings")
PACKAGES = ("workload", "sim", "estimate", "fleet", "plan", "plots", "experiments", "service", "sweep")


def _missing(obj, out: list[str]) -> None:
    import griffe

    for name, member in obj.members.items():
        if name.startswith("_") or member.is_alias:
            continue
        if member.kind in (griffe.Kind.MODULE,):
            if not member.docstring:
                out.append(member.path)
            _missing(member, out)
        elif member.kind in (griffe.Kind.CLASS, griffe.Kind.FUNCTION):
            if not member.docstring:
                out.append(member.path)


def on_pre_build(config, **kwargs) -> None:
    import griffe

    src = Path(config["config_file_path"]).parent / "src"
    pkg = griffe.load("kvhit", search_paths=[str(src)], docstring_parser=None)
    missing: list[str] = []
    for sub in PACKAGES:
        mod = pkg.members[sub]
        if not mod.docstring:
            missing.append(mod.path)
        _missing(mod, missing)
    for path in missing:
        log.warning("no docstring: %s", path)


#: pages written on other branches (live vLLM checks, explain): linked from the nav when present, before
#: "Layout and contributing"
OPTIONAL_PAGES = {"live.md": "Live vLLM checks", "explain.md": "Explain a hit ratio"}


def on_config(config, **kwargs):
    docs = Path(config["docs_dir"])
    nav = config["nav"]
    listed = {str(v) for item in nav for v in (item.values() if isinstance(item, dict) else [item])}
    at = next(
        (i for i, item in enumerate(nav) if isinstance(item, dict) and "Layout and contributing" in item), len(nav)
    )
    for name, title in OPTIONAL_PAGES.items():
        if (docs / name).is_file() and name not in listed:
            nav.insert(at, {title: name})
            at += 1
    return config
