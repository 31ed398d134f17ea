// Governance pages (平台治理): each configuration object's history and the difference between two
// of its revisions, and the incidents gpupool raises itself; loaded by app.js (uses el, api, age).
"use strict";

const PLURAL = { ResourcePool: "pools", Queue: "queues", PriorityClass: "priorityclasses", Cluster: "clusters" };
const KIND_TITLE = { pools: "Pools", queues: "Queues", priorityclasses: "Priority classes", clusters: "Clusters" };
// an incident's subject is "queue/Q", "pool/P" or "node/N/gpu/I": the first two have a page
const SUBJECT_PAGE = { queue: "queues", pool: "pools" };

const objectHref = (plural, name) => `#/object/${plural}/${encodeURIComponent(name)}`;
const objectLink = (plural, name) => el("a", { href: objectHref(plural, name) }, name);
const mayHandleIncidents = () => (state.who || {}).role === "platform-admin";

async function showConfigPage() {
  const lists = await Promise.all(Object.keys(KIND_TITLE).map((p) => api(`/v1/config/${p}`).then((r) => [p, r.items])));
  document.getElementById("config-lists").replaceChildren(...lists.map(([plural, items]) => el("div", { class: "config-kind", "data-plural": plural },
    el("h3", {}, KIND_TITLE[plural]),
    el("ul", {}, ...items.map((m) => el("li", {}, objectLink(plural, m.metadata.name)))))));
}

// ---------------------------------------------------------------- one object's history and diff

function revisionOptions(select, revisions, chosen) {
  select.replaceChildren(...revisions.map((r) => el("option", { value: String(r.revision) }, `${r.revision} (${r.action}, ${r.author || "?"})`)));
  if (chosen) select.value = String(chosen);
}

async function showObjectPage(plural, name) {
  const kind = Object.keys(PLURAL).find((k) => PLURAL[k] === plural) || plural;
  document.getElementById("obj-title").textContent = `${kind} ${name}`;
  const [now, revs] = await Promise.allSettled([api(`/v1/config/${plural}/${encodeURIComponent(name)}`),
    api(`/v1/revisions/${plural}/${encodeURIComponent(name)}`)]);
  document.getElementById("obj-spec").textContent = now.status === "fulfilled"
    ? JSON.stringify(now.value.spec, null, 2) : `not stored now: ${now.reason.message}`;
  const items = revs.status === "fulfilled" ? revs.value.items : [];
  const none = document.getElementById("obj-none");
  none.hidden = items.length > 0;
  none.textContent = revs.status === "fulfilled" ? "" : `no revisions: ${revs.reason.message} (a built-in object is never stored)`;
  document.querySelector("#obj-history tbody").replaceChildren(...items.slice().reverse().map((r) => el("tr", { "data-revision": String(r.revision) },
    el("td", {}, String(r.revision)), el("td", {}, r.action), el("td", {}, r.author || ""),
    el("td", { title: r.at }, `${age(r.at)} ago`), el("td", {}, r.reason || ""))));
  const form = document.getElementById("obj-diff-form");
  form.hidden = items.length < 2;
  const last = items.length ? items[items.length - 1].revision : null;
  revisionOptions(form.elements.from, items, items.length >= 2 ? items[items.length - 2].revision : last);
  revisionOptions(form.elements.to, items, last);
  form.onsubmit = (ev) => { ev.preventDefault(); loadDiff(plural, name, form.elements.from.value, form.elements.to.value); };
  document.querySelector("#obj-changes tbody").replaceChildren();
  document.getElementById("obj-diff").hidden = true;
  if (items.length >= 2) await loadDiff(plural, name, form.elements.from.value, form.elements.to.value);
}

const shown = (v) => (v === null || v === undefined ? "(absent)" : typeof v === "object" ? JSON.stringify(v) : String(v));

async function loadDiff(plural, name, from, to) {
  const pre = document.getElementById("obj-diff");
  const body = document.querySelector("#obj-changes tbody");
  try {
    const d = await api(`/v1/revisions/${plural}/${encodeURIComponent(name)}/diff?from=${from}&to=${to}`);
    body.replaceChildren(...d.changes.map((c) => el("tr", {}, el("td", {}, c.field), el("td", {}, shown(c.from)), el("td", {}, shown(c.to)))));
    pre.textContent = d.unified || `revisions ${from} and ${to} are the same`;
  } catch (err) { body.replaceChildren(); pre.textContent = err.message; }
  pre.hidden = false;
}

// ---------------------------------------------------------------- incidents (告警处置)

const OPEN_STATES = ["Firing", "Acknowledged"];

async function loadIncidentCount() {
  const p = document.getElementById("incident-count");
  if (!mayHandleIncidents()) { p.hidden = true; return; }  // incidents are the platform admins'
  const r = await api("/v1/alerts?open=true&evaluate=false");
  const n = r.items.length;
  p.firstElementChild.textContent = `${n} open incident${n === 1 ? "" : "s"}`;
  p.className = n ? "incidents-open" : "";
  p.hidden = false;
}

function subjectCell(subject) {
  const [kind, ...rest] = subject.split("/");
  const plural = SUBJECT_PAGE[kind];
  return plural && rest.length === 1 ? el("span", {}, `${kind}/`, objectLink(plural, rest[0])) : subject;
}

function incidentActions(i) {
  if (!mayHandleIncidents() || !OPEN_STATES.includes(i.state)) return "";
  const owner = el("input", { name: "owner", placeholder: "owner (default: you)", "aria-label": `owner of incident ${i.id}` });
  const note = el("input", { name: "note", placeholder: "what was done", "aria-label": `resolution note of incident ${i.id}` });
  const ack = el("button", { type: "button", onclick: () => handleIncident(i.id, "ack", { owner: owner.value.trim() }) }, "acknowledge");
  const resolve = el("button", { type: "button", onclick: () => {
    if (!note.value.trim()) { showError("a resolution note is required: say what was done"); return; }
    handleIncident(i.id, "resolve", { note: note.value.trim() });
  } }, "resolve");
  return el("div", { class: "incident-actions" }, ...(i.state === "Firing" ? [owner, ack] : []), note, resolve);
}

function renderIncidents() {
  const want = document.getElementById("incident-state").value;
  const all = state.incidents || [];
  const rows = all.filter((i) => (want === "open" ? OPEN_STATES.includes(i.state) : !want || i.state === want));
  document.getElementById("incident-total").textContent = `${rows.length} of ${all.length}`;
  document.querySelector("#incidents tbody").replaceChildren(...rows.map((i) => el("tr", { "data-id": String(i.id) },
    el("td", {}, String(i.id)), el("td", {}, i.rule), el("td", {}, subjectCell(i.subject)),
    el("td", { class: `incident-${i.state}` }, i.state), el("td", { title: i.firedAt }, `${age(i.firedAt)} ago`),
    el("td", {}, i.owner || ""), el("td", { class: "reason" }, i.message),
    el("td", { class: "reason" }, i.resolvedBy ? `${i.resolvedBy}: ${i.resolution}` : ""),
    el("td", { class: "actions" }, incidentActions(i)))));
}

async function showIncidentsPage() {
  if (!mayHandleIncidents()) {
    state.incidents = [];
    renderIncidents();
    throw new Error("incidents are handled by platform admins; sign in with a platform-admin token");
  }
  state.incidents = (await api("/v1/alerts?evaluate=false")).items;
  renderIncidents();
}

async function handleIncident(id, verb, body) {
  try {
    await api(`/v1/alerts/${id}/${verb}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    showError("");
    await showIncidentsPage();
  } catch (err) { showError(err.message); }
}

document.getElementById("incident-state").addEventListener("change", renderIncidents);
