"""Rendering of engine decisions for people (tables) and programs (JSON)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.table import Table

from gpupool.engine.decisions import Admit, Decisions
from gpupool.model import PodPlacement, Workload


def placement_summary(pods: tuple[PodPlacement, ...] | list[PodPlacement], limit: int = 4) -> str:
    """'h100-001[0-7] h100-002[0-7]' or 'a100-003[2]x0.5': where each pod sits, compactly."""
    per_node: dict[str, list[str]] = defaultdict(list)
    for p in pods:
        if not p.devices:
            per_node[p.node].append("cpu")
        elif p.gpu_milli < 1000:
            per_node[p.node].append(f"{p.devices[0]}x{p.gpu_milli / 1000:g}")
        else:
            ds = sorted(p.devices)
            contiguous = ds == list(range(ds[0], ds[-1] + 1))
            per_node[p.node].append(
                f"{ds[0]}-{ds[-1]}" if contiguous and len(ds) > 1 else ",".join(map(str, ds))
            )
    parts = [f"{n}[{' '.join(v)}]" for n, v in per_node.items()]
    more = f" +{len(parts) - limit} nodes" if len(parts) > limit else ""
    return " ".join(parts[:limit]) + more


def decisions_table(
    decisions: Decisions, workloads: dict[str, Workload], title: str = "Scheduling decisions"
) -> Table:
    t = Table(title=title, show_lines=False)
    for col in ("workload", "queue", "priority", "decision", "pool", "placement", "why"):
        t.add_column(col, overflow="fold")
    victims = {v.workload: (p.preemptor, v) for p in decisions.preempted for v in p.victims}
    rows: list[tuple[str, ...]] = []
    for a in decisions.admitted:
        w = workloads.get(a.workload)
        rows.append(
            (
                a.workload,
                a.queue,
                w.priority_class if w else "",
                "[green]admit[/]" + (" [yellow](borrow)[/]" if a.borrowing else ""),
                a.pool,
                placement_summary(a.pods),
                a.reason,
            )
        )
    for name, (by, v) in victims.items():
        rows.append(
            (name, v.queue, str(v.priority), "[red]preempt[/]", "", "", f"{v.rule}: {v.reason} (for {by})")
        )
    for pre in decisions.preempted:
        for sh in pre.shrinks:  # an elastic gang loses only its extra pods
            gone = placement_summary(sh.pods)
            why = f"{sh.rule}: {sh.reason} (for {pre.preemptor})"
            rows.append((sh.workload, sh.queue, str(sh.priority), "[red]shrink[/]", "", gone, why))
    for p in decisions.pending:
        w = workloads.get(p.workload)
        rows.append(
            (
                p.workload,
                p.queue,
                w.priority_class if w else "",
                f"[yellow]pending[/] {p.code}",
                "",
                "",
                p.reason,
            )
        )
    for r in rows:
        t.add_row(*r)
    return t


def decisions_json(decisions: Decisions) -> dict[str, Any]:
    def admit(a: Admit) -> dict[str, Any]:
        return {
            "workload": a.workload,
            "queue": a.queue,
            "pool": a.pool,
            "borrowing": a.borrowing,
            "reason": a.reason,
            "afterEvicting": list(a.after_evicting),
            "afterShrinking": list(a.after_shrinking),
            "pods": [
                {
                    "group": p.group,
                    "index": p.index,
                    "node": p.node,
                    "devices": list(p.devices),
                    "gpuMilli": p.gpu_milli,
                    "gpuMemoryMiB": p.gpu_memory_mib,
                }
                for p in a.pods
            ],
        }

    return {
        "admitted": [admit(a) for a in decisions.admitted],
        "preempted": [
            {
                "preemptor": p.preemptor,
                "queue": p.queue,
                "victims": [
                    {"workload": v.workload, "queue": v.queue, "rule": str(v.rule), "reason": v.reason}
                    for v in p.victims
                ],
                "shrinks": [
                    {
                        "workload": s.workload,
                        "queue": s.queue,
                        "rule": str(s.rule),
                        "reason": s.reason,
                        "replicas": s.replicas,
                        "pods": [{"group": q.group, "index": q.index, "node": q.node} for q in s.pods],
                    }
                    for s in p.shrinks
                ],
            }
            for p in decisions.preempted
        ],
        "pending": [
            {"workload": p.workload, "queue": p.queue, "code": str(p.code), "reason": p.reason}
            for p in decisions.pending
        ],
        "summary": decisions.summary(),
    }
