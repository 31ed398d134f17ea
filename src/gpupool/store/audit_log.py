"""The hash-chained audit log: appending inside a caller's transaction, reading, verifying and
exporting.

Why appends take the caller's session: every audited write appends its record in the same
transaction as the change, so state and audit never diverge. Why verify in one snapshot: the
chain and its anchor are read at the same instant, so a concurrent append cannot look like a
broken link.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal, TextIO

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpupool import audit as auditlog
from gpupool.audit import AuditEntry, AuditRecord, VerifyResult
from gpupool.store.database import Database
from gpupool.store.errors import ValidationFailed
from gpupool.store.rows import ANCHOR, AUDIT, audit_record, beyond_ids
from gpupool.store.schema import AuditAnchorRow, AuditRow


def chain_rows(
    entries: Sequence[AuditEntry], now: datetime, count: int, head: str
) -> tuple[list[dict[str, Any]], int, str]:
    """Audit rows chained after (count, head) from the locked anchor; returns (rows, count, head)."""
    rows = []
    for entry in entries:
        try:
            rec = auditlog.chain(entry, seq=count + 1, at=now, prev_hash=head)
        except ValueError as exc:
            raise ValidationFailed("audit", str(exc)) from exc
        count, head = rec.seq, rec.hash
        rows.append(
            {
                "seq": rec.seq,
                "at": rec.at,
                "actor": rec.actor,
                "action": rec.action,
                "kind": rec.kind,
                "name": rec.name,
                "detail": dict(rec.detail),
                "prev_hash": rec.prev_hash,
                "hash": rec.hash,
            }
        )
    return rows, count, head


class AuditLog:
    """The audit chain of one database: appends within a transaction, the head, verification."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def append(
        self, s: Session, entry: AuditEntry | None, at: datetime, kind: str = "", name: str = ""
    ) -> AuditRecord | None:
        """Append to the chain inside the caller's transaction ``s`` (its writer locked the
        anchor first); None when there is nothing to audit."""
        if entry is None:
            return None
        entry = replace(entry, kind=entry.kind or kind, name=entry.name or name)
        anchor = s.execute(
            sa.select(AuditAnchorRow)
            .where(AuditAnchorRow.id == 1)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalar_one()
        try:
            rec = auditlog.chain(entry, seq=anchor.count + 1, at=at, prev_hash=anchor.head_hash)
        except ValueError as exc:
            raise ValidationFailed("audit", str(exc)) from exc
        s.add(
            AuditRow(
                seq=rec.seq,
                at=rec.at,
                actor=rec.actor,
                action=rec.action,
                kind=rec.kind,
                name=rec.name,
                detail=dict(rec.detail),
                prev_hash=rec.prev_hash,
                hash=rec.hash,
            )
        )
        anchor.count = rec.seq
        anchor.head_hash = rec.hash
        s.flush()
        return rec

    def append_many(
        self, s: Session, entries: Sequence[AuditEntry], at: datetime, kind: str = "", name: str = ""
    ) -> None:
        """Append several records under one anchor lock, one INSERT and one anchor update.

        Why: a scheduling cycle (or a bulk cancel) audits one decision per workload; appending
        them one by one cost an anchor read and a flush each.
        """
        if len(entries) <= 1:
            for entry in entries:
                self.append(s, entry, at, kind, name)
            return
        s.flush()
        conn = s.connection()
        row = conn.execute(
            sa.select(ANCHOR.c.count, ANCHOR.c.head_hash).where(ANCHOR.c.id == 1).with_for_update()
        ).one()
        full = [replace(e, kind=e.kind or kind, name=e.name or name) for e in entries]
        rows, count, head = chain_rows(full, at, int(row[0]), str(row[1]))
        conn.execute(sa.insert(AUDIT), rows)
        conn.execute(sa.update(ANCHOR).where(ANCHOR.c.id == 1).values(count=count, head_hash=head))

    def append_audit(self, entry: AuditEntry, *, at: datetime | None = None) -> AuditRecord:
        """Append a standalone audit record (e.g. a denied request or a login)."""
        now = self.db.now(at)
        with self.db.write() as s:
            rec = self.append(s, entry, now)
            assert rec is not None
            return rec

    def audit_records(self, *, after_seq: int = 0, limit: int | None = None) -> list[AuditRecord]:
        """Audit records in seq order (none after a seq past what the column holds)."""
        if beyond_ids(after_seq):
            return []
        q = sa.select(AuditRow).where(AuditRow.seq > after_seq).order_by(AuditRow.seq)
        if limit is not None:
            q = q.limit(limit)
        with self.db.read() as s:
            return [audit_record(r) for r in s.execute(q).scalars()]

    def audit_head(self) -> tuple[int, str]:
        """(count, head hash) from the anchor; keep a copy elsewhere to detect wholesale rewrites."""
        with self.db.read() as s:
            anchor = s.get_one(AuditAnchorRow, 1)
            return anchor.count, anchor.head_hash

    @staticmethod
    def _iter(s: Session) -> Iterator[AuditRecord]:
        q = sa.select(AuditRow).order_by(AuditRow.seq).execution_options(yield_per=1000)
        for row in s.execute(q).scalars():
            yield audit_record(row)
            s.expunge(row)

    def verify_audit(
        self,
        *,
        expected_count: int | None = None,
        expected_head: str | None = None,
        checkpoint: tuple[int, str] | None = None,
    ) -> VerifyResult:
        """Verify the whole chain against the anchor (and optional external expectations), one snapshot.

        ``checkpoint`` (count, head hash) is an external witness taken earlier: the chain may have
        grown since, but record ``count`` must still have that hash (see :func:`auditlog.verify`).
        """
        with self.db.read(snapshot=True) as s:
            anchor = s.get_one(AuditAnchorRow, 1)
            count, head = anchor.count, anchor.head_hash
            result = auditlog.verify(
                self._iter(s), expected_count=count, expected_head=head, checkpoint=checkpoint
            )
        if result.ok and (expected_count is not None or expected_head is not None):
            result = auditlog.verify(
                self.audit_records(), expected_count=expected_count, expected_head=expected_head
            )
        return result

    def export_audit(self, fmt: Literal["jsonl", "csv"], out: TextIO) -> int:
        """Stream the audit log as JSONL or CSV; returns the number of records."""
        if fmt not in ("jsonl", "csv"):
            raise ValidationFailed("format", "must be 'jsonl' or 'csv'")
        with self.db.read(snapshot=True) as s:
            records = self._iter(s)
            return (
                auditlog.export_jsonl(records, out) if fmt == "jsonl" else auditlog.export_csv(records, out)
            )
