"""End-to-end: the planner page's host-tier (DRAM) and fleet panels in Debian's Chromium (Playwright), against the
service layer's own answers for the same inputs (grids rebuilt here, the KV budget from ``svc.kv``).

Checked: the panels are disabled where they do not apply (the SCM workload has no trace to replay); the tier curve
and the fleet curve on the page are the service's numbers; a router that collapses onto one replica and Mooncake's
look-ahead sessions are named in the fleet table; an error, or a change of the main inputs, clears the panels'
stale results. ``make screenshots`` (``KVHIT_SCREENSHOTS=1``) writes the README's images to
docs/figures/planner_*.png from the bundled ShareGPT workload at a fixed viewport. Run with ``make test-browser``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvhit import service as svc
from test_web_browser import ARGS, page, server, settle  # noqa: F401  (fixtures)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(os.environ.get("KVHIT_BROWSER") != "1", reason="browser tests run with make test-browser"),
]

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "figures"
MC = ROOT / "tests" / "data" / "production" / "mooncake_small.jsonl"
SCM = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}
B = 16  # the generated trace's block size (written into its metadata)
PANEL_CONTROLS = ["tier", "dram_gb", "tiers_run", "tiers_sim", "replicas", "router", "fleet_run"]
assert ARGS  # the shared Chromium flags (imported with the fixtures)


@pytest.fixture(scope="module")
def steady_trace(tmp_path_factory):
    """1,600 SCM conversations, the first 800 a warm-up (> one mean conversation, ~540 s): a steady window; prompts
    of whole blocks of 16 tokens."""
    from kvhit.workload import Trace

    p = tmp_path_factory.mktemp("panels") / "scm.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, out=p, conversations=1600, seed=11, **SCM))
    tr = Trace.read(p)
    tr.meta.update(n_warm=800, block_size=B)
    tr.cols["cum_tokens"] = tr["R"].astype("int64") * B  # token counts (whole-block prompts): the estimator needs them
    tr.write(p)
    return p


def dram_grid(d: float) -> list[float]:
    """The page's DRAM columns around the user's d (d/8 … 8d and 0), rebuilt here."""
    return sorted({0.0, *(float(f"{d * k:.6g}") for k in (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8))})


def replica_grid(R: int) -> list[int]:
    out = {R, 2 * R}
    r = 1
    while r <= 2 * R:
        out.add(r)
        r *= 2
    return sorted(out)


def kv_N(block_size: int, **kw) -> int:
    return svc.kv(svc.build(svc.KvRequest, model="Qwen3-8B", accelerator="H100", block_size=block_size, **kw)).N


def load(pg, url):
    pg.goto("about:blank", timeout=300_000)  # a fresh load: a hash change alone does not re-run the page
    pg.goto(url, timeout=300_000)
    pg.wait_for_selector("body[data-ready='1']", timeout=600_000)  # two shared cores: the first chart is slow


def upload(pg, url, path):
    load(pg, url + "/#workload=scm")
    pg.set_input_files("#trace", str(path))
    settle(pg)
    assert pg.inner_text("#error") == ""
    pg.wait_for_function("!document.getElementById('fleet_run').disabled", timeout=60_000)


def wait_panel(pg, slot: str):
    pg.wait_for_function(
        f"!window.kvhit.panels.busy.{slot} && (window.kvhit.panels.{slot} || "
        f"document.getElementById('{slot}_error').textContent)",
        timeout=600_000,
    )


def panel_chart(pg, slot: str) -> dict:
    return pg.evaluate(
        f"(() => {{ const d = document.getElementById('{slot}_chart'); return {{traces: (d.data || []).map(t => "
        "({name: t.name, x: t.x, y: t.y})), x: d.layout && d.layout.xaxis.title.text, "
        "y: d.layout && d.layout.yaxis.title.text}; })()"
    )


def test_panels_are_disabled_without_a_trace(server, page):  # noqa: F811
    load(page, server + "/#workload=scm")
    for sel in PANEL_CONTROLS:
        assert page.is_disabled("#" + sel), sel
    assert page.inner_text("#tiers_hint").startswith("needs a trace to replay")
    assert page.inner_text("#fleet_hint").startswith("needs a trace to replay")


def test_tiers_panel_is_the_service_and_errors_clear_it(server, page, steady_trace):  # noqa: F811
    upload(page, server, steady_trace)
    page.fill("#dram_gb", "64")
    page.click("#tiers_run")
    wait_panel(page, "tiers")
    assert page.inner_text("#tiers_error") == ""
    N = kv_N(B)
    fields = dict(hbm_blocks=[N], dram_gb=dram_grid(64), tier="native", model="qwen3-8b", block_size=B)
    want = svc.tiers(svc.build(svc.TiersRequest, trace=steady_trace, estimate="only", measure="window", **fields))
    got = page.evaluate("window.kvhit.panels.tiers.res")
    assert got == json.loads(want.to_json())
    ch = panel_chart(page, "tiers")
    assert [t["name"] for t in ch["traces"]] == ["vLLM native CPU offloading — two-tier estimate"]
    assert ch["traces"][0]["y"] == want.h[0][1:]  # the DRAM > 0 columns on a log axis
    assert ch["x"].startswith("DRAM for the KV tier (GiB") and ch["y"].startswith("token hit ratio")
    cell = page.locator("#tiers_table td[data-k='h with 64 GiB DRAM — estimate']").inner_text()
    assert cell == f"{want.h[0][want.dram_gib.index(64.0)]:.4f}"

    page.click("#tiers_sim")
    wait_panel(page, "tiers")
    sim = svc.tiers(svc.build(svc.TiersRequest, trace=steady_trace, estimate="also", measure="window", **fields))
    assert page.evaluate("window.kvhit.panels.tiers.res") == json.loads(sim.to_json())
    assert sim.stationarity["stationary"] is True, sim.stationarity["message"]
    names = [t["name"] for t in panel_chart(page, "tiers")["traces"]]
    assert names == [
        "native (vLLM 0.33.0 native) — simulated (exact)",
        "vLLM native CPU offloading — two-tier estimate",
    ]
    cell = page.locator("#tiers_table td[data-k='h with 128 GiB DRAM (2×) — simulated']").inner_text()
    assert cell == f"{sim.h[0][sim.dram_gib.index(128.0)]:.4f}"

    page.fill("#dram_gb", "200000")  # 8 × 200,000 GiB is past the API's 2^20 GiB limit: refused, nothing stale left
    page.click("#tiers_run")
    wait_panel(page, "tiers")
    assert page.inner_text("#tiers_error").startswith("--dram-gb")
    assert page.evaluate("window.kvhit.panels.tiers") is None
    assert panel_chart(page, "tiers")["traces"] == []
    assert page.locator("#tiers_table td").count() == 0


def test_fleet_panel_is_the_service_and_main_inputs_clear_it(server, page, steady_trace):  # noqa: F811
    upload(page, server, steady_trace)
    page.fill("#replicas", "4")
    page.select_option("#router", "session")
    page.click("#fleet_run")
    wait_panel(page, "fleet")
    assert page.inner_text("#fleet_error") == ""
    want = svc.fleet_simulate(
        svc.build(
            svc.FleetRequest,
            trace=steady_trace,
            block_size=B,
            replicas=replica_grid(4),
            router=["session"],
            N=[kv_N(B)],
        )
    )
    got = page.evaluate("window.kvhit.panels.fleet.res")
    assert got == json.loads(json.dumps(want.to_jsonable()).replace(str(steady_trace), steady_trace.name))
    assert want.stationarity["stationary"] is True
    ch = panel_chart(page, "fleet")
    plotted = {t["name"]: t for t in ch["traces"]}
    assert plotted["session — simulated (exact)"]["y"] == [r["token_hit_ratio"] for r in want.rows]
    assert plotted["session — fleet estimate"]["y"] == [r["estimate"] for r in want.rows]
    assert ch["x"].startswith("replicas R (each ")
    row4 = next(r for r in want.rows if r["replicas"] == 4)
    assert page.locator("#fleet_table tr[data-r='4'] td[data-k='h']").inner_text() == f"{row4['token_hit_ratio']:.4f}"
    page.fill("#tp", "2")  # a main input: the fleet answer was for tp = 1 and must go
    page.dispatch_event("#tp", "change")
    page.wait_for_function("window.kvhit.panels.fleet === null")
    assert page.locator("#fleet_table td").count() == 0


def test_fleet_table_names_collapse_and_lookahead(server, page):  # noqa: F811
    upload(page, server, MC)
    assert page.inner_text("#trace_kind") == "production block-id trace (Mooncake/WEKA)"
    b = page.evaluate("window.kvhit.curve.block_size")
    N = kv_N(b)
    for router, note in (("dynamo", "collapsed onto one replica"), ("session", "look-ahead sessions: upper bound")):
        page.select_option("#router", router)
        page.fill("#replicas", "2")
        page.click("#fleet_run")
        wait_panel(page, "fleet")
        want = svc.fleet_simulate(
            svc.build(svc.FleetRequest, blocks_trace=MC, replicas=[1, 2, 4], router=[router], N=[N])
        )
        got = page.evaluate("window.kvhit.panels.fleet.res")
        assert got == json.loads(json.dumps(want.to_jsonable()).replace(str(MC), MC.name))
        for r in want.rows:
            cell = page.locator(f"#fleet_table tr[data-r='{r['replicas']}'] td[data-k='note']").inner_text()
            flagged = r["collapsed"] if router == "dynamo" else r["session_lookahead"]
            assert (note in cell) == flagged, (router, r["replicas"], cell)
        assert any(r["collapsed"] for r in want.rows) if router == "dynamo" else True
        # block-id traces have fleet estimates (fleet/blocks.py) for both routers: the cell shows the service's value
        est = next(r for r in want.rows if r["replicas"] == 2)["estimate"]
        shown = page.locator("#fleet_table tr[data-r='2'] td[data-k='estimate']").inner_text()
        assert shown == ("—" if est is None else f"{est:.4f}"), (router, est, shown)


@pytest.mark.skipif(os.environ.get("KVHIT_SCREENSHOTS") != "1", reason="make screenshots")
def test_readme_screenshots(server, page):  # noqa: F811
    """The README's images: the bundled ShareGPT workload, H100, Qwen3-8B, 64 GiB DRAM, 4 replicas (session)."""
    page.set_viewport_size({"width": 1280, "height": 820})
    load(page, server + "/")
    settle(page)
    page.wait_for_function("!document.getElementById('fleet_run').disabled", timeout=60_000)
    IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(IMG / "planner_main.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 640})
    page.click("#tiers_sim")
    wait_panel(page, "tiers")
    assert page.inner_text("#tiers_error") == ""
    page.locator("#tiers_panel").screenshot(path=str(IMG / "planner_tiers.png"))
    page.select_option("#router", "session")
    page.click("#fleet_run")
    wait_panel(page, "fleet")
    assert page.inner_text("#fleet_error") == ""
    page.locator("#fleet_panel").screenshot(path=str(IMG / "planner_fleet.png"))
