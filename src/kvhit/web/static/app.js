// kvhit planner page: every number comes from the JSON API (the service layer); this file only draws.
// The chart leads with the user's engine (its simulated curve and its engine-aware estimate); the paper's
// idealisation (whole-conversation LRU, eq. 32/39) is a thin, labelled reference. A simulation whose window did not
// reach steady state is never drawn as an answer.
"use strict";
const $ = (id) => document.getElementById(id);
const FIELDS = ["model", "tp", "accelerator", "kv_gb", "lam0", "mean_turns", "w_mean", "x_mean", "y_mean", "engine",
  "compare", "target", "n_min", "n_max", "xunit"];
const ENGINE = { "vllm": "vLLM ≥ 0.24", "vllm-0.23": "vLLM ≤ 0.23", "content": "whole-conversation LRU (Algorithm 1)" };
const SIM_KEY = { "vllm": "vLLM ≥ 0.24 (block cache)", "vllm-0.23": "vLLM ≤ 0.23 (block cache)", "content": "Algorithm 1 (content LRU)" };
const EST_KEY = { "vllm": "estimate: vLLM ≥ 0.24 (engine-aware)", "vllm-0.23": "estimate: vLLM ≤ 0.23 (engine-aware)", "content": "estimate: Algorithm 1 (engine-aware)" };
const PAPER_KEY = "estimate: paper eq. (39), F̂";
const SHORT = { "vllm": "vLLM ≥ 0.24", "vllm-0.23": "vLLM ≤ 0.23", "content": "Algorithm 1" };
// the engine's own lines of a curve answer: a kvhit trace/spec (block-weighted) or a production trace (tokens)
function simKey(c, e) { return [SIM_KEY[e], `${SHORT[e]} token hit ratio`].find((k) => Array.isArray(c[k])); }
function estKey(c, e) { return [EST_KEY[e], `estimate: ${SHORT[e]} (agentic)`].find((k) => Array.isArray(c[k])); }
const state = { kv: null, est: null, curve: null, plan: null, job: null, busy: false, pending: false, requests: 0,
  gen: 0, curveP: null };
window.kvhit = state;  // read by the browser tests

function radio(name) { return document.querySelector(`input[name=${name}]:checked`).value; }
function setRadio(name, v) { const r = document.querySelector(`input[name=${name}][value="${v}"]`); if (r) r.checked = true; }
function lam0() { return +Math.pow(10, +$("lam0").value).toPrecision(3); }
function num(id) { return +$(id).value; }
function engine() { return $("engine").value; }

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
  state.requests += 1;
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
  if (state.job && state.job !== job.id) fetch(`/api/jobs/${state.job}`, { method: "DELETE" });  // superseded
  state.job = job.id; $("cancel").disabled = false;
  const mine = job.id;
  try {
    while (job.status === "queued" || job.status === "running") {
      const pr = job.progress || {};
      $("progress").value = pr.total ? pr.done / pr.total : 0;
      $("progress_what").textContent = job.status === "queued" ? "queued" : (pr.what || "running");
      await new Promise((res) => setTimeout(res, 200));
      job = await (await fetch(`/api/jobs/${job.id}`)).json();
    }
  } finally { if (state.job === mine) { state.job = null; $("cancel").disabled = true; } }
  $("progress").value = job.status === "done" ? 1 : 0;
  $("progress_what").textContent = job.status === "done" ? (job.cached ? "done (cached)" : "done") : job.status;
  if (job.status === "done") return job.result;
  if (job.status === "cancelled") throw Object.assign(new Error("cancelled"), { cancelled: true });
  throw new Error(job.error || `job ${job.status}`);
}
function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }
function clearResults() {
  // an error or a new question: no number from an older question stays on screen
  state.kv = null; state.est = null; state.curve = null; state.plan = null;
  table("plan", []); table("engines", []); $("warn").textContent = ""; draw();
}

// ---- inputs → request fields ---------------------------------------------------------------------------------
function budgetFields() {
  return radio("budget") === "kv_gb" ? { kv_gb: num("kv_gb") } : { accelerator: $("accelerator").value };
}
function modelFields() { return { ...($("model_config").files[0] ? {} : { model: $("model").value }), ...(num("tp") > 1 ? { tp: num("tp") } : {}) }; }
function modelFiles() { return { model_config: $("model_config").files[0] }; }
function specFields() {
  return { lam0: lam0(), mean_turns: num("mean_turns"), x_mean: num("x_mean"), y_mean: num("y_mean"), w_mean: num("w_mean") };
}
function grid(points) {
  const a = num("n_min"), b = num("n_max"), out = new Set();
  for (let i = 0; i < points; i++) out.add(Math.floor(a * Math.pow(b / a, i / (points - 1))));
  return [...out].sort((x, y) => x - y);
}
function workload() { return radio("workload"); }
function traceFile() { return workload() === "trace" ? $("trace").files[0] || null : null; }

// an uploaded file's kind, from its first bytes: Parquet (kvhit trace), Mooncake JSONL, WEKA JSON, ShareGPT JSON
async function traceKind(f) {
  const head = new Uint8Array(await f.slice(0, 4).arrayBuffer());
  if (String.fromCharCode(...head) === "PAR1") return "trace";
  const text = (await f.slice(0, 65536).text()).trimStart();
  if (text.startsWith("[") && /"conversations?"|"from"\s*:|"human"|"gpt"/.test(text)) return "sharegpt";
  if (text.startsWith("{") && /"hash_ids"/.test(text.split("\n")[0])) return "blocks_trace";  // Mooncake
  if (text.startsWith("{") || text.startsWith("[")) return "blocks_trace";  // WEKA (the server names what it lacks)
  return "unknown";
}
async function traceUpload() {
  const f = traceFile(); if (!f) return null;
  const kind = await traceKind(f);
  $("trace_kind").textContent = { trace: "kvhit Parquet trace", blocks_trace: "production block-id trace (Mooncake/WEKA)",
    sharegpt: "ShareGPT JSON", unknown: "unknown format" }[kind];
  if (kind === "sharegpt")
    throw new Error(`${f.name}: ShareGPT JSON is tokenized by the CLI: kvhit trace sharegpt --source ${f.name} --out t.parquet, then upload t.parquet`);
  if (kind === "unknown") throw new Error(`${f.name}: not a kvhit Parquet trace, a Mooncake .jsonl or a WEKA .json`);
  return { kind, file: f };
}

// ---- controls that do not apply are disabled -----------------------------------------------------------------
function syncControls() {
  const spec = workload() === "scm";
  for (const id of ["lam0", "mean_turns", "w_mean", "x_mean", "y_mean"]) $(id).disabled = !spec;
  $("kv_gb").disabled = radio("budget") !== "kv_gb"; $("accelerator").disabled = radio("budget") !== "accelerator";
  $("model").disabled = !!$("model_config").files[0];
  $("lam0_v").textContent = lam0(); $("mean_turns_v").textContent = num("mean_turns"); $("w_mean_v").textContent = num("w_mean");
}

// ---- the chart -----------------------------------------------------------------------------------------------
function steady(res) { return !res || !res.stationarity || res.stationarity.stationary !== false; }
function draw() {
  const gib = $("xunit").value === "gib" && state.kv;
  const bpb = state.kv ? state.kv.bytes_per_block : 0;
  const x = (Ns) => gib ? Ns.map((n) => n * bpb / 2 ** 30) : Ns;
  const e = engine(), name = ENGINE[e], data = [], notes = [], shapes = [];
  const c = state.curve;
  if (c) {
    const ek = estKey(c, e), sk = simKey(c, e);
    if (ek) data.push({ name: `${name} — ${ek.endsWith("(agentic)") ? "agentic" : "engine-aware"} estimate`, x: x(c.N), y: c[ek], mode: "lines", line: { width: 3, color: "#d9480f" } });
    if (sk && steady(c)) data.push({ name: `${name} — simulated (exact)`, x: x(c.N), y: c[sk], mode: "lines", line: { width: 2, color: "#1c7ed6" } });
  }
  const paper = c && c[PAPER_KEY] ? { N: c.N, h: c[PAPER_KEY] } : state.est;
  if (paper) data.push({ name: "paper's idealisation (whole-conversation LRU, eq. 39) — reference", x: x(paper.N), y: paper.h, mode: "lines", line: { width: 1.2, dash: "dot", color: "#868e96" } });
  if (c && !steady(c)) {
    notes.push({ xref: "paper", yref: "paper", x: 0.5, y: 0.55, showarrow: false, font: { color: "#c00", size: 13 },
      bgcolor: "rgba(255,255,255,0.9)", bordercolor: "#c00", text: "simulation not shown: its window did not reach steady state" });
  }
  const hmax = (c && c.h_max != null) ? c.h_max : state.est ? state.est.h_max : null;
  if (hmax != null) {
    shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: hmax, y1: hmax, line: { dash: "dash", color: "#888" } });
    const src = c && c.h_max != null ? "eq. 28 on the simulated workload" : "paper eq. 28 for this spec";
    notes.push({ xref: "paper", x: 0.01, xanchor: "left", y: hmax, text: `h_max = ${hmax.toFixed(3)} (${src}: infinite cache, every history hits)`, showarrow: false, yshift: 9 });
  }
  if (state.kv && state.kv.N) {
    const bx = gib ? state.kv.N * bpb / 2 ** 30 : state.kv.N;
    shapes.push({ type: "line", yref: "paper", y0: 0, y1: 1, x0: bx, x1: bx, line: { color: "#c33" } });
    notes.push({ yref: "paper", y: 1, x: Math.log10(bx), text: `your KV budget: ${state.kv.N.toLocaleString()} blocks = ${state.kv.kv_gib.toFixed(1)} GiB`, showarrow: false, yshift: 8 });
  }
  const b = state.kv ? state.kv.block_size : 128;
  Plotly.react("chart", data, {
    margin: { t: 30, r: 20, b: 60, l: 70 }, shapes, annotations: notes, hovermode: "x unified",
    legend: { orientation: "h", x: 0, y: -0.22, yanchor: "top" },
    xaxis: { type: "log", title: { text: gib ? `KV memory (GiB of ${state.kv.model} KV, log scale)` : `KV capacity N (blocks of ${b} tokens, log scale)` } },
    yaxis: { title: { text: c && c.describe ? "token hit ratio (vLLM prefix_cache_hits / queries)" : "hit ratio h (share of prompt blocks served from cache)" }, range: [0, 1] },
  }, { displaylogo: false, responsive: true });
}
function table(id, rows) {
  $(id).querySelector("tbody").innerHTML = rows.map(([k, v]) => `<tr><td>${k}</td><td data-k="${k}">${v}</td></tr>`).join("");
}
const f4 = (v) => v == null ? "—" : (+v).toFixed(4);
// the engine's h at the budget, read off its curve (log-linear between the two nearest capacities)
function atBudget(N, ys) {
  if (!state.kv || !N || !ys) return null;
  const n = state.kv.N; let i = N.findIndex((v) => v >= n);
  if (i <= 0) return i === 0 && N[0] === n ? ys[0] : null;
  const t = (Math.log(n) - Math.log(N[i - 1])) / (Math.log(N[i]) - Math.log(N[i - 1]));
  return ys[i - 1] == null || ys[i] == null ? null : ys[i - 1] + t * (ys[i] - ys[i - 1]);
}
function engineRows() {
  const c = state.curve, e = engine(); if (!c) return [];
  const rows = [], sk = simKey(c, e), ek = estKey(c, e);
  if (sk) rows.push([`${ENGINE[e]} at your budget — simulated`, steady(c) ? f4(atBudget(c.N, c[sk])) : "not shown: not stationary"]);
  if (ek) rows.push([`${ENGINE[e]} at your budget — estimate`, f4(atBudget(c.N, c[ek]))]);
  if (c.stationarity) rows.push(["simulation window", c.stationarity.stationary ? "steady state" : "NOT stationary"]);
  return rows;
}
function planRows(p) {
  const rows = [
    ["capacity", p.capacity ? `${p.capacity.N.toLocaleString()} blocks (${p.capacity.kv_gib.toFixed(2)} GiB, ${p.capacity.accelerator})` : "—"],
    [`h at capacity (${p.estimator})`, f4(p.h_at_capacity)],
    [`memory for h = ${p.target ?? "—"}`, p.N_for_target == null ? "—" : `${p.N_for_target.toLocaleString()} blocks = ${p.gib_for_target.toFixed(2)} GiB`],
    ["max λ0 for target", p.lam0_max_for_target == null ? "—" : `${p.lam0_max_for_target.toPrecision(4)} conv/s`],
    ["prefill tokens saved", p.saved_prefill_tokens_per_s == null ? "—" : `${p.saved_prefill_tokens_per_s.toFixed(1)} tokens/s (${(100 * p.saved_fraction).toFixed(2)} %)`],
    ["h_max (paper eq. 28)", f4(p.h_max)], ["estimator · metric", `${p.estimator} · ${p.metric}`],
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
function showPlan() { table("plan", [...engineRows(), ...(state.plan ? planRows(state.plan) : [])]); }
function showWarn() {
  const st = state.curve && state.curve.stationarity;
  $("warn").textContent = st && !st.stationary ? `Simulation hidden — ${st.message}` : "";
}

// ---- one refresh per input burst (coalesced): ONE request (/api/planner: kv, the paper reference and the plan), at
// most one in flight — input events while it runs are folded into the next request, of the latest inputs; the
// engine's curve (a simulation job, seconds) once the inputs rest for CURVE_DELAY ms. A newer question never waits for an older
// question's simulation: that job is cancelled (pollJob) and its answer, if it still comes, is dropped (state.gen).
const CURVE_DELAY = 250;
let timer = null, curveTimer = null, curveWaiter = null;
function refresh() { syncControls(); writeUrl(); clearTimeout(timer); timer = setTimeout(run, 0); }
async function run() {
  if (state.busy) { state.pending = true; return; }
  state.busy = true;
  const gen = ++state.gen;
  try {
    showError(null);
    await question(gen);
  } catch (e) {
    if (!e.cancelled && gen === state.gen) { clearResults(); showError(e); }
  } finally {
    state.busy = false;
    if (state.pending) { state.pending = false; run(); }
  }
}
function scheduleCurve(src, files, gen, delay) {
  clearTimeout(curveTimer);
  if (curveWaiter) curveWaiter();  // a superseded schedule: release whoever waits on it
  return new Promise((resolve) => {
    curveWaiter = resolve;
    curveTimer = setTimeout(async () => {
      try { await engineCurve(src, files, gen); }
      catch (e) { if (!e.cancelled && gen === state.gen) { clearResults(); showError(e); } }
      finally { resolve(); }
    }, delay);
  });
}
function curveFields(src) {
  const f = { n_min: num("n_min"), n_max: num("n_max"), points: src === "scm" ? 60 : 200, policies: [engine()] };
  if (src === "scm") Object.assign(f, specFields(), { seed: 0 });
  if (src === "sharegpt") f.sharegpt = true;
  return f;
}
async function question(gen) {
  const src = workload(), up = src === "trace" ? await traceUpload() : null;
  if (src === "trace" && !up) { clearResults(); return; }
  const files = up ? { [up.kind]: up.file } : {};
  let kv, e, p;
  if (!up) {  // the SCM or ShareGPT: ONE request answers kv, the paper's reference curve and the plan (/api/planner)
    const work = src === "scm" ? { N: grid(200), ...specFields() } : { sharegpt: true };
    const a = await api("/api/planner", { target: num("target"), ...work, ...modelFields(), ...budgetFields() }, modelFiles());
    ({ kv, estimate: e, plan: p } = a);
  } else {  // an uploaded trace: reading it is a job (the plan), kv answers at once
    const kvP = api("/api/kv", { ...modelFields(), ...budgetFields() }, modelFiles());
    const planP = up.kind === "blocks_trace" ? Promise.resolve(null)
      : api("/api/plan", { engine: "paper", target: num("target"), ...modelFields(), ...budgetFields() }, { ...files, ...modelFiles() });
    [kv, p] = await Promise.all([kvP, planP]);
  }
  if (gen !== state.gen) return;  // a newer question is asked: this answer is late, never drawn
  state.kv = kv; state.plan = p; state.curve = null;
  state.est = e ? { N: e.estimates.map((r) => r.N), h: e.estimates.map((r) => r.h), h_max: e.moments.h_max_hash } : null;
  showWarn(); draw(); showPlan();
  state.curveP = scheduleCurve(src, files, gen, document.body.dataset.ready ? CURVE_DELAY : 0);
}
async function engineCurve(src, files, gen) {
  const c = await api("/api/curve", curveFields(src), files);
  if (gen !== undefined && gen !== state.gen) return;  // a newer question is on screen
  state.curve = c;
  showWarn(); draw(); showPlan();
}
async function rerun() {
  try { showError(null); const src = workload(), up = src === "trace" ? await traceUpload() : null;
    await engineCurve(src, up ? { [up.kind]: up.file } : {}); }
  catch (e) { if (!e.cancelled) { clearResults(); showError(e); } }
}
async function enginePlan() {
  try {
    showError(null);
    const src = workload(), up = src === "trace" ? await traceUpload() : null;
    const fields = { engine: engine(), target: num("target"), ...modelFields(), ...budgetFields(), ...(src === "scm" ? specFields() : src === "sharegpt" ? { sharegpt: true } : {}) };
    if ($("compare").value) fields.compare = $("compare").value;
    if (fields.engine === "content" || fields.compare === "content") fields.metric = "blocks";
    const p = await api("/api/plan", fields, { ...(up ? { [up.kind]: up.file } : {}), ...modelFiles() });
    state.enginePlan = p; table("engines", planRows(p));
  } catch (e) { if (!e.cancelled) { table("engines", []); showError(e); } }
}

async function init() {
  const pre = await (await fetch("/api/presets")).json();
  $("model").innerHTML = pre.models.map((m) => `<option>${m}</option>`).join("");
  $("accelerator").innerHTML = pre.accelerators.map((m) => `<option>${m}</option>`).join("");
  const pick = (sel, want) => { for (const o of sel.options) if (o.value.toLowerCase() === want) sel.value = o.value; };
  pick($("model"), "qwen3-8b"); pick($("accelerator"), "h100");
  readUrl();
  for (const el of document.querySelectorAll("#inputs input, #inputs select")) {
    if (el.id === "trace" || el.id === "xunit" || el.closest("#tiers_box, #fleet_box")) continue;  // panels.js
    el.addEventListener(el.type === "range" ? "input" : "change", refresh);
  }
  $("trace").addEventListener("change", () => { setRadio("workload", "trace"); refresh(); });
  $("xunit").addEventListener("change", () => { writeUrl(); draw(); });
  $("simulate").addEventListener("click", rerun);
  $("compare_run").addEventListener("click", enginePlan);
  $("cancel").addEventListener("click", () => state.job && fetch(`/api/jobs/${state.job}`, { method: "DELETE" }));
  syncControls(); draw();
  await run();
  await state.curveP;
  document.body.dataset.ready = "1";
}
init();
