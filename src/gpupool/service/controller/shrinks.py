"""The controller's side of an elastic shrink (the engine's ``Shrink``, issue 27 item 5).

Why apart from ``commit.py``: a shrink is neither an eviction nor an admission. The workload
stays in its phase with a smaller placement (the pods above ``gang.minMember`` removed), each
removed pod is recorded as an event with the reason, and the whole is audited
(``workload.shrink``), in the same write-ahead transaction as the cycle's other decisions.
The backend then removes the pods (``shrink``, optional: Kubernetes lowers a Job's
``parallelism`` and evicts single pods of other kinds; the virtual backend frees their devices).
A backend without it cannot remove single pods: the workload is then stopped and requeued
whole, as an eviction would have done.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.engine import Decisions, Shrink
from gpupool.model import Running
from gpupool.service.backends import Capability, capability
from gpupool.service.controller.context import SCHEDULER, Context
from gpupool.store import NotFound, PhaseChange

log = logging.getLogger("gpupool.controller")

#: an event per removed pod: (workload, type, reason, message), as ``apply_transitions`` takes
PodEvent = tuple[str, str, str, str]


def _key(p: Mapping[str, Any]) -> tuple[str, int]:
    return str(p.get("group", "")), int(p.get("index", 0))


def shrink_records(
    ctx: Context, d: Decisions, changes: list[PhaseChange], audits: list[AuditEntry]
) -> tuple[list[PodEvent], dict[str, dict[str, Any]]]:
    """Add each shrink's durable records to the cycle's: the workload's placement without the
    removed pods (its phase kept), an audit entry, and one Warning event per removed pod. Also
    returns the new placement per shrunk workload (for the backend)."""
    events: list[PodEvent] = []
    placements: dict[str, dict[str, Any]] = {}
    for pre in d.preempted:
        for sh in pre.shrinks:
            try:
                rec = ctx.store.get_workload(sh.workload)
            except NotFound:
                continue
            placement = _reduced(dict(rec.placement or {}), sh)
            placements[sh.workload] = placement
            changes.append(PhaseChange(sh.workload, rec.phase, f"{sh.rule}: {sh.reason}", placement))
            pods = [f"{p.group}-{p.index}@{p.node}" for p in sh.pods]
            detail = {
                "rule": str(sh.rule),
                "reason": sh.reason,
                "preemptor": pre.preemptor,
                "queue": sh.queue,
                "priority": sh.priority,
                "pods": pods,
                "replicas": sh.replicas,
            }
            audits.append(AuditEntry(SCHEDULER, "workload.shrink", "Workload", sh.workload, detail))
            for pod in pods:
                why = f"pod {pod} removed for {pre.preemptor} ({sh.rule}): {sh.reason}"
                events.append((sh.workload, "Warning", "Shrunk", why))
    return events, placements


def _reduced(placement: dict[str, Any], sh: Shrink) -> dict[str, Any]:
    """The stored placement less the shrink's pods (matched by group and index)."""
    gone = {(p.group, p.index) for p in sh.pods}
    placement["pods"] = [p for p in placement.get("pods") or () if _key(p) not in gone]
    return placement


def shrink_in_backend(
    ctx: Context, placements: Mapping[str, dict[str, Any]], running: Mapping[str, Running]
) -> dict[str, Running]:
    """Have the backend remove the pods; the runs it could not shrink (no ``shrink`` verb),
    stopped whole, for the caller to requeue as victims."""
    if not placements:
        return {}
    shrink = capability(ctx.backend, Capability.SHRINK)
    if not callable(shrink):
        names = [n for n in placements if n in running]
        log.warning("backend %s cannot remove single pods: stopping %s whole", ctx.backend.name, names)
        ctx.backend.stop(names)
        out = {n: running[n] for n in names}
        for n in names:
            ctx.engine.remove_running(n)
        return out
    for name, placement in placements.items():
        shrink(name, placement, "preempted: pods above gang.minMember removed")
    return {}
