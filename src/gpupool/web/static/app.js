// gpupool dashboard: reads the REST API with the user's token; no framework, no network but the API.
"use strict";

const state = { token: localStorage.getItem("gpupool-token") || "" };

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

const fmt = (v) => (v === null || v === undefined ? "∞" : (Math.round(v * 100) / 100).toString());

function bar(frac) {
  return el("div", { class: "bar", title: `${Math.round(frac * 100)}%` }, el("span", { style: `width:${Math.min(100, frac * 100)}%` }));
}

async function loadCluster() {
  const c = await api("/v1/cluster");
  document.getElementById("summary").textContent =
    `${c.nodes} nodes, ${c.gpus} GPUs · ${c.running} running, ${c.pending} pending · ${c.cycles} scheduling cycles`;
  const tb = document.querySelector("#pools tbody");
  tb.replaceChildren(...c.pools.map((p) => el("tr", {},
    el("td", {}, p.name), el("td", {}, String(p.nodes)), el("td", {}, fmt(p.gpus)), el("td", {}, fmt(p.gpuAllocated)),
    el("td", {}, bar(p.gpus ? p.gpuAllocated / p.gpus : 0)), el("td", {}, p.preemptible ? "yes" : "no"),
    el("td", {}, String(p.pricePerGPUHour)))));
}

async function loadQuota() {
  const q = await api("/v1/quota");
  const tb = document.querySelector("#quota tbody");
  // a pool a queue may reach through its parent but has neither guarantee nor use in is noise
  const rows = q.items.filter((i) => (i.guarantee.gpu ?? 1) > 0 || i.used.gpu > 0);
  tb.replaceChildren(...rows.map((i) => {
    const over = i.used.gpu > (i.guarantee.gpu ?? Infinity);
    return el("tr", {}, el("td", {}, i.queue), el("td", {}, i.parent || ""), el("td", {}, i.pool),
      el("td", {}, fmt(i.guarantee.gpu)), el("td", {}, fmt(i.used.gpu)), el("td", {}, fmt(i.limit.gpu)),
      el("td", { class: over ? "borrowing" : "" }, over ? "borrowing" : "within guarantee"));
  }));
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
    out.textContent = `${name}\n${history(w)}\n` + JSON.stringify(e, null, 2);
  } catch (err) { out.textContent = String(err.message); }
  out.hidden = false;
}

async function cancel(name) {
  try { await api(`/v1/workloads/${encodeURIComponent(name)}/cancel`, { method: "POST" }); await refresh(); }
  catch (err) { showError(err.message); }
}

async function loadWorkloads() {
  const w = await api("/v1/workloads?limit=500");
  const tb = document.querySelector("#workloads tbody");
  tb.replaceChildren(...w.items.slice().reverse().map((x) => el("tr", { "data-name": x.name },
    el("td", {}, x.name), el("td", {}, x.queue), el("td", {}, x.priorityClass || ""),
    el("td", { class: `phase-${x.phase}` }, x.phase), el("td", {}, x.reason || ""),
    el("td", {}, el("button", { type: "button", onclick: () => explain(x.name) }, "explain"),
      ["Pending", "Admitted", "Running", "AwaitingApproval"].includes(x.phase)
        ? el("button", { type: "button", onclick: () => cancel(x.name) }, "cancel") : ""))));
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

async function refresh() {
  if (!state.token) { showError("Sign in with an API token (gpupool serve prints the admin token)."); return; }
  try {
    const who = await api("/v1/whoami");
    document.getElementById("who").textContent = `${who.name} (${who.role}${who.scope ? ", " + who.scope : ""})`;
    await Promise.all([loadCluster(), loadQuota(), loadWorkloads(), loadNodes()]);
    showError("");
  } catch (err) { showError(err.message); }
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

document.getElementById("token").value = state.token;
refresh();
setInterval(refresh, 5000);
