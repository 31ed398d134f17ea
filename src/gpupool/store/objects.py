"""Configuration objects (pools, queues, priority classes, clusters): kubectl-apply semantics.

Why versions and "unchanged": an apply of the same content writes and audits nothing, and an
``expected_version`` turns a lost update into a Conflict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.audit import AuditEntry
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database
from gpupool.store.errors import Conflict, NotFound, StoreError, ValidationFailed
from gpupool.store.object_batches import apply_batch
from gpupool.store.records import ObjectRecord
from gpupool.store.revisions import record_revision
from gpupool.store.rows import object_record
from gpupool.store.schema import ObjectRow
from gpupool.store.tokens import TokenRepository
from gpupool.store.validation import OBJECT_KINDS, canonical, check_version, object_parts

#: configuration objects written in one transaction by ``apply_objects``
OBJECT_BATCH = 1_000


def _after(exc: StoreError, applied: int) -> StoreError:
    """``exc`` saying how many objects of the set earlier batches applied (none: as it is)."""
    if not applied or type(exc) not in (Conflict, ValidationFailed):
        return exc
    return type(exc)(exc.field, f"{exc.problem} ({applied:,} objects of the set were applied before it)")


class ObjectRepository:
    """Create, update, apply, read and delete configuration objects.

    Given the token repository because deleting a queue revokes the tokens scoped to it, in
    the same transaction."""

    def __init__(self, db: Database, audit: AuditLog, tokens: TokenRepository) -> None:
        self.db = db
        self.audit = audit
        #: tokens scoped to a deleted queue are revoked in the same transaction
        self.tokens = tokens

    def apply_object(
        self,
        manifest: Mapping[str, Any],
        *,
        expected_version: int | None = None,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> tuple[ObjectRecord, Literal["created", "updated", "unchanged"]]:
        """Create or update (kubectl-apply semantics). Unchanged content bumps nothing and audits nothing."""
        return self._put_object(manifest, "apply", expected_version, audit, at)

    def create_object(
        self, manifest: Mapping[str, Any], *, audit: AuditEntry | None = None, at: datetime | None = None
    ) -> ObjectRecord:
        """Create; Conflict if kind+name exists."""
        return self._put_object(manifest, "create", None, audit, at)[0]

    def update_object(
        self,
        manifest: Mapping[str, Any],
        *,
        expected_version: int | None = None,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> ObjectRecord:
        """Update; NotFound if missing, Conflict if ``expected_version`` is stale."""
        return self._put_object(manifest, "update", expected_version, audit, at)[0]

    def _put_object(
        self,
        manifest: Mapping[str, Any],
        mode: Literal["apply", "create", "update"],
        expected_version: int | None,
        audit: AuditEntry | None,
        at: datetime | None,
    ) -> tuple[ObjectRecord, Literal["created", "updated", "unchanged"]]:
        parts = object_parts(manifest)
        now = self.db.now(at)
        try:
            with self.db.write() as s:
                return self.put_in(s, parts, mode, expected_version, audit, now)
        except IntegrityError as exc:  # concurrent create of the same kind+name
            raise Conflict("metadata.name", f"{parts[0]} {parts[1]!r} already exists") from exc

    def apply_objects(
        self,
        items: Sequence[tuple[Mapping[str, Any], AuditEntry | None, int | None]],
        *,
        at: datetime | None = None,
        batch_size: int | None = None,
    ) -> list[tuple[ObjectRecord, Literal["created", "updated", "unchanged"]]]:
        """kubectl-apply several objects: all of them, or (on any error) none, when they fit in
        one batch of ``batch_size`` (default ``OBJECT_BATCH``). Each item: manifest, audit entry, expected resourceVersion
        (None: unconditional); kind+name distinct.

        A larger set is written batch by batch, each batch its own transaction, and the
        lease keeper goes first between two (gpupool.store.turns): one long write held the
        database past the leader lease's expiry on SQLite. A batch that fails (a stale
        resourceVersion, a concurrent create) writes nothing of itself or of the batches
        after it, and its error says how many objects were applied before it."""
        parts = [(object_parts(m), a, v) for m, a, v in items]
        now = self.db.now(at)
        size = max(1, batch_size or OBJECT_BATCH)
        out: list[tuple[ObjectRecord, Literal["created", "updated", "unchanged"]]] = []
        for start in range(0, len(parts), size):
            if start:
                self.db.turn.step_aside()
            try:
                with self.db.write() as s:
                    done, audits = apply_batch(s.connection(), parts[start : start + size], now)
                    self.audit.append_many(s, audits, now)
            except StoreError as exc:
                raise _after(exc, start) from exc
            except IntegrityError as exc:
                problem = "an object of the set was created concurrently; retry"
                raise _after(Conflict("metadata.name", problem), start) from exc
            out.extend(done)
            self.db.turn.batches += 1
        return out

    def put_in(
        self,
        s: Session,
        parts: tuple[str, str, dict[str, Any], dict[str, str], dict[str, str]],
        mode: Literal["apply", "create", "update"],
        expected_version: int | None,
        audit: AuditEntry | None,
        now: datetime,
    ) -> tuple[ObjectRecord, Literal["created", "updated", "unchanged"]]:
        """Write one object, its revision and its audit record in the open transaction ``s``:
        this repository's own, or one another opened (onboarding creates a team's objects in
        its transaction)."""
        kind, name, spec, labels, annotations = parts
        row = s.execute(
            sa.select(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.name == name).with_for_update()
        ).scalar_one_or_none()
        if row is None:
            if mode == "update":
                raise NotFound(kind, name)
            if expected_version not in (None, 0):
                raise Conflict("metadata.resourceVersion", f"{kind} {name!r} does not exist")
            row = ObjectRow(
                kind=kind,
                name=name,
                spec=spec,
                labels=labels,
                annotations=annotations,
                resource_version=1,
                created_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            record_revision(s, row, audit, now)  # history in the same transaction as the change
            self.audit.append(s, audit, now, kind, name)
            return object_record(row), "created"
        if mode == "create":
            raise Conflict("metadata.name", f"{kind} {name!r} already exists")
        check_version(f"{kind} {name!r}", row.resource_version, expected_version)
        same = (canonical(row.spec), canonical(row.labels), canonical(row.annotations)) == (
            canonical(spec),
            canonical(labels),
            canonical(annotations),
        )
        if same:
            return object_record(row), "unchanged"
        row.spec, row.labels, row.annotations = spec, labels, annotations
        row.resource_version += 1
        row.updated_at = now
        s.flush()
        record_revision(s, row, audit, now)
        self.audit.append(s, audit, now, kind, name)
        return object_record(row), "updated"

    def get_object(self, kind: str, name: str) -> ObjectRecord:
        """One object; NotFound if missing."""
        with self.db.read() as s:
            row = s.execute(
                sa.select(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.name == name)
            ).scalar_one_or_none()
            if row is None:
                raise NotFound(kind, name)
            return object_record(row)

    def list_objects(self, kind: str | None = None) -> list[ObjectRecord]:
        """All objects (of one kind), ordered by kind then name."""
        if kind is not None and kind not in OBJECT_KINDS:
            raise ValidationFailed("kind", f"must be one of {list(OBJECT_KINDS)}, got {kind!r}")
        q = sa.select(ObjectRow).order_by(ObjectRow.kind, ObjectRow.name)
        if kind is not None:
            q = q.where(ObjectRow.kind == kind)
        with self.db.read() as s:
            return [object_record(r) for r in s.execute(q).scalars()]

    def delete_object(
        self,
        kind: str,
        name: str,
        *,
        expected_version: int | None = None,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> ObjectRecord:
        """Delete and return the last state; NotFound if missing."""
        now = self.db.now(at)
        with self.db.write() as s:
            row = s.execute(
                sa.select(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.name == name).with_for_update()
            ).scalar_one_or_none()
            if row is None:
                raise NotFound(kind, name)
            check_version(f"{kind} {name!r}", row.resource_version, expected_version)
            rec = object_record(row)
            record_revision(s, row, audit, now, "delete")  # the state it was deleted in
            s.delete(row)
            s.flush()
            self.audit.append(s, audit, now, kind, name)
            if kind == "Queue":
                self.tokens.revoke_scoped(s, name, now)
            return rec
