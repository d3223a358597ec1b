// kvhit planner page — the host-tier (DRAM) and fleet panels: "what more DRAM / replicas would buy".
// Every number comes from the JSON API (/api/kv, /api/tiers, /api/fleet); this file only draws. Both panels replay a
// trace (the bundled ShareGPT or an uploaded one) at your KV budget per GPU set (/api/kv at the trace's block size):
// on the SCM workload (no trace) they are disabled. A simulated line whose measured window did not reach steady
// state is not drawn (service/steady.py); a main-input change or an error clears the panels' results.
"use strict";
const panels = { tiers: null, fleet: null, jobs: {}, busy: {} };
state.panels = panels;  // read by the browser tests

const PANEL_CONTROLS = ["tier", "dram_gb", "tiers_run", "tiers_sim", "replicas", "router", "fleet_run"];
const TIER_NAME = { native: "vLLM native CPU offloading", simple: "vLLM SimpleCPUOffload", lmcache: "LMCache" };

// ---- which panels apply ----------------------------------------------------------------------------------------
function panelBlocker() {
  const src = workload();
  if (src === "scm") return "needs a trace to replay: choose ShareGPT or upload a trace (the SCM sliders have none)";
  if (src === "trace" && !$("trace").files[0]) return "upload a trace first";
  if (!state.kv || !state.curve || !state.curve.block_size) return "waiting for the main chart (your KV budget)";
  return null;
}
function syncPanels() {
  const why = panelBlocker();
  for (const id of PANEL_CONTROLS) $(id).disabled = !!why;
  if (!why && panels.busy.tiers) { $("tiers_run").disabled = true; $("tiers_sim").disabled = true; }
  if (!why && panels.busy.fleet) $("fleet_run").disabled = true;
  $("tiers_hint").textContent = why || "HBM = your KV budget; a grid of DRAM sizes around yours (the trace's own requests, after its warm-up)";
  $("fleet_hint").textContent = why || "every replica has your KV budget and tp GPUs; R = 1, 2, 4, … up to 2R";
}

// ---- a panel's own job (never cancels the main chart's) -------------------------------------------------------
async function panelPost(path, fields, files, slot) {
  const old = panels.jobs[slot]; if (old) fetch(`/api/jobs/${old}`, { method: "DELETE" });
  panels.jobs[slot] = null;
  const init = { method: "POST" };
  const up = Object.entries(files || {}).filter(([, f]) => f);
  if (up.length) {
    const fd = new FormData(); fd.append("request", JSON.stringify(fields));
    for (const [k, f] of up) fd.append(k, f, f.name);
    init.body = fd;
  } else { init.headers = { "content-type": "application/json" }; init.body = JSON.stringify(fields); }
  const r = await fetch(path, init);
  let job = await r.json();
  if (r.status !== 202) { if (!r.ok) throw new Error(job.detail || r.statusText); return job; }
  const mine = job.id; panels.jobs[slot] = mine;
  const bar = $(`${slot}_progress`);
  while (job.status === "queued" || job.status === "running") {
    const pr = job.progress || {}; bar.value = pr.total ? pr.done / pr.total : 0;
    await new Promise((res) => setTimeout(res, 250));
    if (panels.jobs[slot] !== mine) throw Object.assign(new Error("superseded"), { cancelled: true });
    job = await (await fetch(`/api/jobs/${mine}`)).json();
  }
  if (panels.jobs[slot] === mine) panels.jobs[slot] = null;
  bar.value = job.status === "done" ? 1 : 0;
  if (job.status === "done") return job.result;
  if (job.status === "cancelled") throw Object.assign(new Error("cancelled"), { cancelled: true });
  throw new Error(job.error || `job ${job.status}`);
}
// the workload as a panel request: the bundled ShareGPT, or the uploaded trace (its detected kind is the file part)
async function panelSource() {
  const b = state.curve.block_size;  // a kvhit trace replays at the main chart's block size
  if (workload() === "sharegpt") return { fields: { sharegpt: true, block_size: b }, files: {}, kvhitTrace: true };
  const up = await traceUpload();
  return { fields: up.kind === "trace" ? { block_size: b } : {}, files: { [up.kind]: up.file }, kvhitTrace: up.kind === "trace" };
}
// your KV budget in blocks of the trace's block size (the curve answer names it)
function panelKv() {
  return api("/api/kv", { ...modelFields(), ...budgetFields(), block_size: state.curve.block_size }, modelFiles());
}
function clearPanel(slot) {
  const old = panels.jobs[slot]; if (old) fetch(`/api/jobs/${old}`, { method: "DELETE" });
  panels.jobs[slot] = null; panels[slot] = null;
  $(`${slot}_error`).textContent = ""; $(`${slot}_notes`).innerHTML = ""; $(`${slot}_progress`).value = 0;
  $(`${slot}_table`).querySelector("tbody").innerHTML = "";
  const head = $(`${slot}_table`).querySelector("thead"); if (head) head.innerHTML = "";
  Plotly.purge(`${slot}_chart`); $(`${slot}_panel`).style.display = "none";
}
function panelError(slot, e) { clearPanel(slot); $(`${slot}_panel`).style.display = ""; $(`${slot}_error`).textContent = String(e.message || e); }
async function panelRun(slot, work) {
  clearPanel(slot); panels.busy[slot] = true; syncPanels();
  try { await work(); } catch (e) { if (!e.cancelled) panelError(slot, e); }
  finally { panels.busy[slot] = false; syncPanels(); }
}
function notes(slot, list) { $(`${slot}_notes`).innerHTML = (list || []).map((n) => `<li>${n.replace(/</g, "&lt;")}</li>`).join(""); }
const steadyOk = (res) => !res.stationarity || res.stationarity.stationary !== false;
const g1 = (v) => +(+v).toPrecision(6);

// ---- host tier (DRAM) ------------------------------------------------------------------------------------------
function dramGrid(d) { return [...new Set([0, d / 8, d / 4, d / 2, d, 2 * d, 4 * d, 8 * d].map(g1))].sort((a, b) => a - b); }
function runTiers(sim) {
  return panelRun("tiers", async () => {
    const s = await panelSource(), kv = await panelKv(), d = g1(num("dram_gb"));
    const fields = { ...s.fields, tier: $("tier").value, hbm_blocks: [kv.N], dram_gb: dramGrid(d), ...modelFields(),
      estimate: sim ? "also" : "only", measure: s.kvhitTrace ? "window" : "all" };
    const res = await panelPost("/api/tiers", fields, { ...s.files, ...modelFiles() }, "tiers");
    panels.tiers = { res, kv, d, sim, fields }; drawTiers();
  });
}
function drawTiers() {
  const { res, kv, d, sim } = panels.tiers, x = res.dram_gib, pos = x.map((v, i) => v > 0 ? i : -1).filter((i) => i >= 0);
  const est = res.h_source === "estimate" ? res.h[0] : res.h_estimate[0];
  const gpuEst = res.h_gpu_estimate ? res.h_gpu_estimate[0] : res.h_gpu[0];
  const shown = sim && steadyOk(res), data = [], shapes = [], ann = [];
  const hover = (what) => `${what}<br>DRAM %{x:,.4g} GiB → h = %{y:.4f}<extra></extra>`;
  data.push({ name: `${TIER_NAME[$("tier").value] || res.tier} — two-tier estimate`, x: pos.map((i) => x[i]), y: pos.map((i) => est[i]),
    mode: "lines+markers", line: { width: 3, color: "#d9480f", dash: "dot" }, hovertemplate: hover("estimate") });
  if (shown) data.push({ name: `${res.tier} — simulated (exact)`, x: pos.map((i) => x[i]), y: pos.map((i) => res.h[0][i]),
    mode: "lines+markers", line: { width: 2, color: "#1c7ed6" }, hovertemplate: hover("simulated") });
  data.reverse();  // the simulation under the dotted estimate: both stay visible where they agree
  const hb = shown ? res.h_gpu[0] : gpuEst;
  if (hb != null) {
    shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: hb, y1: hb, line: { dash: "dash", color: "#888" } });
    ann.push({ xref: "paper", x: 0.01, xanchor: "left", y: hb, yshift: 9, showarrow: false, text: `HBM only (no DRAM tier): h = ${hb.toFixed(3)}` });
  }
  shapes.push({ type: "line", yref: "paper", y0: 0, y1: 1, x0: d, x1: d, line: { color: "#c33" } });
  ann.push({ yref: "paper", y: 1, x: Math.log10(d), xanchor: "left", xshift: 4, yshift: 8, showarrow: false, text: `your DRAM: ${d} GiB` });
  if (sim && !shown) ann.push({ xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { color: "#c00" },
    bgcolor: "rgba(255,255,255,0.9)", bordercolor: "#c00", text: "simulation not shown: its window did not reach steady state" });
  $("tiers_panel").style.display = "";
  Plotly.react("tiers_chart", data, {
    margin: { t: 26, r: 20, b: 60, l: 70 }, shapes, annotations: ann, hovermode: "closest",
    legend: { orientation: "h", x: 0, y: -0.25, yanchor: "top" },
    xaxis: { type: "log", title: { text: `DRAM for the KV tier (GiB over all ${kv.model} ranks, log scale)` } },
    yaxis: { title: { text: "token hit ratio h (GPU + host)" }, range: [0, 1] },
  }, { displaylogo: false, responsive: true });
  const at = (k) => x.indexOf(g1(k)), f = (row, k) => at(k) < 0 ? "—" : f4(row[at(k)]);
  const rows = [
    ["HBM per replica (your KV budget)", `${kv.N.toLocaleString()} blocks of ${kv.block_size} tokens = ${kv.kv_gib.toFixed(1)} GiB`],
    ["tier", res.tier], ["requests counted", res.measure === "window" ? "after the trace's warm-up (every request fills the caches)" : "every request, from an empty cache"],
    ["h, HBM only — estimate", f4(gpuEst)],
    [`h with ${d} GiB DRAM — estimate`, f(est, d)], [`h with ${g1(2 * d)} GiB DRAM (2×) — estimate`, f(est, 2 * d)],
  ];
  if (sim) {
    const sv = (k) => shown ? f(res.h[0], k) : "not shown: not stationary";
    rows.push(["h, HBM only — simulated", shown ? f4(res.h_gpu[0]) : "not shown: not stationary"],
      [`h with ${d} GiB DRAM — simulated`, sv(d)], [`h with ${g1(2 * d)} GiB DRAM (2×) — simulated`, sv(2 * d)]);
  }
  if (res.stationarity) rows.push(["measured window", res.stationarity.stationary ? "steady state" : "NOT stationary"]);
  $("tiers_table").querySelector("tbody").innerHTML = rows.map(([k, v]) => `<tr><td>${k}</td><td data-k="${k}">${v}</td></tr>`).join("");
  notes("tiers", res.notes);
}

// ---- fleet -------------------------------------------------------------------------------------------------------
function replicaGrid(R) {
  const out = new Set([R, 2 * R].filter((r) => r <= 4096));
  for (let r = 1; r <= 2 * R && r <= 4096; r *= 2) out.add(r);
  return [...out].sort((a, b) => a - b);
}
function runFleet() {
  return panelRun("fleet", async () => {
    const s = await panelSource(), kv = await panelKv(), R = Math.round(num("replicas"));
    const fields = { ...s.fields, replicas: replicaGrid(R), router: [$("router").value], N: [kv.N] };
    const res = await panelPost("/api/fleet", fields, s.files, "fleet");
    panels.fleet = { res, kv, R, tp: num("tp") || 1, fields }; drawFleet();
  });
}
function drawFleet() {
  const { res, kv, R, tp } = panels.fleet, rows = res.rows, x = rows.map((r) => r.replicas), router = rows[0].router;
  const shown = steadyOk(res), data = [], ann = [];
  const hover = (what) => `${what}<br>R = %{x} replicas → fleet h = %{y:.4f}<extra></extra>`;
  if (shown) data.push({ name: `${router} — simulated (exact)`, x, y: rows.map((r) => r.token_hit_ratio), mode: "lines+markers",
    line: { width: 2, color: "#1c7ed6" }, hovertemplate: hover("simulated") });
  if (rows.some((r) => r.estimate != null)) data.push({ name: `${router} — fleet estimate`, x, y: rows.map((r) => r.estimate),
    mode: "lines+markers", line: { width: 3, color: "#d9480f", dash: "dot" }, hovertemplate: hover("estimate") });
  if (!shown) ann.push({ xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false, font: { color: "#c00" },
    bgcolor: "rgba(255,255,255,0.9)", bordercolor: "#c00", text: "simulation not shown: its window did not reach steady state" });
  ann.push({ yref: "paper", y: 1, x: Math.log10(R), xanchor: "left", xshift: 4, yshift: 8, showarrow: false, text: `your fleet: R = ${R} (${R * tp} GPUs)` });
  $("fleet_panel").style.display = "";
  Plotly.react("fleet_chart", data, {
    margin: { t: 26, r: 20, b: 60, l: 70 }, hovermode: "closest", annotations: ann,
    shapes: [{ type: "line", yref: "paper", y0: 0, y1: 1, x0: R, x1: R, line: { color: "#c33" } }],
    legend: { orientation: "h", x: 0, y: -0.25, yanchor: "top" },
    xaxis: { type: "log", tickvals: x, ticktext: x.map(String), title: { text: `replicas R (each ${kv.N.toLocaleString()} blocks = ${kv.kv_gib.toFixed(1)} GiB KV, tp = ${tp}; log scale)` } },
    yaxis: { title: { text: "fleet token hit ratio h" }, range: [0, 1] },
  }, { displaylogo: false, responsive: true });
  $("fleet_table").querySelector("thead").innerHTML = "<tr><th>R</th><th>GPUs</th><th>fleet h — simulated</th><th>estimate</th><th>busiest replica share</th><th>note</th></tr>";
  $("fleet_table").querySelector("tbody").innerHTML = rows.map((r) => {
    const note = [r.collapsed ? "collapsed onto one replica" : "", r.session_lookahead ? "look-ahead sessions: upper bound" : ""].filter(Boolean).join("; ");
    return `<tr data-r="${r.replicas}"${r.replicas === R ? ' class="mine"' : ""}><td>${r.replicas}</td><td>${r.replicas * tp}</td>` +
      `<td data-k="h">${shown ? f4(r.token_hit_ratio) : "not shown: not stationary"}</td><td data-k="estimate">${f4(r.estimate)}</td>` +
      `<td>${(100 * r.busiest_replica_share).toFixed(1)} %</td><td data-k="note">${note}</td></tr>`;
  }).join("");
  notes("fleet", res.notes);
}

// ---- wiring: a main-input change or a main error clears both panels ---------------------------------------------
(function wire() {
  for (const slot of ["tiers", "fleet"]) $(`${slot}_panel`).style.display = "none";
  for (const el of document.querySelectorAll("#inputs input, #inputs select")) {
    if (el.closest("#tiers_box, #fleet_box") || el.id === "xunit") continue;
    el.addEventListener(el.type === "range" ? "input" : "change", () => { clearPanel("tiers"); clearPanel("fleet"); syncPanels(); });
  }
  for (const id of ["tier", "dram_gb"]) $(id).addEventListener("change", () => clearPanel("tiers"));
  for (const id of ["replicas", "router"]) $(id).addEventListener("change", () => clearPanel("fleet"));
  $("tiers_run").addEventListener("click", () => runTiers(false));
  $("tiers_sim").addEventListener("click", () => runTiers(true));
  $("fleet_run").addEventListener("click", runFleet);
  const mainClear = clearResults;
  clearResults = function () { mainClear(); clearPanel("tiers"); clearPanel("fleet"); syncPanels(); };  // errors clear
  const mainDraw = draw;
  draw = function () { mainDraw(); syncPanels(); };  // the main chart's answer enables the panels
  syncPanels();
})();
