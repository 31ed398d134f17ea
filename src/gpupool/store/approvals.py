"""Approval requests (four-eyes): opened, decided or expired, moving the workload with them.

Why the workload moves in the same transaction: an approved request and a workload still
waiting for approval (or the reverse) must never be seen together.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpupool.audit import AuditEntry
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database
from gpupool.store.errors import Conflict, NotFound, ValidationFailed
from gpupool.store.phases import TERMINAL_PHASES, WARNING_PHASES
from gpupool.store.records import ApprovalRecord
from gpupool.store.rows import approval_record, beyond_ids
from gpupool.store.schema import ApprovalRow, EventRow, WorkloadRow


class ApprovalRepository:
    """Requesting, deciding, expiring and reading approvals."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

    def request_approval(
        self,
        workload: str,
        requested_by: str,
        *,
        expires_at: datetime,
        reason: str = "",
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> ApprovalRecord:
        """Open an approval request; Conflict if one is already pending for the workload."""
        now = self.db.now(at)
        exp = self.db.now(expires_at)
        if exp <= now:
            raise ValidationFailed("expires_at", "must be in the future")
        if not requested_by:
            raise ValidationFailed("requested_by", "required")
        with self.db.write() as s:
            if s.execute(sa.select(WorkloadRow.seq).where(WorkloadRow.name == workload)).first() is None:
                raise NotFound("Workload", workload)
            pending = s.execute(
                sa.select(ApprovalRow.id).where(
                    ApprovalRow.workload == workload, ApprovalRow.state == "Pending"
                )
            ).first()
            if pending is not None:
                raise Conflict("workload", f"workload {workload!r} already has pending approval {pending[0]}")
            row = ApprovalRow(
                workload=workload,
                requested_by=requested_by,
                state="Pending",
                approver=None,
                reason=reason,
                requested_at=now,
                decided_at=None,
                expires_at=exp,
            )
            s.add(row)
            s.flush()
            self.audit.append(s, audit, now, "Workload", workload)
            return approval_record(row)

    def decide_approval(
        self,
        approval_id: int,
        *,
        approver: str,
        approve: bool,
        reason: str = "",
        allow_self_approval: bool = False,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> ApprovalRecord:
        """Approve or reject a pending request, atomically moving an AwaitingApproval workload
        to Pending (approved) or Rejected. Conflict if already decided or expired, or (by
        default) if the approver is the requester (four-eyes)."""
        now = self.db.now(at)
        if not approver:
            raise ValidationFailed("approver", "required")
        if beyond_ids(approval_id):
            raise NotFound("Approval", str(approval_id))
        with self.db.write() as s:
            row = s.get(ApprovalRow, approval_id, with_for_update=True)
            if row is None:
                raise NotFound("Approval", str(approval_id))
            if row.state != "Pending":
                raise Conflict("state", f"approval {approval_id} is already {row.state}")
            if row.expires_at <= now:
                raise Conflict(
                    "expires_at", f"approval {approval_id} expired at {row.expires_at.isoformat()}"
                )
            if approver == row.requested_by and not allow_self_approval:
                raise Conflict("approver", "the requester cannot approve their own request")
            row.state = "Approved" if approve else "Rejected"
            row.approver = approver
            row.reason = reason or row.reason
            row.decided_at = now
            wl = s.execute(
                sa.select(WorkloadRow).where(WorkloadRow.name == row.workload).with_for_update()
            ).scalar_one()
            if wl.phase == "AwaitingApproval":
                self._set_phase(
                    s, wl, "Pending" if approve else "Rejected", reason or f"{row.state} by {approver}", now
                )
            s.flush()
            self.audit.append(s, audit, now, "Workload", row.workload)
            return approval_record(row)

    def _set_phase(self, s: Session, wl: WorkloadRow, phase: str, reason: str, now: datetime) -> None:
        old = wl.phase
        wl.phase = phase
        wl.reason = reason
        wl.resource_version += 1
        if phase in TERMINAL_PHASES:
            wl.finished_at = now
        s.add(
            EventRow(
                workload=wl.name,
                type="Warning" if phase in WARNING_PHASES else "Normal",
                reason=phase,
                message=reason or f"{old} -> {phase}",
                at=now,
            )
        )

    def expire_approvals(self, *, actor: str = "system", at: datetime | None = None) -> list[ApprovalRecord]:
        """Mark overdue pending approvals Expired; their AwaitingApproval workloads become Rejected."""
        now = self.db.now(at)
        with self.db.write() as s:
            rows = (
                s.execute(
                    sa.select(ApprovalRow)
                    .where(ApprovalRow.state == "Pending", ApprovalRow.expires_at <= now)
                    .order_by(ApprovalRow.id)
                    .with_for_update()
                )
                .scalars()
                .all()
            )
            for row in rows:
                row.state = "Expired"
                row.decided_at = now
                wl = s.execute(sa.select(WorkloadRow).where(WorkloadRow.name == row.workload)).scalar_one()
                if wl.phase == "AwaitingApproval":
                    self._set_phase(s, wl, "Rejected", "approval expired", now)
            s.flush()
            for row in rows:
                entry = AuditEntry(actor=actor, action="approval.expire", detail={"approval": row.id})
                self.audit.append(s, entry, now, "Workload", row.workload)
            return [approval_record(r) for r in rows]

    def get_approval(self, approval_id: int) -> ApprovalRecord:
        """One approval; NotFound if missing."""
        if beyond_ids(approval_id):
            raise NotFound("Approval", str(approval_id))
        with self.db.read() as s:
            row = s.get(ApprovalRow, approval_id)
            if row is None:
                raise NotFound("Approval", str(approval_id))
            return approval_record(row)

    def list_approvals(
        self, *, state: str | None = None, workload: str | None = None
    ) -> list[ApprovalRecord]:
        """Approvals oldest first, filtered by state and/or workload."""
        q = sa.select(ApprovalRow).order_by(ApprovalRow.id)
        if state is not None:
            q = q.where(ApprovalRow.state == state)
        if workload is not None:
            q = q.where(ApprovalRow.workload == workload)
        with self.db.read() as s:
            return [approval_record(r) for r in s.execute(q).scalars()]
