"""Reading, verifying and exporting the hash-chained audit log (appends happen in ``base``).

Why verify in one snapshot: the chain and its anchor are read at the same instant, so a
concurrent append cannot look like a broken link.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Literal, TextIO

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpupool import audit as auditlog
from gpupool.audit import AuditEntry, AuditRecord, VerifyResult
from gpupool.store.base import StoreBase
from gpupool.store.errors import ValidationFailed
from gpupool.store.rows import audit_record, beyond_ids
from gpupool.store.schema import AuditAnchorRow, AuditRow


class AuditMethods(StoreBase):
    """Standalone audit records, the head, verification and export."""

    def append_audit(self, entry: AuditEntry, *, at: datetime | None = None) -> AuditRecord:
        """Append a standalone audit record (e.g. a denied request or a login)."""
        now = self._now(at)
        with self._write() as s:
            rec = self._audit(s, entry, now)
            assert rec is not None
            return rec

    def audit_records(self, *, after_seq: int = 0, limit: int | None = None) -> list[AuditRecord]:
        """Audit records in seq order (none after a seq past what the column holds)."""
        if beyond_ids(after_seq):
            return []
        q = sa.select(AuditRow).where(AuditRow.seq > after_seq).order_by(AuditRow.seq)
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return [audit_record(r) for r in s.execute(q).scalars()]

    def audit_head(self) -> tuple[int, str]:
        """(count, head hash) from the anchor; keep a copy elsewhere to detect wholesale rewrites."""
        with self._read() as s:
            anchor = s.get_one(AuditAnchorRow, 1)
            return anchor.count, anchor.head_hash

    def _iter_audit(self, s: Session) -> Iterator[AuditRecord]:
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
        with self._read(snapshot=True) as s:
            anchor = s.get_one(AuditAnchorRow, 1)
            count, head = anchor.count, anchor.head_hash
            result = auditlog.verify(
                self._iter_audit(s), expected_count=count, expected_head=head, checkpoint=checkpoint
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
        with self._read(snapshot=True) as s:
            records = self._iter_audit(s)
            return (
                auditlog.export_jsonl(records, out) if fmt == "jsonl" else auditlog.export_csv(records, out)
            )
