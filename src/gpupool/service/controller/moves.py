"""The controller's side of a consolidation move (the engine's ``Move``, KAI's consolidation).

Why apart from ``commit.py``: a move is neither an eviction nor an admission. The workload
stays Running, but on a new placement that the engine reserved for it (nothing else was placed
on those devices), restarted from the beginning: its work so far is lost, as in the simulator
(sim/moves.py). The new placement (admitted now), an audit entry (``workload.move``: for whom,
from and to which nodes, the GPU-seconds lost) and an event with the reason (``Consolidated:
freed node X for Y``) are written in the cycle's one write-ahead transaction; the backend then
stops the run and restarts it on the new placement (``move``), before the beneficiary starts
on the devices it left. A backend that cannot move one run (``move`` returns False or refuses)
gets it stopped and requeued whole, as an eviction would have done.

A backend without ``move`` at all gets no Move: ``plannable_pools`` turns consolidation off in
the engine's pools for it, and the reason is kept (``Configuration.consolidation_off``, logged,
shown in the controller's health).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.engine import Admit, Decisions
from gpupool.engine.decisions import Move
from gpupool.manifests.convert import placement_json
from gpupool.model import ResourcePool, Running
from gpupool.service.backends import Backend, BackendError, Capability, RunSpec, capability, pod_commands
from gpupool.service.controller.context import SCHEDULER, Context
from gpupool.store import NotFound, NotLeader, PhaseChange

log = logging.getLogger("gpupool.controller")

#: an event per moved workload: (workload, type, reason, message), as ``apply_transitions`` takes
MoveEvent = tuple[str, str, str, str]


@dataclass(frozen=True, slots=True)
class Planned:
    """A move for the backend: the new placement (JSON form, as stored), the move's reason, and
    what the metrics count once it is carried out (queue, pool, GPU-seconds of work lost)."""

    placement: dict[str, Any]
    reason: str
    queue: str
    pool: str
    gpu_s_lost: float


def plannable_pools(
    pools: Sequence[ResourcePool], backend: Backend
) -> tuple[list[ResourcePool], dict[str, str]]:
    """The pools as the engine may plan on ``backend``: consolidation off in each pool that sets
    it when the backend cannot carry a move out; also why, per pool so changed."""
    if capability(backend, Capability.MOVE) is not None:
        return list(pools), {}
    out, off = [], {}
    for p in pools:
        if p.consolidation is not None and p.consolidation.enabled:
            off[p.name] = (
                f"spec.consolidation is on, but the {backend.name} backend cannot move a running "
                "workload (no Capability.MOVE): consolidation is off in this pool"
            )
            p = replace(p, consolidation=None)
        out.append(p)
    return out, off


def _gpu_seconds(placement: Mapping[str, Any], now: float) -> float:
    """The work a move throws away: the run's GPUs times the time since it (re)started."""
    units = sum(
        int(p.get("gpuMilli", 1000)) * len(p.get("devices") or ()) for p in placement.get("pods") or ()
    )
    start = float(placement.get("admittedAt") or now)
    return units / 1000.0 * max(0.0, now - start)


def move_records(
    ctx: Context, d: Decisions, now: float, changes: list[PhaseChange], audits: list[AuditEntry]
) -> tuple[list[MoveEvent], dict[str, Planned]]:
    """Add each move's durable records to the cycle's (see the module); also returns each
    moved workload's ``Planned`` move (for the backend)."""
    events: list[MoveEvent] = []
    placements: dict[str, Planned] = {}
    for m in d.moved:
        try:
            rec = ctx.store.get_workload(m.workload)
        except NotFound:
            continue
        old = dict(rec.placement or {})
        placement = placement_json(_as_admit(m, bool(old.get("borrowing"))), now)
        changes.append(PhaseChange(m.workload, rec.phase, m.reason, placement))
        to = sorted({p.node for p in m.pods})
        lost = round(_gpu_seconds(old, now), 3)
        placements[m.workload] = Planned(placement, m.reason, m.queue, m.pool, lost)
        detail = {
            "reason": m.reason,
            "for": m.for_workload,
            "queue": m.queue,
            "pool": m.pool,
            "fromNodes": list(m.from_nodes),
            "toNodes": to,
            "gpuSecondsLost": lost,
        }
        audits.append(AuditEntry(SCHEDULER, "workload.move", "Workload", m.workload, detail))
        why = f"{m.reason}: moved from {', '.join(m.from_nodes)} to {', '.join(to)}, restarted ({lost:g} GPU-seconds of work lost)"
        events.append((m.workload, "Warning", "Consolidated", why))
    return events, placements


def _as_admit(m: Move, borrowing: bool) -> Admit:
    return Admit(m.workload, m.queue, m.pool, m.pods, borrowing, m.reason)


def run_spec(ctx: Context, name: str, r: Running, placement: Mapping[str, Any]) -> RunSpec:
    """What the backend restarts: as ``Commit.start_specs`` builds it for a start."""
    w = r.workload
    cmds = capability(ctx.backend, Capability.NEEDS_COMMANDS) is True
    return RunSpec(
        name,
        placement,
        w.expected_duration_s,
        str(w.type),
        ctx.faults.hints.get(name, {}),
        pod_commands(ctx.manifest_of(name)) if cmds else {},
    )


def move_in_backend(ctx: Context, placements: Mapping[str, Planned]) -> dict[str, Running]:
    """Have the backend restart each moved run on its new placement (the message it is given
    is the move's reason: "Consolidated: freed node n-001 for big"), counted by ``on_move``;
    the runs it could not move, taken out of the engine, for the caller to stop and requeue
    as victims (counted as preemptions there, not as moves)."""
    move = capability(ctx.backend, Capability.MOVE)
    out: dict[str, Running] = {}
    for name, pl in placements.items():
        r = ctx.engine.running.get(name)
        if r is None:
            continue
        ok = False
        if callable(move):
            try:
                ok = bool(move(run_spec(ctx, name, r, pl.placement), pl.reason))
            except NotLeader:
                raise
            except BackendError as exc:
                log.error("backend %s refused to move %s: %s", ctx.backend.name, name, exc)
        if ok:
            ctx.hooks.on_move(pl.queue, pl.pool, pl.gpu_s_lost)
        else:
            log.warning("backend %s cannot move %s: stopping it whole", ctx.backend.name, name)
            out[name] = r
            ctx.engine.remove_running(name)
    return out
