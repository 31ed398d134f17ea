"""Incidents (告警处置): each firing of an alert condition gpupool evaluates itself
(gpupool.service.alerts), with an owner, an acknowledgement and a resolution note.

Why stored and audited: an alert that only pages is gone when it stops; the platform must show
afterwards who handled what and how fast ("配置记录、运行指标、告警处置"). A condition that
clears resolves its incident by itself (resolved by ``gpupool``); a person may resolve one
earlier with a note. At most one open incident per rule and subject.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from gpupool.audit import AuditEntry
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database
from gpupool.store.errors import Conflict, NotFound
from gpupool.store.rows import beyond_ids
from gpupool.store.schema import Base

STATES = ("Firing", "Acknowledged", "Resolved")
OPEN = ("Firing", "Acknowledged")
SYSTEM = "gpupool"


class IncidentRow(Base):
    __tablename__ = "incidents"
    __table_args__ = (
        sa.CheckConstraint(sa.column("state").in_(STATES), name="state"),
        sa.Index("ix_incidents_rule_subject_state", "rule", "subject", "state"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    rule: Mapped[str] = mapped_column(sa.String(128))
    subject: Mapped[str] = mapped_column(sa.String(253))
    severity: Mapped[str] = mapped_column(sa.String(16))
    state: Mapped[str] = mapped_column(sa.String(16))
    message: Mapped[str] = mapped_column(sa.Text)
    fired_at: Mapped[datetime]
    owner: Mapped[str] = mapped_column(sa.String(253))
    acked_by: Mapped[str] = mapped_column(sa.String(253))
    acked_at: Mapped[datetime | None]
    resolved_by: Mapped[str] = mapped_column(sa.String(253))
    resolved_at: Mapped[datetime | None]
    resolution: Mapped[str] = mapped_column(sa.Text)


#: what became of a notification (gpupool.service.notify): waiting in its sink's queue, failed
#: and tried again, delivered, given up after the last attempt, or dropped (the queue was full)
OUTCOMES = ("pending", "retrying", "delivered", "failed", "dropped")


class DeliveryRow(Base):
    """One notification of one change of an incident to one sink, and how it went."""

    __tablename__ = "incident_deliveries"
    __table_args__ = (sa.CheckConstraint(sa.column("outcome").in_(OUTCOMES), name="outcome"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    incident_id: Mapped[int] = mapped_column(sa.ForeignKey("incidents.id"), index=True)
    sink: Mapped[str] = mapped_column(sa.String(63))
    state: Mapped[str] = mapped_column(sa.String(16))
    attempts: Mapped[int]
    outcome: Mapped[str] = mapped_column(sa.String(16))
    last_error: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


def delivery_json(r: DeliveryRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "sink": r.sink,
        "state": r.state,
        "attempts": r.attempts,
        "outcome": r.outcome,
        "lastError": r.last_error,
        "createdAt": r.created_at.isoformat(),
        "updatedAt": r.updated_at.isoformat(),
    }


@dataclass(frozen=True)
class Firing:
    """A condition that holds now: which rule, on what (a queue, pool or node), how bad, why."""

    rule: str
    subject: str
    severity: str
    message: str


def incident_json(r: IncidentRow) -> dict[str, Any]:
    def t(x: datetime | None) -> str | None:
        return x.isoformat() if x is not None else None

    return {
        "id": r.id,
        "rule": r.rule,
        "subject": r.subject,
        "severity": r.severity,
        "state": r.state,
        "message": r.message,
        "firedAt": t(r.fired_at),
        "owner": r.owner,
        "acknowledgedBy": r.acked_by,
        "acknowledgedAt": t(r.acked_at),
        "resolvedBy": r.resolved_by,
        "resolvedAt": t(r.resolved_at),
        "resolution": r.resolution,
    }


class IncidentRepository:
    """Open, acknowledge, resolve and list incidents."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

    def sync_incidents(
        self,
        firing: Sequence[Firing],
        *,
        rules: Collection[str] | None = None,
        at: datetime | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[int, int]:
        """Open an incident for each condition that fires and has none open; resolve the open
        ones whose condition no longer fires. ``rules``: the rules that were evaluated (None:
        all) — an open incident of a rule that could not be evaluated stays open, since its
        condition is unknown, not cleared. ``on_change`` is given each opened or resolved
        incident once the transaction has committed (the notifier). Returns (opened, resolved)."""
        changed: list[dict[str, Any]] = []
        counts = self._sync_rows(firing, rules, self.db.now(at), changed)
        for incident in changed if on_change is not None else ():
            on_change(incident)  # type: ignore[misc]
        return counts

    def _sync_rows(
        self,
        firing: Sequence[Firing],
        rules: Collection[str] | None,
        now: datetime,
        changed: list[dict[str, Any]],
    ) -> tuple[int, int]:
        want = {(f.rule, f.subject): f for f in firing}
        answered = None if rules is None else set(rules)
        opened = resolved = 0
        with self.db.write() as s:
            rows = s.execute(sa.select(IncidentRow).where(IncidentRow.state.in_(OPEN))).scalars().all()
            have = {(r.rule, r.subject) for r in rows}
            for r in rows:
                if answered is not None and r.rule not in answered:
                    continue
                if (r.rule, r.subject) not in want:
                    r.state, r.resolved_by, r.resolved_at = "Resolved", SYSTEM, now
                    r.resolution = r.resolution or "condition cleared"
                    self._note(s, r, "incident.resolve", now)
                    changed.append(incident_json(r))
                    resolved += 1
            for key, f in want.items():
                if key not in have:
                    row = IncidentRow(
                        rule=f.rule, subject=f.subject, severity=f.severity, state="Firing",
                        message=f.message, fired_at=now, owner="", acked_by="", acked_at=None,
                        resolved_by="", resolved_at=None, resolution="",
                    )  # fmt: skip
                    s.add(row)
                    s.flush()
                    self._note(s, row, "incident.open", now)
                    changed.append(incident_json(row))
                    opened += 1
        return opened, resolved

    def _note(self, s: Session, r: IncidentRow, action: str, now: datetime, actor: str = SYSTEM) -> None:
        detail = {"rule": r.rule, "subject": r.subject, "state": r.state}
        if r.resolution:
            detail["resolution"] = r.resolution
        self.audit.append(
            s, AuditEntry(actor, action, "Incident", str(r.id), detail), now, "Incident", str(r.id)
        )

    def _open_row(self, s: Session, incident: int) -> IncidentRow:
        if beyond_ids(incident):
            raise NotFound("Incident", str(incident))
        row = s.get(IncidentRow, incident, with_for_update=True)
        if row is None:
            raise NotFound("Incident", str(incident))
        if row.state == "Resolved":
            raise Conflict("state", f"incident {incident} is already resolved")
        return row

    def ack_incident(
        self, incident: int, who: str, owner: str = "", *, at: datetime | None = None
    ) -> dict[str, Any]:
        """Someone takes it: Acknowledged, owned by ``owner`` (default: who)."""
        now = self.db.now(at)
        with self.db.write() as s:
            row = self._open_row(s, incident)
            row.state, row.acked_by, row.acked_at, row.owner = "Acknowledged", who, now, owner or who
            self._note(s, row, "incident.ack", now, who)
            return incident_json(row)

    def resolve_incident(
        self, incident: int, who: str, note: str, *, at: datetime | None = None
    ) -> dict[str, Any]:
        """Closed by a person with what was done (the note is required: it is the record)."""
        now = self.db.now(at)
        with self.db.write() as s:
            row = self._open_row(s, incident)
            row.state, row.resolved_by, row.resolved_at, row.resolution = "Resolved", who, now, note
            self._note(s, row, "incident.resolve", now, who)
            return incident_json(row)

    def list_incidents(self, *, open_only: bool = False, limit: int = 200) -> list[dict[str, Any]]:
        """Newest first."""
        q = sa.select(IncidentRow).order_by(IncidentRow.id.desc()).limit(limit)
        if open_only:
            q = q.where(IncidentRow.state.in_(OPEN))
        with self.db.read() as s:
            return [incident_json(r) for r in s.execute(q).scalars()]

    def incidents_between(self, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """Every incident open at some time in ``[start, end)`` (fired before the end, not
        resolved before the start), oldest first: what a period's review counts."""
        q = (
            sa.select(IncidentRow)
            .where(IncidentRow.fired_at < end)
            .where(sa.or_(IncidentRow.resolved_at.is_(None), IncidentRow.resolved_at >= start))
            .order_by(IncidentRow.id)
        )
        with self.db.read() as s:
            return [incident_json(r) for r in s.execute(q).scalars()]

    def get_incident(self, incident: int) -> dict[str, Any]:
        """One incident with its deliveries (oldest first)."""
        if beyond_ids(incident):
            raise NotFound("Incident", str(incident))
        with self.db.read() as s:
            row = s.get(IncidentRow, incident)
            if row is None:
                raise NotFound("Incident", str(incident))
            q = sa.select(DeliveryRow).where(DeliveryRow.incident_id == incident).order_by(DeliveryRow.id)
            return {**incident_json(row), "deliveries": [delivery_json(d) for d in s.execute(q).scalars()]}

    def open_delivery(self, incident: int, sink: str, state: str, *, at: datetime | None = None) -> int:
        """Record a notification as pending (nothing tried yet): its id."""
        now = self.db.now(at)
        with self.db.write() as s:
            row = DeliveryRow(
                incident_id=incident, sink=sink, state=state, attempts=0, outcome="pending",
                last_error="", created_at=now, updated_at=now,
            )  # fmt: skip
            s.add(row)
            s.flush()
            return row.id

    def update_delivery(
        self, delivery: int, *, attempts: int, outcome: str, error: str, at: datetime | None = None
    ) -> None:
        """How a notification stands after an attempt (or being dropped)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome: must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        now = self.db.now(at)
        with self.db.write() as s:
            row = s.get(DeliveryRow, delivery)
            if row is None:
                raise NotFound("IncidentDelivery", str(delivery))
            row.attempts, row.outcome, row.last_error, row.updated_at = attempts, outcome, error, now
