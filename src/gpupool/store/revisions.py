"""Configuration history: every change of a pool, queue, priority class or cluster as a
numbered revision (1, 2, 3 ... per object) with author, time, reason and the whole object.

Why in the object's own transaction: a revision written apart could be lost (or a change
recorded that never happened); written with the row, history and state never diverge. Why
numbered per kind+name and never reset: a deleted and re-created object keeps counting, so a
revision number names one state for ever and a rollback can always say which one it restores.
The author and the reason come from the change's audit entry (``actor``, ``detail["reason"]``),
so no store call changes shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from gpupool.audit import AuditEntry
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database
from gpupool.store.errors import NotFound
from gpupool.store.records import API_VERSION
from gpupool.store.schema import Base, ObjectRow


class RevisionRow(Base):
    """One state of one configuration object (``action`` "delete": the state it was deleted in)."""

    __tablename__ = "object_revisions"
    __table_args__ = (sa.UniqueConstraint("kind", "name", "revision"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(64))
    name: Mapped[str] = mapped_column(sa.String(253))
    revision: Mapped[int]
    action: Mapped[str] = mapped_column(sa.String(16))
    author: Mapped[str] = mapped_column(sa.String(253))
    reason: Mapped[str] = mapped_column(sa.Text)
    at: Mapped[datetime]
    spec: Mapped[dict[str, Any]]
    labels: Mapped[dict[str, Any]]
    annotations: Mapped[dict[str, Any]]
    resource_version: Mapped[int]


@dataclass(frozen=True)
class RevisionRecord:
    """A revision as callers see it; ``manifest()`` is the object as it was (no resourceVersion,
    so applying it again is unconditional)."""

    kind: str
    name: str
    revision: int
    action: str
    author: str
    reason: str
    at: datetime
    spec: dict[str, Any]
    labels: dict[str, Any]
    annotations: dict[str, Any]
    resource_version: int

    def manifest(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        return {"apiVersion": API_VERSION, "kind": self.kind, "metadata": meta, "spec": dict(self.spec)}

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "revision": self.revision,
            "action": self.action,
            "author": self.author,
            "reason": self.reason,
            "at": self.at.isoformat(),
            "resourceVersion": self.resource_version,
            "manifest": self.manifest(),
        }


def _record(row: RevisionRow) -> RevisionRecord:
    return RevisionRecord(
        row.kind,
        row.name,
        row.revision,
        row.action,
        row.author,
        row.reason,
        row.at,
        dict(row.spec),
        dict(row.labels),
        dict(row.annotations),
        row.resource_version,
    )


def record_revision(
    s: Session,
    row: ObjectRow,
    audit: AuditEntry | None,
    now: datetime,
    action: Literal["apply", "delete"] = "apply",
) -> None:
    """Append the object's state as its next revision, inside the caller's transaction (the
    caller holds the object's row lock, or has just inserted it, so numbers never race)."""
    last = s.execute(
        sa.select(sa.func.max(RevisionRow.revision)).where(
            RevisionRow.kind == row.kind, RevisionRow.name == row.name
        )
    ).scalar_one()
    reason = (audit.detail.get("reason") if audit is not None else None) or ""
    s.add(
        RevisionRow(
            kind=row.kind,
            name=row.name,
            revision=(last or 0) + 1,
            action=action,
            author=audit.actor if audit is not None else "",
            reason=str(reason),
            at=now,
            spec=dict(row.spec),
            labels=dict(row.labels),
            annotations=dict(row.annotations),
            resource_version=row.resource_version,
        )
    )
    s.flush()


class RevisionRepository:
    """Reading the configuration history."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

    def list_revisions(self, kind: str, name: str) -> list[RevisionRecord]:
        """Every revision of one object, oldest first; NotFound if it never had one."""
        q = (
            sa.select(RevisionRow)
            .where(RevisionRow.kind == kind, RevisionRow.name == name)
            .order_by(RevisionRow.revision)
        )
        with self.db.read() as s:
            out = [_record(r) for r in s.execute(q).scalars()]
        if not out:
            raise NotFound(kind, name)
        return out

    def kind_revisions(self, kind: str) -> list[RevisionRecord]:
        """Every revision of every object of one kind, deleted ones included, in the order they
        were written. Why: what existed when (the Cluster objects' nodes, for the capacity a
        cost report prices) is the sequence of states, not the state in force."""
        q = sa.select(RevisionRow).where(RevisionRow.kind == kind).order_by(RevisionRow.id)
        with self.db.read() as s:
            return [_record(r) for r in s.execute(q).scalars()]

    def get_revision(self, kind: str, name: str, revision: int | None = None) -> RevisionRecord:
        """One revision (None: the latest); NotFound naming the revision if there is none."""
        q = sa.select(RevisionRow).where(RevisionRow.kind == kind, RevisionRow.name == name)
        q = q.where(RevisionRow.revision == revision) if revision is not None else q
        with self.db.read() as s:
            row = s.execute(q.order_by(RevisionRow.revision.desc()).limit(1)).scalar_one_or_none()
            if row is None:
                raise NotFound(kind, name if revision is None else f"{name} revision {revision}")
            return _record(row)
