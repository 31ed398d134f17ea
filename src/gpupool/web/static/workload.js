// The workload page: its explanation as sentences, its attempts, its events; loaded by app.js.
"use strict";

// what would let a waiting workload in, by the engine's reason code
const NEXT = {
  QuotaExceeded: "It starts when its queue (or the cohort it borrows from) has room: a workload there finishing, or a larger guarantee for the queue.",
  InsufficientCapacity: "It starts when enough free GPUs exist together in one pool: running work finishing, or more nodes in the pool.",
  TopologyUnsatisfiable: "Its topology request (same rack or NVLink domain) cannot be met now; it starts when such a group of nodes is free, or with a looser topology.",
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

async function showWorkloadPage(name) {
  const path = `/v1/workloads/${encodeURIComponent(name)}`;
  const [w, e, ev] = await Promise.all([api(path), api(`${path}/explain`), api(`${path}/events`)]);
  document.getElementById("wl-title").textContent = `Workload ${w.name}`;
  const facts = [["queue", queueLink(w.queue)], ["phase", w.phase], ["owner", w.owner], ["priority class", w.priorityClass || ""],
    ["pool", (w.placement || {}).pool || "—"], ["age", `${age(w.submittedAt)} (submitted ${w.submittedAt})`]];
  document.getElementById("wl-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  document.getElementById("wl-why").textContent = explanationText(e);
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
}
