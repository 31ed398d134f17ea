// The pool catalog (资源池 / 服务目录): what each pool is for, what it costs, how much is promised
// and free now, which task types go there first, who may use it and what needs an approval.
// Loaded by app.js (uses el, api, fmt, bar, queueLink).
"use strict";

function catalogCard(e) {
  const queues = e.queues.length
    ? el("ul", {}, ...e.queues.map((q) => el("li", {}, queueLink(q.queue), (q.gpuGuarantee ? ` guarantee ${fmt(q.gpuGuarantee)} GPUs` : " may borrow (no guarantee)") + (q.requiresApproval ? " · needs approval" : ""))))
    : el("p", { class: "hint" }, "no queue of yours may use this pool");
  return el("section", { class: "catalog-entry", "data-pool": e.name },
    el("h3", {}, e.name, " ", el("span", { class: "count" }, [e.environment, e.slaTier].filter(Boolean).join(" · "))),
    el("p", {}, e.description || ""),
    el("p", {}, `$${e.pricePerGPUHour}/GPU-hour · ${e.gpuModels.join(", ") || "any model"} · ${e.nodes} nodes · `,
      e.preemptible ? "work here may be preempted" : "work here is never preempted"),
    el("p", { class: "capacity" }, `${fmt(e.gpus)} GPUs: ${fmt(e.gpuAllocated)} allocated, ${fmt(e.gpuFree)} free; `
      + `${fmt(e.gpuGuaranteed)} guaranteed to queues, ${fmt(e.gpuUnpromised)} unpromised`, bar(e.gpus ? e.gpuAllocated / e.gpus : 0)),
    el("p", {}, `task types: ${e.allowedTaskTypes.join(", ") || "any"}; sent here first: ${e.preferredByTaskTypes.join(", ") || "(none)"}`),
    el("h4", {}, "Who may use it"), queues,
    el("h4", {}, "Needs approval"), el("ul", {}, ...e.approvalRules.map((r) => el("li", {}, r))));
}

async function showCatalogPage() {
  const c = await api("/v1/catalog");
  document.getElementById("catalog-entries").replaceChildren(...c.items.map(catalogCard));
}
