"""Workload submission: idempotent by name, many submits in one group commit.

Why a group commit: a submit is durable only once committed, and the audit chain serialises
appends on one anchor row, so concurrent submits are cheapest when they share a commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from gpupool.audit import AuditEntry
from gpupool.store.audit_log import AuditLog, chain_rows
from gpupool.store.database import Database
from gpupool.store.errors import Conflict, StoreError
from gpupool.store.pg_pipeline import pg_append, pg_lock_and_insert, pg_pipeline_ok
from gpupool.store.records import WorkloadRecord, WorkloadSubmission
from gpupool.store.rows import ANCHOR, AUDIT, EVENTS, WORKLOADS, insert_ignore, workload_record
from gpupool.store.validation import canonical, check_submission


def _same(sub: WorkloadSubmission, owner: str, manifest: Mapping[str, Any]) -> Conflict | None:
    """None when ``sub`` resubmits what is stored, else the Conflict.

    One message whether the owner or the manifest differs: telling them apart would tell a
    member that another team uses the name."""
    if owner != sub.owner or (
        manifest is not sub.manifest and canonical(manifest) != canonical(sub.manifest)
    ):
        return Conflict(
            "metadata.name",
            f"workload {sub.name!r} already exists with a different manifest or owner; "
            "a resubmission must repeat the original exactly, otherwise choose another name",
        )
    return None


def _new_record(sub: WorkloadSubmission, seq: int, now: datetime) -> WorkloadRecord:
    return WorkloadRecord(
        seq=seq,
        name=sub.name,
        queue=sub.queue,
        priority_class=sub.priority_class,
        owner=sub.owner,
        manifest=sub.manifest,
        phase=sub.phase,
        placement=None,
        reason="",
        submitted_at=now,
        admitted_at=None,
        finished_at=None,
        resource_version=1,
    )


class SubmissionRepository:
    """``submit_workload`` and its batch form ``submit_workloads``."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

    def submit_workload(
        self,
        manifest: Mapping[str, Any],
        *,
        owner: str,
        phase: Literal["Pending", "AwaitingApproval"] = "Pending",
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> tuple[WorkloadRecord, bool]:
        """Submit; idempotent by name. Returns (record, created).

        Same name with the same manifest (ignoring ``status``) and owner returns
        the existing row with created=False; anything different is a Conflict.
        """
        sub = check_submission(manifest, owner=owner, phase=phase, audit=audit)
        res = self.submit_workloads([sub], at=at)[0]
        if isinstance(res, StoreError):
            raise res
        return res

    def submit_workloads(
        self, batch: Sequence[WorkloadSubmission], *, at: datetime | None = None
    ) -> list[tuple[WorkloadRecord, bool] | StoreError]:
        """Submit many in ONE transaction (group commit); one result per item, in order.

        Why: a submit is durable only once committed, and the audit chain serialises appends on
        one anchor row, so concurrent submits are cheapest when they share a commit. Each item
        has ``submit_workload``'s semantics: (record, created), or a StoreError (a Conflict for
        a different manifest or owner under an existing name) that fails that item alone. The
        same name twice in a batch is a resubmit of the first. Rows, ``Submitted`` events and
        audit records are written together or not at all. Should the database refuse the batch
        as a whole, each item is retried in its own transaction so one bad item cannot fail the
        others.
        """
        if not batch:
            return []
        now = self.db.now(at)
        try:
            with self.db.core_writer.begin() as conn:
                return self._submit_batch(conn, batch, now)
        except DBAPIError:
            if len(batch) == 1:
                raise
            out: list[tuple[WorkloadRecord, bool] | StoreError] = []
            for sub in batch:
                try:
                    with self.db.core_writer.begin() as conn:
                        out.extend(self._submit_batch(conn, [sub], now))
                except DBAPIError as exc:
                    out.append(StoreError("workload", f"the database refused it: {type(exc.orig).__name__}"))
            return out

    @staticmethod
    def _lock_and_insert(
        conn: sa.Connection, subs: Sequence[WorkloadSubmission], now: datetime
    ) -> tuple[tuple[int, str], dict[str, int]]:
        """Lock the audit anchor, insert the new names: ((count, head), name -> seq of those inserted).

        INSERT .. ON CONFLICT DO NOTHING: a name that exists (or that a concurrent writer is
        inserting: PostgreSQL waits for it) is skipped, and the caller compares it.
        """
        row = conn.execute(
            sa.select(ANCHOR.c.count, ANCHOR.c.head_hash).where(ANCHOR.c.id == 1).with_for_update()
        ).one()
        ins = insert_ignore(conn.dialect.name, WORKLOADS).returning(WORKLOADS.c.seq, WORKLOADS.c.name)
        rows = [
            {
                "name": sub.name,
                "queue": sub.queue,
                "priority_class": sub.priority_class,
                "owner": sub.owner,
                "manifest": sub.manifest,
                "phase": sub.phase,
                "placement": None,
                "reason": "",
                "submitted_at": now,
                "admitted_at": None,
                "finished_at": None,
                "resource_version": 1,
            }
            for sub in subs
        ]
        seqs = {name: seq for seq, name in conn.execute(ins, rows)}
        return (int(row[0]), str(row[1])), seqs

    def _submit_batch(
        self, conn: sa.Connection, batch: Sequence[WorkloadSubmission], now: datetime
    ) -> list[tuple[WorkloadRecord, bool] | StoreError]:
        """One batch in the caller's transaction: insert the new names, compare the rest."""
        out: list[tuple[WorkloadRecord, bool] | StoreError | None] = [None] * len(batch)
        firsts: dict[str, int] = {}
        for i, sub in enumerate(batch):
            firsts.setdefault(sub.name, i)
        new = [batch[i] for i in firsts.values()]
        # the anchor first: batches (of this or another process) then never wait on each other's
        # uncommitted names, so they cannot deadlock; every audited write takes it anyway
        pg = conn.dialect.name == "postgresql" and pg_pipeline_ok()
        anchor, seqs = pg_lock_and_insert(conn, new, now) if pg else self._lock_and_insert(conn, new, now)
        self.db.check_fence(conn)
        missing = sorted({sub.name for sub in new} - seqs.keys())
        existing: dict[str, Any] = {}
        if missing:
            q = sa.select(WORKLOADS).where(WORKLOADS.c.name.in_(missing))
            existing = {r.name: r for r in conn.execute(q)}
        created: list[WorkloadSubmission] = []
        for i, sub in enumerate(batch):
            first = firsts[sub.name]
            if sub.name in seqs:
                if i == first:
                    created.append(sub)
                    out[i] = (_new_record(sub, seqs[sub.name], now), True)
                else:  # the same name twice in one batch: the later one is a resubmit
                    out[i] = _same(sub, batch[first].owner, batch[first].manifest) or (
                        _new_record(batch[first], seqs[sub.name], now),
                        False,
                    )
                continue
            row = existing.get(sub.name)
            if row is None:  # deleted between the insert and the select: cannot happen, be explicit
                out[i] = StoreError("metadata.name", f"workload {sub.name!r} could not be stored; retry")
                continue
            out[i] = _same(sub, row.owner, row.manifest) or (workload_record(row), False)
        if created:
            self._record_created(conn, created, now, anchor, pg)
        return [r if r is not None else StoreError("workload", "not processed") for r in out]

    @staticmethod
    def _record_created(
        conn: sa.Connection,
        created: Sequence[WorkloadSubmission],
        now: datetime,
        anchor: tuple[int, str],
        pg: bool,
    ) -> None:
        """The ``Submitted`` events and audit records of the created workloads, and the anchor
        moved to the new head (in one pipelined round trip on PostgreSQL)."""
        events = [
            {
                "workload": c.name,
                "type": "Normal",
                "reason": "Submitted",
                "message": f"queue {c.queue}",
                "at": now,
            }
            for c in created
        ]
        entries = [
            replace(c.audit, kind=c.audit.kind or "Workload", name=c.audit.name or c.name)
            for c in created
            if c.audit is not None
        ]
        audit_rows, count, head = chain_rows(entries, now, *anchor)
        if pg:
            pg_append(conn, events, audit_rows, count, head)
        else:
            conn.execute(sa.insert(EVENTS), events)
            if audit_rows:
                conn.execute(sa.insert(AUDIT), audit_rows)
                conn.execute(sa.update(ANCHOR).where(ANCHOR.c.id == 1).values(count=count, head_hash=head))
