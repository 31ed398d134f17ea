"""Group commit for submissions: concurrent submits share one transaction.

Why: a submit is acknowledged only once its row, its event and its hash-chained audit record
are committed. The audit chain serialises every append on one anchor row, so one transaction
per submit caps throughput at one commit (plus ORM overhead) per submit. Batching whatever
arrived while the previous batch was committing keeps every acknowledgement durable and
ordered, while the cost of a commit is shared by the whole batch.

The semantics are those of ``Store.submit_workload`` (same validation helpers, idempotent by
name, Conflict on a different manifest or owner); an unexpected database error in a batch
falls back to the store's own one-by-one path so a single bad item cannot fail the others.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from gpupool import audit as auditlog
from gpupool.audit import AuditEntry
from gpupool.store import Conflict, Store, StoreError, ValidationFailed, WorkloadRecord
from gpupool.store.schema import AuditAnchorRow, AuditRow, EventRow, WorkloadRow
from gpupool.store.store import _canonical, _check_manifest, _check_name, _json_copy

log = logging.getLogger("gpupool.batch")

Result = tuple[WorkloadRecord, bool]


@dataclass(slots=True)
class _Item:
    manifest: dict[str, Any]
    name: str
    queue: str
    priority_class: str | None
    owner: str
    phase: str
    audit: AuditEntry
    future: Future[Result] = field(default_factory=Future)


def _table(cls: Any) -> sa.Table:
    t: sa.Table = cls.__table__
    return t


WT, ET, AT, ANCHOR = _table(WorkloadRow), _table(EventRow), _table(AuditRow), _table(AuditAnchorRow)


def _record(row: Any) -> WorkloadRecord:
    return WorkloadRecord(
        seq=row["seq"],
        name=row["name"],
        queue=row["queue"],
        priority_class=row["priority_class"],
        owner=row["owner"],
        manifest=row["manifest"],
        phase=row["phase"],
        placement=row["placement"],
        reason=row["reason"],
        submitted_at=row["submitted_at"],
        admitted_at=row["admitted_at"],
        finished_at=row["finished_at"],
        resource_version=row["resource_version"],
    )


class SubmitBatcher:
    """One writer thread; callers get a Future resolved when their submit is durable."""

    def __init__(self, store: Store, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
        self._items: deque[_Item] = deque()
        self._cv = threading.Condition()
        self._stop = False
        sqlite = store.engine.dialect.name == "sqlite"
        self._writer = store.engine.execution_options(gpupool_begin="IMMEDIATE") if sqlite else store.engine
        self._thread = threading.Thread(target=self._run, name="gpupool-submit-batcher", daemon=True)
        self._thread.start()
        self.batches = 0
        self.items = 0

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(10)

    def submit(
        self, manifest: Mapping[str, Any], *, owner: str, phase: str, audit: AuditEntry
    ) -> Future[Result]:
        """Validate now (raises StoreError), commit with the next batch (the Future)."""
        _kind, name, _meta, spec = _check_manifest(manifest, ("Workload",))
        queue = spec.get("queue")
        if not isinstance(queue, str) or not queue:
            raise ValidationFailed("spec.queue", "required, must be a non-empty string")
        _check_name(queue, "spec.queue")
        pc = spec.get("priorityClass")
        if pc is not None and (not isinstance(pc, str) or not pc):
            raise ValidationFailed("spec.priorityClass", "must be a non-empty string when given")
        if not owner:
            raise ValidationFailed("owner", "required, must be a non-empty string")
        if phase not in ("Pending", "AwaitingApproval"):
            raise ValidationFailed("phase", "initial phase must be Pending or AwaitingApproval")
        stored = _json_copy({k: v for k, v in manifest.items() if k != "status"}, "manifest")
        item = _Item(stored, name, queue, pc, owner, phase, audit)
        with self._cv:
            if self._stop:
                raise RuntimeError("the server is shutting down")
            self._items.append(item)
            self._cv.notify()
        return item.future

    # ------------------------------------------------------------------ the writer
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items and not self._stop:
                    self._cv.wait()
                if not self._items and self._stop:
                    return
                batch = [self._items.popleft() for _ in range(min(len(self._items), self.max_batch))]
            try:
                results = self._write(batch)
            except Exception:  # e.g. a concurrent writer in another process: fall back one by one
                log.warning("batched submit failed; retrying one by one", exc_info=True)
                results = []
                for it in batch:
                    try:
                        results.append(
                            self.store.submit_workload(
                                it.manifest,
                                owner=it.owner,
                                phase="AwaitingApproval" if it.phase == "AwaitingApproval" else "Pending",
                                audit=it.audit,
                            )
                        )
                    except Exception as exc:
                        results.append(exc)
            self.batches += 1
            self.items += len(batch)
            for it, res in zip(batch, results, strict=True):
                if isinstance(res, BaseException):
                    it.future.set_exception(res)
                else:
                    it.future.set_result(res)

    def _write(self, batch: Sequence[_Item]) -> list[Result | Exception]:
        now = self.store.clock().astimezone(UTC)
        wt = WT
        out: list[Result | Exception | None] = [None] * len(batch)
        with self._writer.begin() as conn:
            anchor = conn.execute(
                sa.select(ANCHOR.c.count, ANCHOR.c.head_hash).where(ANCHOR.c.id == 1).with_for_update()
            ).one()
            names = sorted({it.name for it in batch})
            existing = {
                r["name"]: r for r in conn.execute(sa.select(wt).where(wt.c.name.in_(names))).mappings()
            }
            firsts: dict[str, _Item] = {}
            new: list[tuple[int, _Item]] = []
            for i, it in enumerate(batch):
                row = existing.get(it.name)
                if row is not None:
                    out[i] = self._same(it, row["owner"], row["manifest"]) or (_record(row), False)
                    continue
                first = firsts.get(it.name)
                if first is not None:  # the same name twice in one batch: the later one is a resubmit
                    out[i] = self._same(it, first.owner, first.manifest) or Conflict("metadata.name", "retry")
                    continue
                firsts[it.name] = it
                new.append((i, it))
            if new:
                rows = [
                    {
                        "name": it.name,
                        "queue": it.queue,
                        "priority_class": it.priority_class,
                        "owner": it.owner,
                        "manifest": it.manifest,
                        "phase": it.phase,
                        "placement": None,
                        "reason": "",
                        "submitted_at": now,
                        "admitted_at": None,
                        "finished_at": None,
                        "resource_version": 1,
                    }
                    for _, it in new
                ]
                seqs = (
                    conn.execute(sa.insert(wt).returning(wt.c.seq, sort_by_parameter_order=True), rows)
                    .scalars()
                    .all()
                )
                conn.execute(
                    sa.insert(ET),
                    [
                        {
                            "workload": it.name,
                            "type": "Normal",
                            "reason": "Submitted",
                            "message": f"queue {it.queue}",
                            "at": now,
                        }
                        for _, it in new
                    ],
                )
                count, head = int(anchor[0]), str(anchor[1])
                audit_rows = []
                for _, it in new:
                    entry = replace(it.audit, kind=it.audit.kind or "Workload", name=it.audit.name or it.name)
                    rec = auditlog.chain(entry, seq=count + 1, at=now, prev_hash=head)
                    count, head = rec.seq, rec.hash
                    audit_rows.append(
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
                conn.execute(sa.insert(AT), audit_rows)
                conn.execute(sa.update(ANCHOR).where(ANCHOR.c.id == 1).values(count=count, head_hash=head))
                for (i, it), seq in zip(new, seqs, strict=True):
                    out[i] = (
                        WorkloadRecord(
                            seq=seq,
                            name=it.name,
                            queue=it.queue,
                            priority_class=it.priority_class,
                            owner=it.owner,
                            manifest=it.manifest,
                            phase=it.phase,
                            placement=None,
                            reason="",
                            submitted_at=now,
                            admitted_at=None,
                            finished_at=None,
                            resource_version=1,
                        ),
                        True,
                    )
        # resubmits of a name created in this same batch resolve to the created record
        for i, it in enumerate(batch):
            r = out[i]
            if isinstance(r, Conflict) and r.problem == "retry":
                first_i = next(j for j, x in new if x.name == it.name)
                created = out[first_i]
                assert isinstance(created, tuple)
                out[i] = (created[0], False)
        return [r if r is not None else StoreError("submit", "not processed") for r in out]

    @staticmethod
    def _same(it: _Item, owner: str, manifest: Mapping[str, Any]) -> Conflict | None:
        if owner != it.owner:
            return Conflict(
                "metadata.name", f"workload {it.name!r} already exists (submitted by another owner)"
            )
        if _canonical(manifest) != _canonical(it.manifest):
            return Conflict("metadata.name", f"workload {it.name!r} already exists with a different manifest")
        return None


def utcnow() -> datetime:
    return datetime.now(UTC)
