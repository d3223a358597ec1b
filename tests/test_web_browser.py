"""End-to-end: ``kvhit serve`` on a free 127.0.0.1 port, the planner page in Debian's Chromium (Playwright).

The plotted curves and the plan answers are checked against the service layer's numbers for the same inputs:
the user's engine leads (its engine-aware estimate and simulated curve), the paper's idealisation is a labelled
reference; a simulation that did not reach steady state is hidden with a warning; slider moves are coalesced into one
request round; errors clear stale results; uploads of every format are detected. Screenshots go to docs/figures/.
Run with ``make test-browser`` (needs ``apt-get install chromium``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
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
        [str(kvhit), "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its API worker pool is stopped with it (by process group) if it hangs
    )
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(url + "/api/presets", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() - t0 > 300:
                os.killpg(proc.pid, signal.SIGKILL)
                raise RuntimeError(f"kvhit serve did not start: {proc.stdout.read().decode()[-2000:]}") from None
            time.sleep(0.3)
    yield url
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:  # a loaded machine: the pool's shutdown outlasted the wait
        os.killpg(proc.pid, signal.SIGKILL)
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


ENGINE_EST = "vLLM ≥ 0.24 — engine-aware estimate"
ENGINE_SIM = "vLLM ≥ 0.24 — simulated (exact)"
PAPER = "paper's idealisation (whole-conversation LRU, eq. 39) — reference"
GRID = {"n_min": 100, "n_max": 100000}


def settle(page):
    page.wait_for_timeout(400)  # past the 150 ms coalescing delay
    page.wait_for_function(
        "window.kvhit.busy === false && (window.kvhit.curve || document.getElementById('error').textContent)",
        timeout=300_000,
    )


def layout(page) -> dict:
    return page.evaluate(
        "(() => { const l = document.getElementById('chart').layout; return {x: l.xaxis.title.text, "
        "y: l.yaxis.title.text, notes: l.annotations.map(a => a.text), legend: l.legend}; })()"
    )


def test_scm_leads_with_the_engine_and_matches_the_service(server, page):
    load(page, server + "/#workload=scm")
    names = [t["name"] for t in chart(page)]
    assert names == [ENGINE_EST, ENGINE_SIM, PAPER], page.inner_text("#error")
    got = page.evaluate("window.kvhit.curve")
    ref = svc.curve(svc.build(svc.CurveRequest, points=60, policies=["vllm"], seed=0, **GRID, **SCM)).to_jsonable()
    assert got == json.loads(json.dumps(ref))
    assert got["stationarity"]["stationary"] is True
    plotted = {t["name"]: t["y"] for t in chart(page)}
    assert plotted[ENGINE_EST] == ref["estimate: vLLM ≥ 0.24 (engine-aware)"]
    assert plotted[ENGINE_SIM] == ref["vLLM ≥ 0.24 (block cache)"]
    plan = page.evaluate("window.kvhit.plan")
    assert (
        plan
        == svc.plan(svc.build(svc.PlanRequest, engine="paper", target=0.3, accelerator="H100", **SCM)).to_jsonable()
    )
    lay = layout(page)
    assert lay["x"] == "KV capacity N (blocks of 128 tokens, log scale)" and lay["y"].startswith("hit ratio h")
    assert any(n.startswith("h_max = ") and "eq. 28" in n for n in lay["notes"])
    assert lay["legend"]["orientation"] == "h" and lay["legend"]["y"] < 0  # below the plot, off the curves
    first = page.locator("#plan td").first.inner_text()
    assert first == "vLLM ≥ 0.24 at your budget — simulated"
    page.select_option("#xunit", "gib")
    assert layout(page)["x"] == "KV memory (GiB of Qwen3-8B KV, log scale)"
    page.select_option("#xunit", "blocks")
    FIG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(FIG / "web_planner.png"), full_page=True)


def test_slider_is_coalesced_labelled_and_url_restores(server, page):
    load(page, server + "/#workload=scm")
    before = page.evaluate("window.kvhit.requests")
    page.evaluate(
        "(() => { const s = document.getElementById('lam0'); for (const v of ['0.1', '0.2', '0.25', '0.3']) "
        "{ s.value = v; s.dispatchEvent(new Event('input')); } })()"
    )
    settle(page)
    page.wait_for_function("location.hash.includes('lam0=2')")
    assert page.evaluate("window.kvhit.requests") - before == 2  # /api/planner, then the curve job: once per settle
    assert page.inner_text("#lam0_v") == "2"
    est = page.evaluate("window.kvhit.est")
    want = svc.estimate(svc.build(svc.EstimateRequest, N=est["N"], **{**SCM, "lam0": 2.0}))
    assert est["h"] == [r.h for r in want.estimates]
    shared = page.url
    load(page, shared)
    assert float(page.evaluate("lam0()")) == 2.0


def test_one_request_per_slider_move_counted_on_the_wire(server, page):
    """Issue 24 item 3: a slider move is ONE request (``/api/planner``: kv, the paper reference and the plan), counted
    in the browser's own network log (not the page's counter): a burst of input events → one request; a drag of 30
    events 5 ms apart → never two in flight, fewer requests than events, the last one of the final position; its
    answer is what is drawn, and equals the service's."""
    load(page, server + "/#workload=scm")
    settle(page)
    sent = []

    def on_req(r):
        if r.url.startswith(server + "/api/") and r.method == "POST":
            sent.append((r.url.removeprefix(server), r.post_data))

    page.on("request", on_req)
    try:
        page.evaluate(
            "(() => { const s = document.getElementById('lam0'); for (const v of ['0.05', '0.15', '0.22', '0.4']) "
            "{ s.value = v; s.dispatchEvent(new Event('input')); } })()"
        )
        page.wait_for_function("!window.kvhit.busy && window.kvhit.plan && window.kvhit.plan.lam0 === 2.51")
        settle(page)
        paths = [p for p, _ in sent]
        assert paths[0] == "/api/planner" and paths.count("/api/planner") == 1, paths  # one request for the burst
        assert not {"/api/kv", "/api/estimate", "/api/plan"} & set(paths), paths  # not the three of before
        assert set(paths) <= {"/api/planner", "/api/curve"} and paths.count("/api/curve") <= 1, paths
        body = json.loads(sent[0][1])
        assert body["lam0"] == 2.51 and body["target"] == 0.3 and body["accelerator"] == "H100", body
        est = page.evaluate("window.kvhit.est")
        want = svc.planner(svc.build(svc.PlannerRequest, **body)).to_jsonable()
        assert est["h"] == [r["h"] for r in want["estimate"]["estimates"]]
        assert page.evaluate("window.kvhit.plan") == want["plan"]
        assert page.evaluate("window.kvhit.kv") == want["kv"]

        sent.clear()
        r = page.evaluate(
            """async () => { const s = document.getElementById('lam0'), real = window.fetch;
            let now = 0, most = 0;  // planner requests in flight, counted around the page's own fetch calls
            window.fetch = async (url, init) => {
              const mine = String(url).endsWith('/api/planner'); if (mine) { now += 1; most = Math.max(most, now); }
              try { return await real(url, init); } finally { if (mine) now -= 1; } };
            try {
              for (let i = 0; i < 30; i++) { s.value = (0.5 + 0.01 * i).toFixed(2); s.dispatchEvent(new Event('input'));
                await new Promise((res) => setTimeout(res, 5)); }
              while (window.kvhit.busy || !window.kvhit.plan || window.kvhit.plan.lam0 !== lam0())
                await new Promise((res) => setTimeout(res, 5));
            } finally { window.fetch = real; }
            return { most }; }"""
        )
        settle(page)
        planner = [json.loads(b) for p, b in sent if p == "/api/planner"]
        assert 1 <= len(planner) < 30, len(planner)  # coalesced
        assert planner[-1]["lam0"] == pytest.approx(10**0.79, rel=2e-3)  # the final position is asked last
        assert r["most"] == 1, r  # never two planner requests in flight: each waits for the one before
    finally:
        page.remove_listener("request", on_req)


def test_slider_redraws_without_waiting_for_the_running_simulation(server, page):
    """Issue 24 item 3: the paper reference follows the slider at once; the engine's curve (a simulation job,
    seconds) of an older slider position is cancelled, never awaited, and never drawn over a newer one. The page
    before this test waited for the running job to end (and drew its curve) before answering the next move."""
    load(page, server + "/#workload=scm")
    settle(page)
    r = page.evaluate(
        """async () => {
      const s = document.getElementById('lam0'), st = window.kvhit;
      const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
      const move = (v) => { s.value = v; s.dispatchEvent(new Event('input')); };
      st.job = null;
      move('0.35');  // a λ0 no other test asks for: its curve is computed, not cached
      while (!st.job) await sleep(2);
      const first = st.job, est0 = st.est, t0 = performance.now();
      let curveDrawn = false;
      move('0.45');
      while (st.est === est0) { if (st.curve) curveDrawn = true; await sleep(2); }
      const ms = performance.now() - t0;
      const status = (await (await fetch(`/api/jobs/${first}`)).json()).status;
      return { first, curveDrawn, status, ms };
    }"""
    )
    assert not r["curveDrawn"], r  # the older position's curve never appeared
    assert r["status"] in ("queued", "running"), r  # redrawn while that simulation still ran
    settle(page)
    assert float(page.evaluate("lam0()")) == pytest.approx(10**0.45, rel=2e-3)
    status = page.evaluate(f"(async () => (await (await fetch('/api/jobs/{r['first']}')).json()).status)()")
    assert status == "cancelled"  # superseded by the newer position's job
    want = svc.estimate(
        svc.build(
            svc.EstimateRequest, N=page.evaluate("window.kvhit.est.N"), **{**SCM, "lam0": page.evaluate("lam0()")}
        )
    )
    assert page.evaluate("window.kvhit.est.h") == [x.h for x in want.estimates]


def test_inapplicable_controls_are_disabled(server, page):
    load(page, server + "/#workload=sharegpt")
    for sel in ("#lam0", "#mean_turns", "#w_mean", "#x_mean", "#y_mean", "#kv_gb"):
        assert page.is_disabled(sel), sel
    assert page.inner_text("#mean_turns_v") == "5"  # labels filled even where the slider does not apply
    page.check("input[name=workload][value=scm]")
    assert not page.is_disabled("#lam0")


def test_error_clears_stale_results(server, page):
    load(page, server + "/#workload=scm")
    assert page.locator("#plan td").count() > 0
    page.select_option("#model", "Llama-3.1-70B")
    page.select_option("#accelerator", "H200")
    page.dispatch_event("#accelerator", "change")
    page.wait_for_function("document.getElementById('error').textContent.includes('--gpu')", timeout=120_000)
    assert page.locator("#plan td").count() == 0  # nothing of the previous model stays beside the error
    assert chart(page) == []
    page.fill("#tp", "2")  # the error suggests tp: the page has the control
    page.dispatch_event("#tp", "change")
    settle(page)
    assert page.inner_text("#error") == ""
    assert (
        page.evaluate("window.kvhit.kv.N")
        == svc.kv(svc.build(svc.KvRequest, model="Llama-3.1-70B", accelerator="H200", tp=2)).N
    )


def test_kv_budget_in_gib(server, page):
    load(page, server + "/#workload=scm")
    page.check("input[name=budget][value=kv_gb]")
    page.fill("#kv_gb", "60")
    page.dispatch_event("#kv_gb", "change")
    page.wait_for_function("window.kvhit.plan && window.kvhit.plan.capacity.kv_gib === 60")
    ref = svc.plan(svc.build(svc.PlanRequest, engine="paper", target=0.3, kv_gb=60, **SCM)).to_jsonable()
    assert page.evaluate("window.kvhit.plan") == ref


def test_short_trace_upload_is_not_shown_as_an_answer(server, page, tmp_path):
    good = tmp_path / "small.parquet"
    svc.generate_trace(svc.build(svc.GenerateRequest, out=good, conversations=300, seed=3, **SCM))
    load(page, server + "/#workload=scm")
    page.set_input_files("#trace", str(good))
    settle(page)
    got = page.evaluate("window.kvhit.curve")
    ref = svc.curve(svc.build(svc.CurveRequest, trace=good, points=200, policies=["vllm"], **GRID)).to_jsonable()
    assert got == json.loads(json.dumps(ref).replace(str(good), good.name))
    assert got["stationarity"]["stationary"] is False  # 300 conversations where ~540 are alive at once
    names = [t["name"] for t in chart(page)]
    assert ENGINE_SIM not in names and ENGINE_EST in names
    assert page.inner_text("#warn").startswith("Simulation hidden — NOT STATIONARY")
    assert "simulation not shown: its window did not reach steady state" in layout(page)["notes"]
    assert (
        page.locator("#plan td[data-k='vLLM ≥ 0.24 at your budget — simulated']").inner_text().startswith("not shown")
    )
    page.screenshot(path=str(FIG / "web_not_stationary.png"), full_page=True)

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not a parquet file\n")
    page.set_input_files("#trace", str(bad))
    page.wait_for_function("document.getElementById('error').textContent.length > 0", timeout=120_000)
    assert "not a kvhit Parquet trace, a Mooncake .jsonl or a WEKA .json" in page.inner_text("#error")
    assert chart(page) == []


def test_mooncake_and_sharegpt_uploads_are_detected(server, page, tmp_path):
    lines = [
        {"timestamp": 1000 * i, "input_length": 2048, "output_length": 10, "hash_ids": [0, 1, 2 + i % 5, 10 + i]}
        for i in range(60)
    ]
    mc = tmp_path / "mooncake.jsonl"
    mc.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    load(page, server + "/#workload=scm")
    page.set_input_files("#trace", str(mc))
    settle(page)
    assert page.inner_text("#error") == ""
    assert page.inner_text("#trace_kind") == "production block-id trace (Mooncake/WEKA)"
    got = page.evaluate("window.kvhit.curve")
    ref = svc.curve(svc.build(svc.CurveRequest, blocks_trace=mc, points=200, policies=["vllm"], **GRID))
    assert got == json.loads(json.dumps(ref.to_jsonable()).replace(str(mc), mc.name))
    assert [t["name"] for t in chart(page)][:2] == ["vLLM ≥ 0.24 — agentic estimate", ENGINE_SIM]
    page.screenshot(path=str(FIG / "web_trace.png"), full_page=True)
    sg = tmp_path / "chats.json"
    sg.write_text(json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}]))
    page.set_input_files("#trace", str(sg))
    page.wait_for_function("document.getElementById('error').textContent.includes('ShareGPT')", timeout=60_000)
    assert "kvhit trace sharegpt --source chats.json" in page.inner_text("#error")


def test_sharegpt_workload_plots_the_service(server, page):
    load(page, server + "/")  # the default workload
    settle(page)
    assert page.inner_text("#error") == ""
    ref = svc.curve(svc.build(svc.CurveRequest, sharegpt=True, points=200, policies=["vllm"], **GRID)).to_jsonable()
    assert page.evaluate("window.kvhit.curve") == json.loads(json.dumps(ref))
    plotted = {t["name"]: t["y"] for t in chart(page)}
    assert plotted[PAPER] == ref["estimate: paper eq. (39), F̂"]
    assert plotted[ENGINE_SIM] == ref["vLLM ≥ 0.24 (block cache)"]
    want = svc.plan(svc.build(svc.PlanRequest, sharegpt=True, engine="paper", target=0.3, accelerator="H100"))
    assert page.evaluate("window.kvhit.plan") == json.loads(want.to_json())
    cell = page.locator("#plan td[data-k='h at capacity (paper)']").inner_text()
    assert cell == f"{want.h_at_capacity:.4f}"
