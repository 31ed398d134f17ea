"""Documents to a model ``Bundle``: each kind converted, then the references between them checked.

Why all or nothing: a set whose queue names a missing parent or whose pools overlap is refused
whole, with every problem listed, so the scheduler never runs on half a configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from gpupool.manifests.base import Bundle, Document, ManifestError, ManifestErrors
from gpupool.manifests.cluster import build_nodes, build_pool, usage_half_life
from gpupool.manifests.documents import load_files
from gpupool.manifests.queues import PriorityClassSpec, build_queue, default_priority_classes, preemption_wait
from gpupool.manifests.task_types import check_task_type_refs, parse_task_types
from gpupool.manifests.workloads import build_workload
from gpupool.model import PriorityClass, Queue


def build(docs: Iterable[Document], base: Bundle | None = None, *, references: bool = True) -> Bundle:
    """Turn documents into model objects and check references between them; all or nothing.
    ``references=False`` checks each document alone (when others of the set failed to parse,
    references to them would only add noise)."""
    err = ManifestErrors()
    b = Bundle()
    if base is not None:
        b.nodes, b.pools, b.queues = list(base.nodes), list(base.pools), list(base.queues)
        b.priority_classes = list(base.priority_classes)
    docs = list(docs)
    b.documents = docs
    # by name, a later document replacing an earlier one (and moving to the end, as a list
    # rebuilt per document did): 10,000 queues in one set were quadratic
    pools = {p.name: p for p in b.pools}
    queues = {q.name: q for q in b.queues}
    pcs = {p.name: p for p in b.priority_classes}
    for d in docs:
        if d.kind == "Cluster":
            b.nodes.extend(build_nodes(d, err))
            b.usage_half_life_s = usage_half_life(d, err) or b.usage_half_life_s
            b.task_types.cluster.update(
                parse_task_types(d.spec.taskTypes, f"{d.source}: spec.taskTypes", err)
            )
        elif d.kind == "ResourcePool":
            pools.pop(d.name, None)
            pools[d.name] = build_pool(d)
        elif d.kind == "Queue":
            queues.pop(d.name, None)
            queues[d.name] = build_queue(d, err)
            where = f"{d.source}: spec.typeDefaults"
            b.task_types.queues[d.name] = parse_task_types(d.spec.typeDefaults, where, err)
        elif d.kind == "PriorityClass":
            s: PriorityClassSpec = d.spec
            wait = preemption_wait(s, d.source, err)
            pcs.pop(d.name, None)
            pcs[d.name] = PriorityClass(d.name, s.value, s.preemptible, s.description, wait)
    b.pools, b.queues, b.priority_classes = list(pools.values()), list(queues.values()), list(pcs.values())
    classes = {p.name: p for p in b.priority_classes}
    seq = 0
    for d in docs:
        if d.kind == "Workload":
            b.workloads.append(build_workload(d, classes, err, arrival=float(seq), types=b.task_types))
            seq += 1
    if references:
        check_references(b, err, {d.name: d.source for d in docs})
    if err.items:
        raise ManifestError(err.items)
    return b


def check_references(b: Bundle, err: ManifestErrors, sources: Mapping[str, str]) -> None:
    """Cross-object checks: parents exist, no cycles, quotas name real pools, pools don't overlap.

    ``sources`` maps an object's name to its document, where each problem is located."""
    qnames = {q.name: q for q in b.queues}
    pnames = {p.name for p in b.pools}
    names: set[str] = set()
    for n in b.nodes:
        if n.name in names:
            err.add(f"node {n.name}", "duplicate node name")
        names.add(n.name)
    for q in b.queues:
        _check_queue(q, qnames, pnames, sources.get(q.name, f"Queue/{q.name}"), err)
    _check_child_guarantees(b.queues, qnames, sources, err)
    for n in b.nodes:
        hits = [p.name for p in b.pools if p.selects(n)]
        if len(hits) > 1:
            err.add(
                f"node {n.name}",
                f"selected by more than one pool ({', '.join(hits)}); pools must not overlap",
            )
    for w in b.workloads:
        src = sources.get(w.name, f"Workload/{w.name}")
        if qnames and w.queue and w.queue not in qnames:
            err.add(f"{src}: spec.queue", f"queue {w.queue!r} does not exist")
        if w.pool is not None and pnames and w.pool not in pnames:
            err.add(f"{src}: spec.pool", f"pool {w.pool!r} does not exist")
    check_task_type_refs(b, err, sources)


def _check_queue(
    q: Queue, qnames: Mapping[str, Queue], pnames: set[str], src: str, err: ManifestErrors
) -> None:
    """One queue's references: its parent exists, its ancestry has no cycle, its pools exist."""
    if q.parent is not None and q.parent not in qnames:
        err.add(f"{src}: spec.parent", f"queue {q.parent!r} does not exist")
    seen = {q.name}
    cur = q
    while cur.parent is not None and cur.parent in qnames:
        if cur.parent in seen:
            err.add(f"{src}: spec.parent", f"queue tree has a cycle through {cur.parent!r}")
            break
        seen.add(cur.parent)
        cur = qnames[cur.parent]
    for i, pq in enumerate(q.quotas):
        if pnames and pq.pool not in pnames:
            err.add(
                f"{src}: spec.quotas[{i}].pool",
                f"pool {pq.pool!r} does not exist; known: {', '.join(sorted(pnames))}",
            )


def _check_child_guarantees(
    queues: list[Queue], qnames: Mapping[str, Queue], sources: Mapping[str, str], err: ManifestErrors
) -> None:
    """Per pool, a queue's children together guarantee no more GPUs than the queue itself."""
    kids: dict[str, list[Queue]] = {}
    for q in queues:
        if q.parent:
            kids.setdefault(q.parent, []).append(q)
    for parent, cs in kids.items():
        parent_q = qnames.get(parent)
        if parent_q is None:
            continue
        for spec in parent_q.quotas:
            child_quotas = [c.quota(spec.pool) for c in cs]
            total = sum(cq.guarantee[0] for cq in child_quotas if cq is not None)
            if total > spec.guarantee[0]:
                err.add(
                    f"{sources.get(parent, parent)}: spec.quotas (pool {spec.pool})",
                    f"children guarantee {total / 1000:g} GPUs, more than this queue's {spec.guarantee[0] / 1000:g}",
                )


def load_bundle(paths: Iterable[Path]) -> Bundle:
    """Load manifests from files and directories, adding the default priority classes."""
    docs = load_files(paths)
    base = Bundle(priority_classes=list(default_priority_classes()))
    return build(docs, base)
