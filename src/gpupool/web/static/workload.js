// The workload page: its explanation as sentences, its attempts, its events, each attempt's logs;
// loaded by app.js.
"use strict";

// what would let a waiting workload in, by the engine's reason code
const NEXT = {
  QuotaExceeded: "It starts when its queue (or the cohort it borrows from) has room: a workload there finishing, or a larger guarantee for the queue.",
  InsufficientCapacity: "It starts when enough free GPUs exist together in one pool: running work finishing, or more nodes in the pool.",
  TopologyUnsatisfiable: "Its topology request (same rack or NVLink domain) cannot be met now; it starts when such a group of nodes is free, or with a looser topology.",
  Unsatisfiable: "It cannot run on the pool as it is now even with nothing else running (an unhealthy or cordoned node, too few GPUs of its kind); it starts when the pool changes, or with a smaller request. It does not hold up its queue.",
  NoMatchingPool: "No pool offers what it asks (GPU model, selector, tolerations); change the request or ask for such a pool.",
  BlockedByHead: "Its queue is StrictFIFO and an older workload ahead of it waits; it starts after that one.",
  UnknownQueue: "Its queue does not exist; submit it again to an existing queue.",
  Invalid: "The request cannot be scheduled as written; fix the manifest and submit it again.",
  AwaitingApproval: "Its pool or queue needs approval: an approver can run `gpupool approve` on it.",
  NotConsidered: "The scheduler has not looked at it yet; it runs within a second.",
};

function explanationText(e) {
  const parts = [`${e.phase}`];
  if (e.position) parts.push(`position ${e.position} of ${e.queueLength} pending in queue ${e.queue}`);
  if (e.code || e.reason) parts.push(`${e.code ? e.code + ": " : ""}${e.reason || ""}`);
  if (e.ahead && e.ahead.length) parts.push(`ahead of it: ${e.ahead.join(", ")}`);
  return parts.join(" — ");
}

// who holds what a waiting workload needs, and when it should start (docs/service.md, "Why a
// workload waits"); the block is made here, under the reason, so the page's HTML stays as it is
function waitBlock(e) {
  let box = document.getElementById("wl-holders");
  if (!box) { box = el("div", { id: "wl-holders" }); document.getElementById("wl-why").after(box); }
  if (!e.holders) { box.replaceChildren(); return; }
  const s = e.scope || {};
  const where = s.kind === "pool" ? `pool ${s.name}` : `${s.kind} ${s.name} in pool ${s.pool}`;
  const head = el("tr", {}, ...["workload", "owner", "queue", "GPUs", "expected end"].map((c) => el("th", {}, c)));
  const rows = e.holders.map((h) => el("tr", { "data-name": h.name }, el("td", {}, h.name), el("td", {}, h.owner || ""),
    el("td", {}, h.queue), el("td", {}, String(h.gpus)), el("td", {}, h.expectedEnd || "unknown")));
  box.replaceChildren(el("p", { id: "wl-usage" }, e.usage || ""), el("p", { id: "wl-estimate" }, e.estimate || ""),
    el("p", {}, e.holders.length ? `held by running work of ${where}:` : `nothing runs in ${where}`),
    el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)),
    ...(e.holdersNotShown ? [el("p", {}, `and ${e.holdersNotShown} more`)] : []));
}

async function showWorkloadPage(name) {
  const path = `/v1/workloads/${encodeURIComponent(name)}`;
  const [w, e, ev] = await Promise.all([api(path), api(`${path}/explain`), api(`${path}/events`)]);
  document.getElementById("wl-title").textContent = `Workload ${w.name}`;
  const facts = [["queue", queueLink(w.queue)], ["phase", w.phase], ["owner", w.owner], ["priority class", w.priorityClass || ""],
    ["pool", (w.placement || {}).pool || "—"], ["age", `${age(w.submittedAt)} (submitted ${w.submittedAt})`]];
  document.getElementById("wl-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  document.getElementById("wl-why").textContent = explanationText(e);
  waitBlock(e);
  document.getElementById("wl-next").textContent =
    w.phase === "Pending" || w.phase === "AwaitingApproval" ? (NEXT[e.code] || "") : "";
  const tries = [el("li", {}, `${w.attempts ?? 0} run(s) started`)];
  for (const f of w.failures || []) {
    const code = f.exitCode === null || f.exitCode === undefined ? "" : ` (exit code ${f.exitCode})`;
    tries.push(el("li", {}, `failed ${f.at}${code}: ${f.reason}${f.retryAt ? "; retry not before " + f.retryAt : ""}`));
  }
  document.getElementById("wl-attempts").replaceChildren(...tries);
  document.querySelector("#wl-events tbody").replaceChildren(...ev.items.map((x) => el("tr", {},
    el("td", { title: x.at }, `${age(x.at)} ago`), el("td", {}, x.type), el("td", {}, x.reason), el("td", {}, x.message))));
  const btn = document.getElementById("wl-cancel");
  btn.hidden = !ACTIVE.includes(w.phase);
  btn.onclick = () => cancel(w.name);
  await showLogs(w.name);
}

// the logs panel: the attempt and pod chosen stay chosen across the page's 5 s reloads
const LOG_TAIL = 500;
const logChoice = { name: "", attempt: "", pod: "0", listed: "" };

function logOptions(select, values, label, chosen) {
  select.replaceChildren(...values.map((v) => el("option", { value: String(v) }, label(v))));
  select.value = values.map(String).includes(chosen) ? chosen : String(values[values.length - 1] ?? "");
}

async function showLogs(name) {
  const out = document.getElementById("wl-log");
  const attemptSel = document.getElementById("wl-log-attempt");
  const podSel = document.getElementById("wl-log-pod");
  if (logChoice.name !== name) Object.assign(logChoice, { name, attempt: "", pod: "0", listed: "" });
  let list;
  try { list = await api(`/v1/workloads/${encodeURIComponent(name)}/logs/attempts`); }
  catch (err) { attemptSel.replaceChildren(); podSel.replaceChildren(); out.textContent = err.message; return; }
  const listed = JSON.stringify(list.items);
  if (listed !== logChoice.listed) {  // rebuild only on change: an open drop-down stays open
    const latest = list.latest === null ? "" : String(list.latest);
    const chosen = logChoice.attempt || latest;
    logOptions(attemptSel, list.items.map((a) => a.attempt),
      (a) => `${a}${String(a) === latest ? " (latest)" : ""}`, chosen);
    logChoice.listed = listed;
  }
  const item = list.items.find((a) => String(a.attempt) === attemptSel.value);
  logOptions(podSel, item ? item.pods : [], (k) => `pod ${k}`, logChoice.pod);
  attemptSel.onchange = () => { logChoice.attempt = attemptSel.value; showLogs(name); };
  podSel.onchange = () => { logChoice.pod = podSel.value; showLogs(name); };
  if (!item) { out.textContent = "no logs yet: it has not started"; return; }
  // a log that cannot be read is said in the panel: the page's error line is for the page
  out.textContent = await logText(name, item.attempt, podSel.value).catch((err) => `could not read the log: ${err.message}`);
}

async function logText(name, attempt, pod) {
  const q = new URLSearchParams({ attempt, pod, tailLines: LOG_TAIL });
  const r = await fetch(`/v1/workloads/${encodeURIComponent(name)}/logs?${q}`, { headers: { "Authorization": `Bearer ${state.token}` } });
  if (r.ok) return (await r.text()) || "(no output)";
  const e = (await r.json().catch(() => ({}))).error || {};
  return `${r.status}: ${e.message || r.statusText}`;
}
