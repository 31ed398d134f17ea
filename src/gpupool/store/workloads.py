"""Reading workloads, their pending reasons, their phase changes and their events.

Why phase changes come in sets: a scheduling cycle admits, preempts and requeues many
workloads at once; ``apply_transitions`` writes them, their events and their audit records in
one transaction, all or none.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from gpupool.audit import AuditEntry
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database
from gpupool.store.errors import Conflict, NotFound, ValidationFailed
from gpupool.store.phases import ALLOWED_TRANSITIONS, EVENT_TYPES, TERMINAL_PHASES, WARNING_PHASES
from gpupool.store.records import KEEP, EventRecord, PhaseChange, WorkloadRecord, _Keep
from gpupool.store.rows import ANCHOR, WORKLOADS, beyond_ids, chunks, event_record, workload_record
from gpupool.store.schema import PHASES, EventRow, WorkloadRow
from gpupool.store.validation import check_version, json_copy


def _change_phase(row: WorkloadRow, c: PhaseChange, now: datetime) -> EventRow:
    """Apply one checked phase change to its locked row; the event that records it.

    Conflict when ``c.expected_version`` is stale or the lifecycle does not allow the move
    (staying in a live phase is allowed: a new reason or placement)."""
    check_version(f"workload {c.name!r}", row.resource_version, c.expected_version)
    old = row.phase
    same_ok = c.phase == old and old not in TERMINAL_PHASES
    if not same_ok and c.phase not in ALLOWED_TRANSITIONS[old]:
        raise Conflict("phase", f"workload {c.name!r} cannot go from {old} to {c.phase}")
    row.phase = c.phase
    row.reason = c.reason
    if not isinstance(c.placement, _Keep):
        row.placement = None if c.placement is None else json_copy(dict(c.placement), "placement")
    elif c.phase in ("Pending", "AwaitingApproval"):
        row.placement = None
    if c.phase == "Admitted" and old != "Admitted":
        row.admitted_at = now
    if c.phase in TERMINAL_PHASES:
        row.finished_at = now
    row.resource_version += 1
    return EventRow(
        workload=c.name,
        type="Warning" if c.phase in WARNING_PHASES else "Normal",
        reason=c.phase,
        message=c.reason or f"{old} -> {c.phase}",
        at=now,
    )


class WorkloadRepository:
    """Workload reads, pending reasons, phase changes and events."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

    def pending_reasons(self, names: Sequence[str] | None = None) -> dict[str, str]:
        """Name -> stored reason of the Pending workloads (of ``names``; all in arrival order).

        Why: the controller resyncs its pending set periodically, and checks that what it was
        handed is still Pending; reading two narrow columns instead of whole rows keeps that
        cheap with a large backlog.
        """
        q = (
            sa.select(WORKLOADS.c.name, WORKLOADS.c.reason)
            .where(WORKLOADS.c.phase == "Pending")
            .order_by(WORKLOADS.c.seq)
        )
        out: dict[str, str] = {}
        with self.db.engine.connect() as conn:
            if names is None:
                out.update((n, r) for n, r in conn.execute(q))
            else:
                for part in chunks(sorted(set(names))):
                    out.update((n, r) for n, r in conn.execute(q.where(WORKLOADS.c.name.in_(part))))
        return out

    def set_pending_reasons(self, reasons: Mapping[str, str]) -> int:
        """Record why Pending workloads wait (the scheduler's latest reason), in one transaction.

        Why: the reason must be visible in every workload view and survive a restart, yet the
        scheduler re-derives it every cycle; the caller passes only the reasons whose text
        changed, so a cycle costs one statement, not a write per pending workload. Only rows
        still Pending are touched (a workload admitted or cancelled meanwhile keeps its own
        reason); resourceVersion is not bumped and nothing is audited: this is advisory status,
        not a decision. Returns the number of rows updated.
        """
        if not reasons:
            return 0
        # the driver's executemany directly: SQLAlchemy's per-row parameter processing cost more
        # than the UPDATEs themselves for a few thousand reasons (and it runs in the scheduler)
        # (PostgreSQL: one statement over two arrays instead of a round trip per row)
        pairs = sorted(reasons.items())
        with self.db.core_writer.begin() as conn:
            if self.db.dialect == "postgresql":
                # the anchor first, as every writer does (no lock-order deadlock with a cycle)
                conn.execute(sa.select(ANCHOR.c.id).where(ANCHOR.c.id == 1).with_for_update())
                self.db.check_fence(conn)
                res = conn.exec_driver_sql(
                    "UPDATE workloads AS w SET reason = v.r FROM unnest(%s::text[], %s::text[]) AS v(n, r) "
                    "WHERE w.name = v.n AND w.phase = 'Pending'",
                    ([n for n, _ in pairs], [r for _, r in pairs]),
                )
            else:
                self.db.check_fence(conn)
                res = conn.exec_driver_sql(
                    "UPDATE workloads SET reason = ? WHERE name = ? AND phase = 'Pending'",
                    [(r, n) for n, r in pairs],
                )
            return int(res.rowcount)

    def get_workload(self, name: str) -> WorkloadRecord:
        """One workload; NotFound if missing."""
        with self.db.read() as s:
            row = s.execute(sa.select(WorkloadRow).where(WorkloadRow.name == name)).scalar_one_or_none()
            if row is None:
                raise NotFound("Workload", name)
            return workload_record(row)

    def list_workloads(
        self,
        *,
        queues: Collection[str] | None = None,
        phases: Collection[str] | None = None,
        owner: str | None = None,
        names: Collection[str] | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[WorkloadRecord]:
        """Workloads in arrival order, filtered; ``after_seq``/``limit`` page through them."""
        # past what the column holds nothing lies after it (PostgreSQL cannot compare it: a 500)
        after = sa.false() if beyond_ids(after_seq) else WorkloadRow.seq > after_seq
        q = sa.select(WorkloadRow).where(after).order_by(WorkloadRow.seq)
        q = _filtered(q, queues, phases, owner)  # checks the phases first, as before
        if limit is not None and limit < 0:
            raise ValidationFailed("limit", "must be >= 0")
        if names is not None:
            q = q.where(WorkloadRow.name.in_(list(names)))
        if limit is not None:
            q = q.limit(limit)
        with self.db.read() as s:
            return [workload_record(r) for r in s.execute(q).scalars()]

    def page_workloads(
        self,
        *,
        queues: Collection[str] | None = None,
        phases: Collection[str] | None = None,
        owner: str | None = None,
        types: Collection[str] | None = None,
        newest_first: bool = True,
        from_seq: int | None = None,
        limit: int = 500,
    ) -> tuple[list[WorkloadRecord], bool]:
        """One page of workloads and whether more follow; ``from_seq`` is the last seq of the
        page before (exclusive), in the page's order (newest first by default).

        Why a page and a flag: a list answers at most ``limit`` objects however many exist, and
        says whether to ask again, so no caller drops what lies past its first page."""
        seq = WorkloadRow.seq
        q = _filtered(
            sa.select(WorkloadRow).order_by(seq.desc() if newest_first else seq), queues, phases, owner
        )
        if limit < 1:
            raise ValidationFailed("limit", "must be >= 1")
        if from_seq is not None and beyond_ids(from_seq):
            # past what the column holds every seq lies before it and none after it (decided
            # here: PostgreSQL cannot compare the column with it and answered a 500)
            q = q if newest_first else q.where(sa.false())
        elif from_seq is not None:
            q = q.where(seq < from_seq if newest_first else seq > from_seq)
        if types is not None:
            kind = WorkloadRow.manifest[("spec", "type")].as_string()
            # a manifest that names no type has the schema's default, batch
            match = kind.in_(list(types))
            q = q.where(sa.or_(match, kind.is_(None)) if "batch" in types else match)
        with self.db.read() as s:
            rows = list(s.execute(q.limit(limit + 1)).scalars())
        return [workload_record(r) for r in rows[:limit]], len(rows) > limit

    def phase_counts(self) -> dict[str, int]:
        """How many workloads are in each phase (phases with none are absent); for the metrics."""
        with self.db.engine.connect() as c:
            rows = c.execute(sa.select(WorkloadRow.phase, sa.func.count()).group_by(WorkloadRow.phase)).all()
        return {p: n for p, n in rows}

    def transition_workload(
        self,
        name: str,
        phase: str,
        *,
        reason: str = "",
        placement: Mapping[str, Any] | _Keep | None = KEEP,
        expected_version: int | None = None,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> WorkloadRecord:
        """Move one workload to ``phase`` (see ALLOWED_TRANSITIONS); records an event."""
        change = PhaseChange(name, phase, reason, placement, expected_version)
        return self.apply_transitions([change], audit=[audit] if audit else None, at=at)[0]

    def apply_transitions(
        self,
        changes: Sequence[PhaseChange],
        *,
        audit: Sequence[AuditEntry] | None = None,
        at: datetime | None = None,
        events: Sequence[tuple[str, str, str, str]] = (),
    ) -> list[WorkloadRecord]:
        """Apply several phase changes atomically (e.g. one scheduling cycle): all or none.

        Entering Admitted sets admitted_at; a terminal phase sets finished_at;
        Pending/AwaitingApproval clear the placement unless one is given.
        ``audit`` entries (any number) are appended in the same transaction, and so are
        ``events`` ``(workload, type, reason, message)`` (e.g. a failure record that must never
        be lost while its requeue is kept, or the reverse).
        """
        now = self.db.now(at)
        names = [c.name for c in changes]
        if len(set(names)) != len(names):
            raise ValidationFailed("changes", "a workload appears more than once")
        for c in changes:
            if c.phase not in PHASES:
                raise ValidationFailed("phase", f"unknown phase {c.phase!r}; one of {list(PHASES)}")
        out: dict[str, WorkloadRecord] = {}
        with self.db.write() as s:
            rows = {
                r.name: r
                for r in s.execute(
                    sa.select(WorkloadRow)
                    .where(WorkloadRow.name.in_(names))
                    .order_by(WorkloadRow.name)
                    .with_for_update()
                ).scalars()
            }
            for c in changes:
                row = rows.get(c.name)
                if row is None:
                    raise NotFound("Workload", c.name)
                s.add(_change_phase(row, c, now))
            for wl, typ, reason, message in events:
                if typ not in EVENT_TYPES:
                    raise ValidationFailed("type", f"must be one of {list(EVENT_TYPES)}")
                s.add(EventRow(workload=wl, type=typ, reason=reason, message=message, at=now))
            s.flush()
            self.audit.append_many(s, audit or (), now, "Workload", names[0] if len(names) == 1 else "")
            out = {n: workload_record(rows[n]) for n in names}
        return [out[n] for n in names]

    def add_event(
        self, workload: str, type: str, reason: str, message: str = "", *, at: datetime | None = None
    ) -> EventRecord:
        """Record an event against a workload (NotFound if the workload is unknown)."""
        if type not in EVENT_TYPES:
            raise ValidationFailed("type", f"must be one of {list(EVENT_TYPES)}")
        if not reason:
            raise ValidationFailed("reason", "required")
        now = self.db.now(at)
        with self.db.write() as s:
            if s.execute(sa.select(WorkloadRow.seq).where(WorkloadRow.name == workload)).first() is None:
                raise NotFound("Workload", workload)
            row = EventRow(workload=workload, type=type, reason=reason, message=message, at=now)
            s.add(row)
            s.flush()
            return event_record(row)

    def list_events(self, workload: str | None = None, *, limit: int | None = None) -> list[EventRecord]:
        """Events oldest first, optionally for one workload; ``limit`` keeps the newest."""
        q = sa.select(EventRow).order_by(EventRow.id.desc())
        if workload is not None:
            q = q.where(EventRow.workload == workload)
        if limit is not None:
            q = q.limit(limit)
        with self.db.read() as s:
            return [event_record(r) for r in reversed(s.execute(q).scalars().all())]


def _filtered(
    q: Any, queues: Collection[str] | None, phases: Collection[str] | None, owner: str | None
) -> Any:
    """The filters every workload list takes (an unknown phase is a ValidationFailed)."""
    if phases is not None:
        bad = sorted(set(phases) - set(PHASES))
        if bad:
            raise ValidationFailed("phase", f"unknown phases {bad}")
        q = q.where(WorkloadRow.phase.in_(list(phases)))
    if queues is not None:
        q = q.where(WorkloadRow.queue.in_(list(queues)))
    if owner is not None:
        q = q.where(WorkloadRow.owner == owner)
    return q
