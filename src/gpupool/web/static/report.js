// gpupool cost reports: the usage, chargeback and weekly reports of /v1/reports, as tables.
// Signs in with the dashboard's stored token; what shows is what the API lets that token see.
"use strict";

const token = localStorage.getItem("gpupool-token") || "";

function node(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function showError(msg) {
  const p = document.getElementById("error");
  p.textContent = msg; p.hidden = !msg;
}

function query(form) {
  const f = new FormData(form);
  const q = new URLSearchParams();
  for (const k of ["from", "to"]) if (f.get(k)) q.set(k, f.get(k));
  return q;
}

async function fetchReport(kind, q, format) {
  q.set("format", format);
  const r = await fetch(`/v1/reports/${kind}?${q}`, { headers: { "Authorization": `Bearer ${token}` } });
  if (!r.ok) {
    const e = (await r.json().catch(() => ({}))).error || {};
    const fields = (e.errors || []).map((x) => `${x.field}: ${x.problem}`).join("; ");
    throw new Error(`${r.status}: ${e.message || r.statusText}${fields && !(e.message || "").includes(fields) ? " (" + fields + ")" : ""}`);
  }
  return r;
}

function cell(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "boolean") return v ? "yes" : "no";
  return String(v);
}

// The teams table's rows as stacked bars: one bar per top team shown, one segment per queue's
// own cost (ownTotal), so the bars add up to the spend (a parent's subtree total drawn beside
// its children's counted them twice).
function teamBars(rep) {
  const t = (rep.tables || []).find((x) => x.name === "teams");
  if (!t || !t.columns.includes("ownTotal")) return [];
  const col = (r, c) => r[t.columns.indexOf(c)];
  const parent = new Map(t.rows.map((r) => [col(r, "queue"), col(r, "parent")]));
  const top = (q) => { const seen = new Set([q]); while (parent.has(parent.get(q)) && !seen.has(parent.get(q))) { q = parent.get(q); seen.add(q); } return q; };
  return t.rows.filter((r) => Number(col(r, "ownTotal")) > 0)
    .map((r) => ({ type: "bar", name: col(r, "queue"), x: [top(col(r, "queue"))], y: [Number(col(r, "ownTotal"))] }));
}

function drawTeams(rep) {
  const bars = teamBars(rep);
  const fig = document.getElementById("team-figure");
  fig.hidden = !bars.length || !window.Plotly;
  if (fig.hidden) return;
  window.Plotly.react("chart-teams", bars, { barmode: "stack", height: 300, margin: { l: 50, r: 10, t: 10, b: 30 },
    yaxis: { title: { text: rep.currency || "" } }, legend: { orientation: "h" } }, { responsive: true, displaylogo: false });
}

function render(rep) {
  const s = Object.entries(rep.summary).map(([k, v]) => `${k}: ${cell(v)}`).join(" · ");
  document.getElementById("report-summary").textContent = `${rep.kind}, ${rep.from} to ${rep.to} (${rep.scope}) — ${s}`;
  drawTeams(rep);
  const out = document.getElementById("report-tables");
  out.replaceChildren(...rep.tables.map((t) => {
    const sec = node("section");
    sec.dataset.table = t.name;
    sec.append(node("h2", t.title));
    const table = node("table");
    const head = node("tr");
    for (const c of t.columns) head.append(node("th", c));
    table.append(node("thead")); table.tHead.append(head);
    const body = node("tbody");
    for (const r of t.rows) {
      const tr = node("tr");
      for (const v of r) tr.append(node("td", cell(v)));
      body.append(tr);
    }
    if (!t.rows.length) { const tr = node("tr"); tr.append(node("td", "(none)")); body.append(tr); }
    table.append(body);
    sec.append(table);
    return sec;
  }));
}

async function show(ev) {
  if (ev) ev.preventDefault();
  const form = document.getElementById("report-form");
  try {
    showError("");
    const r = await fetchReport(form.elements.kind.value, query(form), "json");
    render(await r.json());
  } catch (e) { showError(e.message); }
}

async function download() {
  const form = document.getElementById("report-form");
  try {
    const r = await fetchReport("weekly", query(form), "html");
    const url = URL.createObjectURL(new Blob([await r.text()], { type: "text/html" }));
    const a = node("a"); a.href = url; a.download = "gpupool-weekly.html"; a.click();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (e) { showError(e.message); }
}

document.getElementById("report-form").addEventListener("submit", show);
document.getElementById("download").addEventListener("click", download);
if (!token) showError("Sign in on the dashboard first: the report page uses the same API token.");
else show();
