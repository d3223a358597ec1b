"""End-to-end: ``kvhit serve`` on a free 127.0.0.1 port, the planner page in Debian's Chromium (Playwright).

The plotted curve's data and the plan answers are checked against the service layer's numbers for the same
inputs; a slider move redraws the curve; the URL restores the inputs; a good and a bad uploaded trace. Screenshots
go to docs/figures/ (shown in the README). Run with ``make test-browser`` (needs ``apt-get install chromium``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from kvhit import service as svc

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(os.environ.get("KVHIT_BROWSER") != "1", reason="browser tests run with make test-browser"),
]

ROOT = Path(__file__).resolve().parents[1]
FIG = ROOT / "docs" / "figures"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCM = {"lam0": 1.0, "mean_turns": 5.0, "x_mean": 4.0, "y_mean": 3.0, "w_mean": 135.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    kvhit = Path(sys.executable).parent / "kvhit"
    proc = subprocess.Popen(
        [str(kvhit), "serve", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(url + "/api/presets", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() - t0 > 90:
                proc.kill()
                raise RuntimeError(f"kvhit serve did not start: {proc.stdout.read().decode()[-2000:]}") from None
            time.sleep(0.3)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium not found: apt-get install -y chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1280, "height": 820})
        yield pg
        browser.close()


def chart(page) -> list[dict]:
    return page.evaluate("Array.from(document.getElementById('chart').data, t => ({name: t.name, x: t.x, y: t.y}))")


def load(page, url):
    page.goto("about:blank")  # a fresh load: a hash change alone does not re-run the page
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", timeout=180_000)


def test_curve_and_plan_match_the_service(server, page):
    load(page, server + "/#workload=scm")
    (est,) = chart(page)
    want = svc.estimate(svc.build(svc.EstimateRequest, N=est["x"], **SCM))
    assert est["y"] == [r.h for r in want.estimates]
    plan = page.evaluate("window.kvhit.plan.planner")
    ref = svc.plan(svc.build(svc.PlanRequest, engine="paper", target=0.3, accelerator="H100", **SCM)).to_jsonable()
    assert plan == ref
    cell = page.locator("#plan td[data-k='h at capacity']").inner_text()
    assert cell == f"{ref['h_at_capacity']:.4f}"
    budget = page.evaluate("window.kvhit.kv.N")
    assert budget == svc.kv(svc.build(svc.KvRequest, accelerator="H100")).N
    FIG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(FIG / "web_planner.png"), full_page=True)


def test_slider_redraws_and_url_restores(server, page):
    load(page, server + "/#workload=scm")
    before = chart(page)[0]["y"]
    page.evaluate(
        "(() => { const s = document.getElementById('lam0'); s.value = '0.3'; s.dispatchEvent(new Event('input')); })()"
    )
    page.wait_for_function("window.kvhit.est && window.kvhit.busy === false && location.hash.includes('lam0=2')")
    page.wait_for_function(f"document.getElementById('chart').data[0].y[500] !== {before[500]!r}")
    est = chart(page)[0]
    lam0 = float(page.evaluate("lam0()"))
    assert lam0 == 2.0  # 10**0.3 to 3 significant digits
    want = svc.estimate(svc.build(svc.EstimateRequest, N=est["x"], **{**SCM, "lam0": lam0}))
    assert est["y"] == [r.h for r in want.estimates]
    shared = page.url
    page.goto("about:blank")
    load(page, shared)
    assert float(page.evaluate("lam0()")) == 2.0
    assert chart(page)[0]["y"] == est["y"]


def test_kv_budget_in_gib(server, page):
    load(page, server + "/#workload=scm")
    page.check("input[name=budget][value=kv_gb]")
    page.fill("#kv_gb", "60")
    page.dispatch_event("#kv_gb", "change")
    page.wait_for_function("window.kvhit.plan.planner && window.kvhit.plan.planner.capacity.kv_gib === 60")
    ref = svc.plan(svc.build(svc.PlanRequest, engine="paper", target=0.3, kv_gb=60, **SCM)).to_jsonable()
    assert page.evaluate("window.kvhit.plan.planner") == ref


def test_upload_good_and_bad_trace(server, page, tmp_path):
    good = tmp_path / "small.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, out=good, conversations=300, seed=3, **SCM))
    load(page, server + "/#workload=scm")
    page.set_input_files("#trace", str(good))
    page.wait_for_function("window.kvhit.traceCurve !== null && window.kvhit.traceCurve !== undefined", timeout=120_000)
    got = page.evaluate("window.kvhit.traceCurve")
    ref = svc.curve(
        svc.build(svc.CurveRequest, trace=good, n_min=100, n_max=100000, points=200, policies=["content"])
    ).to_jsonable()
    assert got == json.loads(json.dumps(ref).replace(str(good), good.name))
    page.wait_for_function("window.kvhit.plan.planner", timeout=120_000)
    want = svc.plan(svc.build(svc.PlanRequest, engine="paper", target=0.3, accelerator="H100", trace=good))
    assert page.evaluate("window.kvhit.plan.planner") == json.loads(want.to_json().replace(str(good), good.name))
    page.screenshot(path=str(FIG / "web_trace.png"), full_page=True)

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not a parquet file\n")
    page.set_input_files("#trace", str(bad))
    page.wait_for_function("document.getElementById('error').textContent.length > 0", timeout=120_000)
    shown = page.inner_text("#error")
    with pytest.raises(svc.InputError) as e:
        svc.curve(svc.build(svc.CurveRequest, trace=bad, n_min=100, n_max=100000, points=200, policies=["content"]))
    assert shown == str(e.value).replace(str(bad), "bad.parquet")
    assert "Traceback" not in shown


def test_exact_simulation_on_demand(server, page):
    load(page, server + "/#workload=scm")
    page.select_option("#engine", "content")
    page.click("#simulate")
    page.wait_for_function("window.kvhit.sim", timeout=180_000)
    got = page.evaluate("window.kvhit.sim")
    fields = {"n_min": 100, "n_max": 100000, "points": 100, "estimates": False, "policies": ["content"]}
    ref = svc.curve(svc.build(svc.CurveRequest, model="Qwen3-8B", conversations=4000, seed=0, **fields, **SCM))
    assert got == ref.to_jsonable()
    names = [t["name"] for t in chart(page)]
    assert names[0] == "estimator (eq. 32)" and any("Algorithm 1" in n for n in names[1:])
    assert page.inner_text("#progress_what").startswith("done")


def test_sharegpt_workload_plots_the_service(server, page):
    load(page, server + "/")  # the default workload
    page.wait_for_function(
        "(window.kvhit.plan.planner && window.kvhit.traceCurve) || document.getElementById('error').textContent",
        timeout=180_000,
    )
    assert page.inner_text("#error") == ""
    ref = svc.curve(
        svc.build(svc.CurveRequest, sharegpt=True, n_min=100, n_max=100000, points=200, policies=["content"])
    ).to_jsonable()
    assert page.evaluate("window.kvhit.traceCurve") == json.loads(json.dumps(ref))
    plotted = {t["name"]: t["y"] for t in chart(page)}
    assert plotted["estimate: paper eq. (39), F̂"] == ref["estimate: paper eq. (39), F̂"]
    want = svc.plan(svc.build(svc.PlanRequest, sharegpt=True, engine="paper", target=0.3, accelerator="H100"))
    assert page.evaluate("window.kvhit.plan.planner") == json.loads(want.to_json())
    cell = page.locator("#plan td[data-k='h at capacity']").inner_text()
    assert cell == f"{want.h_at_capacity:.4f}"
