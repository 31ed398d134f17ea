"""Onboarding a team (gpupool.manifests.templates): its queues and its tokens in one
transaction, recorded as one audit entry.

Why one transaction: a team half onboarded (queues without the tokens to use them, or tokens
scoped to a queue that failed) is a state nobody asked for and somebody must clean up by hand;
here any failure — a queue that exists, a token that cannot be issued — leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from gpupool.audit import AuditEntry
from gpupool.auth import Role, generate_token
from gpupool.store.errors import Conflict, ValidationFailed
from gpupool.store.objects import ObjectMethods
from gpupool.store.records import IssuedToken, ObjectRecord
from gpupool.store.revisions import RevisionRow
from gpupool.store.rows import token_record
from gpupool.store.schema import TokenRow
from gpupool.store.validation import check_name, object_parts


class OnboardMethods(ObjectMethods):
    """Create a team's configuration objects and tokens together."""

    def onboard_team(
        self,
        objects: Sequence[Mapping[str, Any]],
        tokens: Sequence[tuple[str, str, str]],
        audit: AuditEntry,
        *,
        at: datetime | None = None,
    ) -> tuple[list[ObjectRecord], list[IssuedToken]]:
        """Create every object (Conflict if one exists) and issue every token (name, role,
        scope), all or none; one audit record for the whole, naming what was created."""
        parts = [object_parts(m) for m in objects]
        now = self._now(at)
        try:
            with self._write() as s:
                recs = [self._put_in(s, p, "create", None, None, now)[0] for p in parts]
                # the revisions carry who onboarded and why, though no per-object record is written
                s.execute(
                    sa.update(RevisionRow)
                    .where(RevisionRow.at == now, RevisionRow.author == "")
                    .where(
                        sa.tuple_(RevisionRow.kind, RevisionRow.name).in_([(r.kind, r.name) for r in recs])
                    )
                    .values(author=audit.actor, reason=str(audit.detail.get("reason") or "onboarding"))
                )
                issued = [self._issue(s, n, r, scope, now) for n, r, scope in tokens]
                detail = {
                    **dict(audit.detail),
                    "objects": [f"{r.kind}/{r.name}" for r in recs],
                    "tokens": [
                        {"name": t.record.name, "role": t.record.role, "id": t.record.id} for t in issued
                    ],
                }
                entry = AuditEntry(audit.actor, audit.action, audit.kind, audit.name, detail)
                self._audit(s, entry, now, audit.kind, audit.name)
                return recs, issued
        except IntegrityError as exc:
            raise Conflict("metadata.name", "an object of the team was created concurrently; retry") from exc

    @staticmethod
    def _issue(s: Any, name: str, role: str, scope: str, now: datetime) -> IssuedToken:
        if not name.strip():
            raise ValidationFailed("tokens.name", "required")
        if role not in (Role.QUEUE_ADMIN.value, Role.MEMBER.value):
            raise ValidationFailed("tokens.role", f"must be queue-admin or member, got {role!r}")
        check_name(scope, "tokens.scope")
        plaintext, digest = generate_token()
        row = TokenRow(
            token_hash=digest,
            name=name,
            role=role,
            scope=scope,
            created_at=now,
            revoked=False,
            revoked_at=None,
        )
        s.add(row)
        s.flush()
        return IssuedToken(token_record(row), plaintext)
