// kvhit planner page: every number comes from the JSON API (the service layer); this file only draws.
"use strict";
const $ = (id) => document.getElementById(id);
const FIELDS = ["model", "accelerator", "kv_gb", "lam0", "mean_turns", "w_mean", "x_mean", "y_mean", "engine",
  "compare", "target", "n_min", "n_max", "xunit"];
const state = { kv: null, est: null, sim: null, traceCurve: null, job: null, busy: false, pending: false };
window.kvhit = state;  // read by the browser tests

function radio(name) { return document.querySelector(`input[name=${name}]:checked`).value; }
function setRadio(name, v) { const r = document.querySelector(`input[name=${name}][value="${v}"]`); if (r) r.checked = true; }
function lam0() { return +Math.pow(10, +$("lam0").value).toPrecision(3); }
function num(id) { return +$(id).value; }

// ---- the shareable URL: every input in the fragment ----------------------------------------------------------
function writeUrl() {
  const p = new URLSearchParams();
  for (const f of FIELDS) p.set(f, f === "lam0" ? lam0() : $(f).value);
  p.set("budget", radio("budget")); p.set("workload", radio("workload"));
  history.replaceState(null, "", "#" + p.toString());
}
function readUrl() {
  const p = new URLSearchParams(location.hash.slice(1));
  for (const f of FIELDS) if (p.has(f)) $(f).value = f === "lam0" ? Math.log10(+p.get(f)) : p.get(f);
  if (p.has("budget")) setRadio("budget", p.get("budget"));
  if (p.has("workload")) setRadio("workload", p.get("workload"));
}

// ---- API: JSON or multipart; 202 → a job polled until it ends (progress, cancel) -----------------------------
async function api(path, fields, files) {
  let init = { method: "POST" };
  const up = Object.entries(files || {}).filter(([, f]) => f);
  if (up.length) {
    const fd = new FormData(); fd.append("request", JSON.stringify(fields));
    for (const [k, f] of up) fd.append(k, f, f.name);
    init.body = fd;
  } else { init.headers = { "content-type": "application/json" }; init.body = JSON.stringify(fields); }
  const r = await fetch(path, init);
  const body = await r.json();
  if (r.status === 202) return pollJob(body);
  if (!r.ok) throw new Error(body.detail || r.statusText);
  return body;
}
async function pollJob(job) {
  state.job = job.id; $("cancel").disabled = false;
  try {
    while (job.status === "queued" || job.status === "running") {
      const pr = job.progress || {};
      $("progress").value = pr.total ? pr.done / pr.total : 0;
      $("progress_what").textContent = job.status === "queued" ? "queued" : (pr.what || "running");
      await new Promise((res) => setTimeout(res, 250));
      job = await (await fetch(`/api/jobs/${job.id}`)).json();
    }
  } finally { state.job = null; $("cancel").disabled = true; }
  $("progress").value = job.status === "done" ? 1 : 0;
  $("progress_what").textContent = job.status === "done" ? (job.cached ? "done (cached)" : "done") : job.status;
  if (job.status === "done") return job.result;
  throw new Error(job.error || `job ${job.status}`);
}
function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

// ---- inputs → request fields ---------------------------------------------------------------------------------
function budgetFields() {
  return radio("budget") === "kv_gb" ? { kv_gb: num("kv_gb") } : { accelerator: $("accelerator").value };
}
function modelFields() { return $("model_config").files[0] ? {} : { model: $("model").value }; }
function modelFiles() { return { model_config: $("model_config").files[0] }; }
function specFields() {
  return { lam0: lam0(), mean_turns: num("mean_turns"), x_mean: num("x_mean"), y_mean: num("y_mean"), w_mean: num("w_mean") };
}
function grid(points) {
  const a = num("n_min"), b = num("n_max"), out = new Set();
  for (let i = 0; i < points; i++) out.add(Math.floor(a * Math.pow(b / a, i / (points - 1))));
  return [...out].sort((x, y) => x - y);
}
function traceFile() { return radio("workload") === "trace" ? $("trace").files[0] : null; }
function sharegpt() { return radio("workload") === "sharegpt"; }
function refresh() { return traceFile() ? refreshTrace() : sharegpt() ? refreshShareGPT() : refreshFast(); }

// a curve answer is flat: {"N": [...], "<curve label>": [h per N], ..., "h_max": ...}
function curvesOf(res) {
  return Object.entries(res).filter(([k, v]) => k !== "N" && k !== "feasible" && !k.startsWith("refused")
    && Array.isArray(v) && v.length === res.N.length);
}
// ---- the chart -----------------------------------------------------------------------------------------------
function draw() {
  const gib = $("xunit").value === "gib" && state.kv;
  const bpb = state.kv ? state.kv.bytes_per_block : 0;
  const x = (Ns) => gib ? Ns.map((n) => n * bpb / 2 ** 30) : Ns;
  const data = [];
  let hmax = null;
  if (state.est) {
    data.push({ name: "estimator (eq. 32)", x: x(state.est.N), y: state.est.h, mode: "lines", line: { width: 3 } });
    hmax = state.est.h_max;
  }
  for (const src of [state.traceCurve, state.sim]) {
    if (!src) continue;
    for (const [k, ys] of curvesOf(src))
      data.push({ name: k, x: x(src.N), y: ys, mode: "lines", line: { dash: src === state.sim ? "dot" : "solid" } });
    if (src.h_max != null) hmax = src.h_max;
  }
  const shapes = [], notes = [];
  if (hmax != null) {
    shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: hmax, y1: hmax, line: { dash: "dash", color: "#888" } });
    notes.push({ xref: "paper", x: 0.01, y: hmax, text: `h_max = ${hmax.toFixed(4)}`, showarrow: false, yshift: 9 });
  }
  if (state.kv && state.kv.N) {
    const bx = gib ? state.kv.N * bpb / 2 ** 30 : state.kv.N;
    shapes.push({ type: "line", yref: "paper", y0: 0, y1: 1, x0: bx, x1: bx, line: { color: "#c33" } });
    notes.push({ yref: "paper", y: 1, x: Math.log10(bx), text: `budget: ${state.kv.N.toLocaleString()} blocks = ${state.kv.kv_gib.toFixed(1)} GiB`, showarrow: false, yshift: 8 });
  }
  Plotly.react("chart", data, {
    margin: { t: 30, r: 20, b: 50, l: 60 }, shapes, annotations: notes, legend: { x: 0.99, xanchor: "right", y: 0.03, yanchor: "bottom", bgcolor: "rgba(255,255,255,0.8)" },
    xaxis: { type: "log", title: gib ? `KV memory (GiB of ${state.kv.model})` : "capacity N (blocks)" },
    yaxis: { title: "hit ratio h", range: [0, 1] },
  }, { displaylogo: false, responsive: true });
}
function table(id, rows) {
  $(id).querySelector("tbody").innerHTML = rows.map(([k, v]) => `<tr><td>${k}</td><td data-k="${k}">${v}</td></tr>`).join("");
}
const f4 = (v) => v == null ? "—" : (+v).toFixed(4);
function planRows(p) {
  const rows = [
    ["capacity", p.capacity ? `${p.capacity.N.toLocaleString()} blocks (${p.capacity.kv_gib.toFixed(2)} GiB, ${p.capacity.accelerator})` : "—"],
    ["h at capacity", f4(p.h_at_capacity)],
    [`memory for h = ${p.target ?? "—"}`, p.N_for_target == null ? "—" : `${p.N_for_target.toLocaleString()} blocks = ${p.gib_for_target.toFixed(2)} GiB`],
    ["max λ0 for target", p.lam0_max_for_target == null ? "—" : `${p.lam0_max_for_target.toPrecision(4)} conv/s`],
    ["prefill tokens saved", p.saved_prefill_tokens_per_s == null ? "—" : `${p.saved_prefill_tokens_per_s.toFixed(1)} tokens/s (${(100 * p.saved_fraction).toFixed(2)} %)`],
    ["h_max", f4(p.h_max)], ["estimator · metric", `${p.estimator} · ${p.metric}`],
  ];
  const c = p.compare;
  if (c && c.engine === "sglang") {
    const ci = (k) => c[`h_${k}`] == null ? "infeasible" : `${f4(c[`h_${k}`])} ± ${f4(c[`h_${k}_ci95`])}`;
    rows.push([`vLLM (${c.vllm_mode}) at ${c.vllm_blocks.toLocaleString()} blocks`, ci("vllm")]);
    rows.push([`SGLang (page ${c.page_size}, ${c.evict_policy}) at ${c.sglang_tokens.toLocaleString()} tokens`, ci("sglang")]);
    rows.push(["SGLang − vLLM (paired, 95%)", c.difference == null ? "—" : `${c.difference >= 0 ? "+" : ""}${f4(c.difference)} ± ${f4(c.difference_ci95)} → ${c.better}`]);
  } else if (c && c.engine) rows.push([`vs ${c.engine}`, `h = ${f4(c.h_at_capacity)}, gain ${f4(c.gain)}`]);
  return rows;
}

// ---- refreshes -----------------------------------------------------------------------------------------------
async function refreshKv() {
  state.kv = await api("/api/kv", { ...modelFields(), ...budgetFields() }, modelFiles());
}
async function refreshFast() {
  // the estimator curve and the paper plan: closed forms, answered inside the request
  if (state.busy) { state.pending = true; return; }
  state.busy = true;
  try {
    writeUrl(); showError(null);
    for (const id of ["lam0", "mean_turns", "w_mean"]) $(id + "_v").textContent = id === "lam0" ? lam0() : num(id);
    await refreshKv();
    if (traceFile()) { draw(); return; }
    state.traceCurve = null;
    const e = await api("/api/estimate", { N: grid(1000), ...specFields() });
    state.est = { N: e.estimates.map((r) => r.N), h: e.estimates.map((r) => r.h), h_max: e.moments.h_max_hash };
    draw();
    const p = await api("/api/plan", { engine: "paper", target: num("target"), ...specFields(), ...modelFields(), ...budgetFields() }, modelFiles());
    state.plan = p; table("plan", planRows(p));
  } catch (e) { showError(e); } finally {
    state.busy = false;
    if (state.pending) { state.pending = false; refreshFast(); }
  }
}
async function refreshTrace() {
  // an uploaded trace: the same readers as the CLI, in a job (estimators and Algorithm 1 over capacity)
  const f = traceFile(); if (!f) return;
  try {
    showError(null); state.est = null; state.sim = null; state.traceCurve = null; state.plan = null;
    table("plan", []);
    await refreshKv();
    state.traceCurve = await api("/api/curve", { n_min: num("n_min"), n_max: num("n_max"), points: 200,
      policies: ["content"], ...modelFields() }, { trace: f, ...modelFiles() });
    draw();
    const p = await api("/api/plan", { engine: "paper", target: num("target"), ...modelFields(), ...budgetFields() }, { trace: f, ...modelFiles() });
    state.plan = p; table("plan", planRows(p));
  } catch (e) { state.traceCurve = null; draw(); showError(e); }
}
async function refreshShareGPT() {
  // the bundled ShareGPT trace, built by the service (cached there): estimators and Algorithm 1 in a job
  try {
    writeUrl(); showError(null); state.est = null; state.sim = null; state.traceCurve = null; state.plan = null;
    table("plan", []);
    await refreshKv();
    state.traceCurve = await api("/api/curve", { sharegpt: true, n_min: num("n_min"), n_max: num("n_max"), points: 200,
      policies: ["content"], ...modelFields() }, modelFiles());
    draw();
    const p = await api("/api/plan", { sharegpt: true, engine: "paper", target: num("target"), ...modelFields(), ...budgetFields() }, modelFiles());
    state.plan = p; table("plan", planRows(p));
  } catch (e) { state.traceCurve = null; draw(); showError(e); }
}
async function simulate() {
  try {
    showError(null);
    const fields = { n_min: num("n_min"), n_max: num("n_max"), points: 100, estimates: false,
      policies: [$("engine").value], ...modelFields() };
    const f = traceFile();
    if (sharegpt()) fields.sharegpt = true;
    else if (!f) Object.assign(fields, specFields(), { conversations: 4000, seed: 0 });
    state.sim = await api("/api/curve", fields, { trace: f, ...modelFiles() });
    draw();
  } catch (e) { showError(e); }
}
async function enginePlan() {
  try {
    showError(null);
    const f = traceFile();
    const fields = { engine: $("engine").value, target: num("target"), ...modelFields(), ...budgetFields(), ...(f ? {} : sharegpt() ? { sharegpt: true } : specFields()) };
    if ($("compare").value) fields.compare = $("compare").value;
    if (fields.engine === "content" || fields.compare === "content") fields.metric = "blocks";
    const p = await api("/api/plan", fields, { trace: f, ...modelFiles() });
    state.enginePlan = p; table("engines", planRows(p));
  } catch (e) { showError(e); }
}

async function init() {
  const pre = await (await fetch("/api/presets")).json();
  $("model").innerHTML = pre.models.map((m) => `<option>${m}</option>`).join("");
  $("accelerator").innerHTML = pre.accelerators.map((m) => `<option>${m}</option>`).join("");
  const pick = (sel, want) => { for (const o of sel.options) if (o.value.toLowerCase() === want) sel.value = o.value; };
  pick($("model"), "qwen3-8b"); pick($("accelerator"), "h100");
  readUrl();
  for (const el of document.querySelectorAll("#inputs input, #inputs select")) {
    if (el.id === "trace") continue;
    el.addEventListener(el.type === "range" ? "input" : "change", refresh);
  }
  $("trace").addEventListener("change", () => { setRadio("workload", "trace"); writeUrl(); refreshTrace(); });
  $("xunit").addEventListener("change", draw);
  $("simulate").addEventListener("click", simulate);
  $("compare_run").addEventListener("click", enginePlan);
  $("cancel").addEventListener("click", () => state.job && fetch(`/api/jobs/${state.job}`, { method: "DELETE" }));
  await refresh();
  document.body.dataset.ready = "1";
}
init();
