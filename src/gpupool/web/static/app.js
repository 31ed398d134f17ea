// gpupool dashboard: reads the REST API with the user's token; no framework, no network but the API.
// Every text shown is a text node (never HTML), so names and reasons are data, not markup.
"use strict";

const state = { token: localStorage.getItem("gpupool-token") || "", workloads: [], sort: { key: "submittedAt", desc: true }, who: null, incidents: [] };
const ACTIVE = ["Pending", "Admitted", "Running", "AwaitingApproval"];

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}

function showError(msg) {
  const p = document.getElementById("error");
  p.textContent = msg; p.hidden = !msg;
}

async function api(path, options = {}) {
  const headers = { "Authorization": `Bearer ${state.token}`, ...(options.headers || {}) };
  const r = await fetch(path, { ...options, headers });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    // the API answers {"error": {"status", "message", "errors": [{"field", "problem"}]}}
    const e = body.error || {};
    const fields = (e.errors || []).map((x) => `${x.field}: ${x.problem}`).join("; ");
    const msg = e.message || r.statusText;
    throw new Error(`${r.status}: ${msg}${fields && !msg.includes(fields) ? " (" + fields + ")" : ""}`);
  }
  return body;
}

// every page of a list: the server answers at most `limit` items and a continue token
async function listAll(path) {
  const items = [];
  let token = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}limit=1000${token ? "&continue=" + encodeURIComponent(token) : ""}`);
    items.push(...page.items);
    token = page.metadata && page.metadata.continue;
  } while (token);
  return items;
}

const fmt = (v) => (v === null || v === undefined ? "∞" : (Math.round(v * 100) / 100).toString());

function age(iso) {
  if (!iso) return "";
  const s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
  if (s >= 2 * 86400) return `${Math.floor(s / 86400)}d`;
  if (s >= 2 * 3600) return `${Math.floor(s / 3600)}h`;
  if (s >= 60) return `${Math.floor(s / 60)}m`;
  return `${s}s`;
}

function bar(frac) {
  return el("div", { class: "bar", title: `${Math.round(frac * 100)}%` }, el("span", { style: `width:${Math.min(100, frac * 100)}%` }));
}

const workloadLink = (name) => el("a", { href: `#/workload/${encodeURIComponent(name)}` }, name);
const queueLink = (q) => el("a", { href: `#/#queue-${encodeURIComponent(q)}` }, q);

async function loadCluster() {
  const c = await api("/v1/cluster");
  document.getElementById("summary").textContent =
    `${c.nodes} nodes, ${c.gpus} GPUs · ${c.running} running, ${c.pending} pending · ${c.cycles} scheduling cycles`;
  const tb = document.querySelector("#pools tbody");
  tb.replaceChildren(...c.pools.map((p) => el("tr", {},
    el("td", {}, objectLink("pools", p.name)), el("td", {}, String(p.nodes)), el("td", {}, fmt(p.gpus)), el("td", {}, fmt(p.gpuAllocated)),
    el("td", {}, bar(p.gpus ? p.gpuAllocated / p.gpus : 0)), el("td", {}, p.preemptible ? "yes" : "no"),
    el("td", {}, String(p.pricePerGPUHour)))));
}

// the queue tree, depth first from the roots; a child's limit is capped by its ancestors'
function treeOrder(items) {
  const parent = new Map(items.map((i) => [i.queue, i.parent || null]));
  const kids = new Map();
  for (const [q, p] of parent) { if (!kids.has(p)) kids.set(p, []); kids.get(p).push(q); }
  const order = [];
  const walk = (p, depth) => { for (const q of (kids.get(p) || []).sort()) { order.push([q, depth]); walk(q, depth + 1); } };
  walk(null, 0);
  for (const q of parent.keys()) if (!order.some(([n]) => n === q)) order.push([q, 0]); // parent not visible
  return { order, parent };
}

function effectiveLimit(row, byKey, parent) {
  let lim = row.limit.gpu ?? Infinity;
  for (let p = parent.get(row.queue); p; p = parent.get(p)) {
    const up = byKey.get(`${p}/${row.pool}`);
    if (up) lim = Math.min(lim, up.limit.gpu ?? Infinity);
  }
  return lim === Infinity ? null : lim;
}

async function loadQuota() {
  const q = await api("/v1/quota");
  // a pool a queue may reach through its parent but has neither guarantee nor use in is noise
  const rows = q.items.filter((i) => (i.guarantee.gpu ?? 1) > 0 || i.used.gpu > 0);
  const byKey = new Map(q.items.map((i) => [`${i.queue}/${i.pool}`, i]));
  const { order, parent } = treeOrder(q.items);
  const out = [];
  for (const [name, depth] of order) {
    rows.filter((i) => i.queue === name).forEach((i, n) => {
      const g = i.guarantee.gpu ?? 0, used = i.used.gpu ?? 0, borrow = Math.max(0, used - g);
      out.push(el("tr", { "data-queue": name, id: n === 0 ? `queue-${name}` : "" },
        el("td", { class: "tree", style: `padding-left:${0.5 + depth * 1.2}rem` }, n === 0 ? el("span", {}, depth ? "└ " : "", objectLink("queues", name)) : ""),
        el("td", {}, i.parent || ""), el("td", {}, i.pool), el("td", {}, fmt(i.guarantee.gpu)), el("td", {}, fmt(used)),
        el("td", { class: borrow > 0 ? "borrowing" : "" }, borrow > 0 ? fmt(borrow) : "0"),
        el("td", {}, fmt(effectiveLimit(i, byKey, parent))),
        el("td", { class: borrow > 0 ? "borrowing" : "" }, borrow > 0 ? "borrowing" : "within guarantee")));
    });
  }
  document.querySelector("#quota tbody").replaceChildren(...out);
  const leaves = new Set(q.items.map((i) => i.queue));
  for (const i of q.items) if (i.parent) leaves.delete(i.parent);
  const sel = document.querySelector("#submit select[name=queue]");
  const current = sel.value;
  sel.replaceChildren(...[...leaves].sort().map((n) => el("option", {}, n)));
  if (current) sel.value = current;
}

// why it waits, and every attempt it has made: a failed run is retried by policy, so the
// history is what tells a user whether to wait, fix the job, or ask the platform team
function history(w) {
  const lines = [`attempts: ${w.attempts ?? 0}`];
  for (const f of w.failures || []) {
    const code = f.exitCode === null || f.exitCode === undefined ? "" : ` (exit code ${f.exitCode})`;
    lines.push(`failed ${f.at}${code}: ${f.reason}${f.retryAt ? "; retry not before " + f.retryAt : ""}`);
  }
  return lines.join("\n");
}

async function explain(name) {
  const out = document.getElementById("explain");
  try {
    const path = `/v1/workloads/${encodeURIComponent(name)}`;
    const [e, w] = await Promise.all([api(`${path}/explain`), api(path)]);
    out.replaceChildren(`${name}: ${explanationText(e)}\n${history(w)}\n`, workloadLink(name), " (the whole page)");
  } catch (err) { out.textContent = String(err.message); }
  out.hidden = false;
}

async function cancel(name) {
  if (!window.confirm(`Cancel ${name}? A running workload is stopped; this cannot be undone.`)) return;
  try { await api(`/v1/workloads/${encodeURIComponent(name)}/cancel`, { method: "POST" }); await refresh(); }
  catch (err) { showError(err.message); }
}

function matches(w, text) {
  if (!text) return true;
  const hay = `${w.name} ${w.queue} ${w.owner} ${w.phase} ${w.priorityClass || ""} ${w.reason || ""}`.toLowerCase();
  return text.toLowerCase().split(/\s+/).every((t) => hay.includes(t));
}

function renderWorkloads() {
  const text = document.getElementById("search").value.trim();
  const { key, desc } = state.sort;
  const shown = state.workloads.filter((w) => matches(w, text)).sort((a, b) => {
    const x = String(a[key] ?? ""), y = String(b[key] ?? "");
    return (x < y ? -1 : x > y ? 1 : 0) * (desc ? -1 : 1);
  });
  document.getElementById("workload-count").textContent =
    `${shown.length} of ${state.workloads.length}`;
  for (const th of document.querySelectorAll("#workloads th button.sort")) {
    th.setAttribute("aria-sort", th.dataset.key === key ? (desc ? "descending" : "ascending") : "none");
  }
  document.querySelector("#workloads tbody").replaceChildren(...shown.map((x) => el("tr", { "data-name": x.name },
    el("td", {}, workloadLink(x.name)), el("td", {}, queueLink(x.queue)), el("td", {}, x.priorityClass || ""),
    el("td", { class: `phase-${x.phase}` }, x.phase), el("td", { title: x.submittedAt }, age(x.submittedAt)),
    el("td", { class: "reason" }, x.reason || ""),
    el("td", { class: "actions" }, el("button", { type: "button", onclick: () => explain(x.name) }, "explain"),
      ACTIVE.includes(x.phase) ? el("button", { type: "button", onclick: () => cancel(x.name) }, "cancel") : ""))));
}

async function loadWorkloads() {
  state.workloads = await listAll("/v1/workloads");
  renderWorkloads();
}

// measured utilisation (GET /v1/utilisation): what the held GPUs compute, and who holds them idle
async function loadUtilisation() {
  const u = await api("/v1/utilisation");
  const src = { nvml: "NVML", prometheus: "DCGM/HAMi via Prometheus", synthetic: "synthetic, by task type (virtual cluster)" }[u.source];
  document.getElementById("utilisation-source").textContent = src
    ? `Sampled from ${src}; idle: every GPU below ${u.thresholdPercent}% SM for the workload's idleFor (alert GpuHeldIdle).`
    : "Nothing measures these GPUs (no NVML, no Prometheus URL): allocation only.";
  const gib = (b) => `${(b / 2 ** 30).toFixed(1)} GiB`;
  document.querySelector("#utilisation tbody").replaceChildren(...u.items.map((i) =>
    el("tr", { class: i.heldIdle ? "borrowing" : "" }, el("td", {}, i.workload), el("td", {}, i.queue), el("td", {}, i.pool),
      el("td", {}, fmt(i.gpus)), el("td", {}, `${i.smPercent}%`), el("td", {}, gib(i.memoryUsedBytes)),
      el("td", {}, i.heldIdle ? "held idle" : i.idleSince !== null ? "below threshold" : ""))));
}

async function loadNodes() {
  const n = await api("/v1/nodes");
  const box = document.getElementById("nodes");
  box.replaceChildren(...n.items.map((node) => {
    const used = node.gpuAllocated;
    const cells = [];
    for (let i = 0; i < node.gpus; i++) {
      const share = Math.max(0, Math.min(1, used - i));
      cells.push(el("span", { class: "gpu" + (share >= 1 ? " used" : share > 0 ? " part" : "") }));
    }
    return el("div", { class: "node", title: `${node.gpuModel} · pool ${node.pool} · rack ${node.rack}` },
      `${node.name}${node.schedulable ? "" : " (cordoned)"}`, el("div", { class: "gpus" }, ...cells));
  }));
}

function lines(times, series) {
  return Object.entries(series).map(([name, ys]) => ({ x: times, y: ys, name, type: "scatter", mode: "lines", line: { shape: "hv" } }));
}

async function loadCharts() {
  const h = await api("/v1/history?hours=6");
  if (!window.Plotly) { document.getElementById("chart-pools").textContent = "charts need plotly.min.js"; return; }
  const layout = (y) => ({ margin: { l: 40, r: 10, t: 10, b: 30 }, height: 260, yaxis: { title: { text: y }, rangemode: "tozero" },
    legend: { orientation: "h" }, autosize: true });
  const cfg = { responsive: true, displaylogo: false };
  window.Plotly.react("chart-pools", lines(h.times, h.pools), layout("GPUs"), cfg);
  window.Plotly.react("chart-pending", lines(h.times, h.pending), layout("workloads"), cfg);
}

// which page the hash names: [main element id, what loads it, reloaded by the 5 s timer]
function page() {
  const h = location.hash;
  if (h.startsWith("#/workload/")) return ["workload-page", () => showWorkloadPage(decodeURIComponent(h.slice(11))), true];
  if (h === "#/config") return ["config-page", showConfigPage, false];
  if (h === "#/catalog") return ["catalog-page", showCatalogPage, true];
  const obj = h.match(/^#\/object\/([a-z]+)\/(.+)$/);
  if (obj) return ["object-page", () => showObjectPage(obj[1], decodeURIComponent(obj[2])), false];
  // incidents and history are not reloaded under the user's hands (a note being typed, a diff chosen)
  if (h === "#/incidents") return ["incidents-page", showIncidentsPage, false];
  return ["overview", () => Promise.all([loadCluster(), loadQuota(), loadWorkloads(), loadNodes(), loadCharts(), loadIncidentCount(), loadUtilisation()]), true];
}

// each refresh has a number: only the newest may set the error line, so a slow answer for the
// page the user left cannot clear (or overwrite) the message of the page they are on now
let refreshes = 0;

async function refresh(timer = false) {
  if (!state.token) { showError("Sign in with an API token (gpupool serve prints the admin token)."); return; }
  const [, load, periodic] = page();
  if (timer && !periodic) return;
  const mine = ++refreshes;
  try {
    const who = await api("/v1/whoami");
    state.who = who;
    document.getElementById("who").textContent = `${who.name} (${who.role}${who.scope ? ", " + who.scope : ""})`;
    await load();
    if (mine === refreshes) showError("");
  } catch (err) { if (mine === refreshes) showError(err.message); }
}

function route() {
  const [id] = page();
  for (const m of document.querySelectorAll("main")) m.hidden = m.id !== id;
  const anchor = location.hash.match(/^#\/#(.+)$/);
  refresh().then(() => { if (anchor) document.getElementById(decodeURIComponent(anchor[1]))?.scrollIntoView(); });
}

document.getElementById("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = document.getElementById("token").value.trim();
  localStorage.setItem("gpupool-token", state.token);
  refresh();
});

document.getElementById("submit").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const gpus = f.get("gpus").trim();
  const manifest = {
    apiVersion: "gpupool.io/v1alpha1", kind: "Workload", metadata: { name: f.get("name") },
    spec: {
      queue: f.get("queue"), priorityClass: f.get("priorityClass"), duration: f.get("duration"),
      podGroups: [{ name: "main", replicas: Number(f.get("replicas")), resources: { "nvidia.com/gpu": gpus } }],
    },
  };
  const out = document.getElementById("submit-result");
  try {
    const r = await api("/v1/workloads", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(manifest) });
    out.textContent = `submitted ${r.name}: ${r.phase}`;
    await refresh();
  } catch (err) { out.textContent = err.message; }
});

document.getElementById("search").addEventListener("input", renderWorkloads);
for (const b of document.querySelectorAll("#workloads th button.sort")) {
  b.addEventListener("click", () => {
    const same = state.sort.key === b.dataset.key;
    state.sort = { key: b.dataset.key, desc: same ? !state.sort.desc : b.dataset.key === "submittedAt" };
    renderWorkloads();
  });
}

document.getElementById("token").value = state.token;
window.addEventListener("hashchange", route);
route();
setInterval(() => refresh(true), 5000);
