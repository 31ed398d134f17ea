"""Impact preview (``gpupool apply --dry-run``, ``POST /v1/apply?dryRun=true``): what a
configuration change would do to the work running and waiting now, before anyone applies it.

Why it can be exact: the engine is pure, so one cycle on the controller's running and pending
sets under the changed configuration — in memory, on an engine of its own — is the cycle the
controller runs right after the change is applied (``reload_config`` rebuilds its engine from
the same snapshot). The preview also runs the same cycle on the configuration in force, so the
report can say which decisions are due to the change and which would happen anyway.

What it does not change: no store write but one ``config.preview`` audit record, no backend
call, nothing in the controller (its lock is held only to copy its state). The summary is kept
in memory under the content hash of the change (``preview_id``), so the audit record of the
apply that follows carries it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.audit import AuditEntry, canonical_json
from gpupool.auth import Principal
from gpupool.engine import Decisions, Engine
from gpupool.manifests import Bundle
from gpupool.manifests.convert import workload_model
from gpupool.model import UNLIMITED, ZERO, Running, Snapshot, Workload
from gpupool.service.backends import Capability, capability
from gpupool.service.core import Service
from gpupool.service.errors import ApiError
from gpupool.service.failures.nodes import effective_nodes, occupy_unhealthy
from gpupool.service.windows import windowed_cycle

#: previews remembered for the apply that follows (per store), oldest dropped first
KEEP = 256
_seen: OrderedDict[tuple[int, str], dict[str, Any]] = OrderedDict()
_seen_lock = threading.Lock()


def preview_id(items: Sequence[Mapping[str, Any]]) -> str:
    """The content hash of a change set (server metadata and order of keys ignored), so the
    same set sent again for real finds its preview."""
    body = canonical_json([_content(m) for m in items])
    return "pv-" + hashlib.sha256(body.encode()).hexdigest()[:16]


def _content(m: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(m.get("metadata") or {})
    for k in ("resourceVersion", "uid", "creationTimestamp"):
        meta.pop(k, None)
    return {k: (meta if k == "metadata" else v) for k, v in m.items() if k != "status"}


def remembered(svc: Service, items: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The summary of the last preview of exactly this change on this server, if any."""
    with _seen_lock:
        return _seen.get((id(svc.store), preview_id(items)))


@dataclass(slots=True)
class _State:
    """A copy of what the controller schedules from, taken under its lock."""

    now: float
    running: list[Running]
    pending: list[Workload]
    bundle: Bundle


def _copy_state(svc: Service, new: Bundle, extra: Iterable[Workload]) -> _State:
    ctl = svc.controller
    with ctl.lock:
        now = ctl.clock()
        running = list(ctl.running_view().values())
        holds = ctl.faults.holds
        queued = [
            q for q in ctl.pending.values() if not q.exception and holds.get(q.name, float("-inf")) <= now
        ]
        if any(pc not in ctl.bundle.priority_classes for pc in new.priority_classes):
            # a priority class changed: derive the waiting work's models again, as a reload does
            pending = [_remodel(svc, q.name, q.seq, new) for q in queued]
        else:
            pending = [q.model for q in queued]
    return _State(now, running, pending + list(extra), new)


def _remodel(svc: Service, name: str, seq: int, bundle: Bundle) -> Workload:
    manifest = svc.store.get_workload(name).manifest
    return workload_model(
        manifest, bundle.priority_classes, float(seq), strict=False, types=bundle.task_types
    )


def _engine(svc: Service, bundle: Bundle, running: Sequence[Running], now: float) -> Engine:
    """A fresh engine as the controller's ``_install`` builds it (failed nodes unschedulable,
    unhealthy devices held), on a snapshot of our own."""
    faults = svc.controller.faults
    snap = Snapshot(
        effective_nodes(bundle.nodes, faults.down),
        tuple(bundle.pools),
        tuple(bundle.queues),
        tuple(bundle.priority_classes),
        running=tuple(running),
        now=now,
    )
    eng = Engine(snap)
    occupy_unhealthy(eng, faults.unhealthy)
    return eng


def with_live_nodes(svc: Service, bundle: Bundle) -> Bundle:
    """On a backend that observes its nodes the cluster's nodes are the live ones, as after a reload."""
    if capability(svc.backend, Capability.OBSERVED_NODES) is not None:
        bundle.nodes = list(svc.controller.bundle.nodes)
    return bundle


def simulate(svc: Service, new: Bundle, extra: Iterable[Workload] = ()) -> dict[str, Any]:
    """One cycle under the configuration in force and one under ``new``, on copies: the report."""
    st = _copy_state(svc, with_live_nodes(svc, new), extra)
    try:
        before = _engine(svc, svc.controller.bundle, st.running, st.now)
        after = _engine(svc, st.bundle, st.running, st.now)
        d_before, _ = windowed_cycle(before, st.pending, st.now)
        reclaim = _reclaimable(before, after, st.running)
        queues_before = _quota_rows(after, before)
        d_after, _ = windowed_cycle(after, st.pending, st.now)
        after.apply(d_after, st.pending, st.now)
    except (KeyError, ValueError) as exc:  # e.g. running work in a queue the change removes
        raise ApiError(
            422,
            f"the change cannot be previewed against what runs now: {exc}",
            [{"field": "items", "problem": "preview failed"}],
        ) from exc
    return {
        "preempted": _victims(d_after),
        "admitted": _admits(d_after),
        "reclaimable": reclaim,
        "becauseOfChange": _delta(d_before, d_after),
        "queues": _queue_changes(queues_before, after),
        "considered": {"running": len(st.running), "pending": len(st.pending)},
    }


def _victims(d: Decisions) -> list[dict[str, Any]]:
    return [
        {"workload": v.workload, "queue": v.queue, "rule": str(v.rule), "by": p.preemptor, "reason": v.reason}
        for p in d.preempted
        for v in p.victims
    ]


def _admits(d: Decisions) -> list[dict[str, Any]]:
    return [
        {"workload": a.workload, "queue": a.queue, "pool": a.pool, "borrowing": a.borrowing}
        for a in d.admitted
    ]


def _delta(before: Decisions, after: Decisions) -> dict[str, list[str]]:
    """Decisions the change makes or unmakes (the rest happen at the next cycle anyway)."""
    ab, aa = set(before.admitted_names()), set(after.admitted_names())
    vb, va = set(before.victims()), set(after.victims())
    return {
        "admitted": sorted(aa - ab),
        "noLongerAdmitted": sorted(ab - aa),
        "preempted": sorted(va - vb),
        "noLongerPreempted": sorted(vb - va),
    }


def _reclaimable(before: Engine, after: Engine, running: Sequence[Running]) -> list[dict[str, Any]]:
    """Running work over its queue's guarantee after the change (the cohort may take it back
    when others need it), with whether it was already so before."""
    out = []
    for r in running:
        q, pool = r.workload.queue, r.admission.pool
        if q not in after.quota.path or after.quota.figures(q, pool) is None:
            continue
        if after.quota.is_borrowing(q, pool):
            was = (
                q in before.quota.path
                and before.quota.figures(q, pool) is not None
                and before.quota.is_borrowing(q, pool)
            )
            out.append({"workload": r.name, "queue": q, "pool": pool, "already": was})
    return out


def _gpus(milli: int) -> float | None:
    """GPUs from milli-GPUs; None for a dimension nobody limits."""
    return None if milli >= UNLIMITED else round(milli / 1000, 3)


def _quota_rows(after: Engine, before: Engine) -> dict[tuple[str, str], dict[str, Any]]:
    """Per queue and pool: guarantee and limit before and after, and what it uses now."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for key in sorted(set(after.quota.keys()) | set(before.quota.keys())):
        f0, f1 = before.quota.figures(*key), after.quota.figures(*key)
        g0, g1 = (f0.guarantee if f0 else None), (f1.guarantee if f1 else None)
        l0, l1 = (f0.limit if f0 else None), (f1.limit if f1 else None)
        used = (f0.used if f0 else ZERO)[0]
        if not (used or (g0 or (0,))[0] or (g1 or (0,))[0]):
            continue
        rows[key] = {
            "queue": key[0],
            "pool": key[1],
            "guaranteeGPUs": [_gpus(g0[0]) if g0 else None, _gpus(g1[0]) if g1 else None],
            "limitGPUs": [_gpus(l0[0]) if l0 else None, _gpus(l1[0]) if l1 else None],
            "usedGPUs": [_gpus(used), _gpus(used)],
            "borrowing": [g0 is not None and used > g0[0], g1 is not None and used > g1[0]],
        }
    return rows


def _queue_changes(rows: dict[tuple[str, str], dict[str, Any]], after: Engine) -> list[dict[str, Any]]:
    """Fill in use and borrowing after the cycle; keep the rows where anything changes."""
    out = []
    for key, row in rows.items():
        f1 = after.quota.figures(*key)
        used = (f1.used if f1 else ZERO)[0]
        g1 = f1.guarantee if f1 else None
        row["usedGPUs"][1] = _gpus(used)
        row["borrowing"][1] = g1 is not None and used > g1[0]
        if any(row[k][0] != row[k][1] for k in ("guaranteeGPUs", "limitGPUs", "usedGPUs", "borrowing")):
            out.append(row)
    return out


def summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """The short form the audit log keeps: counts and the names the change affects."""
    delta = report["becauseOfChange"]
    return {
        "preempted": [v["workload"] for v in report["preempted"]],
        "admitted": len(report["admitted"]),
        "newlyReclaimable": [r["workload"] for r in report["reclaimable"] if not r["already"]],
        "becauseOfChange": {k: v for k, v in delta.items() if v},
        "queuesChanged": [f"{q['queue']}/{q['pool']}" for q in report["queues"]],
    }


def record(
    svc: Service, p: Principal, items: Sequence[Mapping[str, Any]], report: dict[str, Any], reason: str
) -> dict[str, Any]:
    """The one audit record a preview leaves; remembered for the apply of the same change."""
    pid = preview_id(items)
    short = summary(report)
    objects = [f"{m.get('kind')}/{(m.get('metadata') or {}).get('name')}" for m in items]
    detail: dict[str, Any] = {"id": pid, "objects": objects, "summary": short}
    if reason:
        detail["reason"] = reason
    svc.store.append_audit(AuditEntry(p.name, "config.preview", "Preview", pid, detail))
    with _seen_lock:
        _seen[(id(svc.store), pid)] = {"id": pid, **short}
        while len(_seen) > KEEP:
            _seen.popitem(last=False)
    return {"dryRun": True, "previewId": pid, **report}


__all__ = ["preview_id", "record", "remembered", "simulate", "summary", "with_live_nodes"]
