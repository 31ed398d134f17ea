"""Onboarding a team (gpupool.manifests.templates): its queues and its tokens in one
transaction, recorded as one audit entry.

Why one transaction: a team half onboarded (queues without the tokens to use them, or tokens
scoped to a queue that failed) is a state nobody asked for and somebody must clean up by hand;
here any failure — a queue that exists, a token that cannot be issued, an OIDC group grant that
is refused — leaves nothing behind.

OIDC group grants (table ``oidc_group_grants``, migration ``0005``): the members of an identity
provider's group act as a role over the team's queue when they sign in with an ID token
(gpupool.oidc reads them beside its configured rules), so a team onboarded with groups needs no
token handed out at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.audit import AuditEntry
from gpupool.auth import Role
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database
from gpupool.store.errors import Conflict, ValidationFailed
from gpupool.store.objects import ObjectRepository
from gpupool.store.records import IssuedToken, ObjectRecord
from gpupool.store.revisions import RevisionRow
from gpupool.store.rows import token_record
from gpupool.store.schema import Base
from gpupool.store.tokens import add_token
from gpupool.store.validation import check_name, object_parts


class GroupGrantRow(Base):
    """Members of an OIDC ``group`` act as ``role`` over the queue subtree ``scope``."""

    __tablename__ = "oidc_group_grants"
    __table_args__ = (sa.UniqueConstraint("group_name", "role", "scope"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    group_name: Mapped[str] = mapped_column(sa.String(253))
    role: Mapped[str] = mapped_column(sa.String(32))
    scope: Mapped[str] = mapped_column(sa.String(253))
    team: Mapped[str] = mapped_column(sa.String(253))
    created_by: Mapped[str] = mapped_column(sa.String(253))
    created_at: Mapped[datetime]


class OnboardingRepository:
    """Create a team's configuration objects and tokens together."""

    def __init__(self, db: Database, audit: AuditLog, objects: ObjectRepository) -> None:
        self.db = db
        self.audit = audit
        #: the objects are created in onboarding's own transaction (``put_in``)
        self.objects = objects

    def onboard_team(
        self,
        objects: Sequence[Mapping[str, Any]],
        tokens: Sequence[tuple[str, str, str]],
        audit: AuditEntry,
        *,
        groups: Sequence[tuple[str, str, str]] = (),
        at: datetime | None = None,
    ) -> tuple[list[ObjectRecord], list[IssuedToken]]:
        """Create every object (Conflict if one exists), issue every token (name, role, scope)
        and record every OIDC group grant (group, role, scope), all or none; one audit record
        for the whole, naming what was created."""
        parts = [object_parts(m) for m in objects]
        now = self.db.now(at)
        try:
            with self.db.write() as s:
                recs = [self.objects.put_in(s, p, "create", None, None, now)[0] for p in parts]
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
                for g, r, scope in groups:
                    self._grant(s, g, r, scope, audit, now)
                s.flush()  # a grant that exists already fails here, inside the transaction
                detail = {
                    **dict(audit.detail),
                    "objects": [f"{r.kind}/{r.name}" for r in recs],
                    "tokens": [
                        {"name": t.record.name, "role": t.record.role, "id": t.record.id} for t in issued
                    ],
                }
                if groups:
                    detail["oidcGroups"] = [{"group": g, "role": r, "scope": sc} for g, r, sc in groups]
                entry = AuditEntry(audit.actor, audit.action, audit.kind, audit.name, detail)
                self.audit.append(s, entry, now, audit.kind, audit.name)
                return recs, issued
        except IntegrityError as exc:
            if "oidc_group_grants" in str(exc.orig):
                raise Conflict(
                    "oidcGroups", "an OIDC group already has this role over the team's queue"
                ) from exc
            raise Conflict("metadata.name", "an object of the team was created concurrently; retry") from exc

    @staticmethod
    def _grant(s: Any, group: str, role: str, scope: str, audit: AuditEntry, now: datetime) -> None:
        if not group.strip() or len(group) > 253:
            raise ValidationFailed("oidcGroups", f"a group name of 1 to 253 characters, got {group!r}")
        if role not in (Role.QUEUE_ADMIN.value, Role.MEMBER.value):
            raise ValidationFailed("oidcGroups.role", f"must be queue-admin or member, got {role!r}")
        check_name(scope, "oidcGroups.scope")
        team = audit.name or scope
        s.add(
            GroupGrantRow(
                group_name=group, role=role, scope=scope, team=team, created_by=audit.actor, created_at=now
            )
        )

    def oidc_group_grants(self) -> list[tuple[str, str, str]]:
        """Every recorded OIDC group grant (group, role, scope), oldest first."""
        q = sa.select(GroupGrantRow.group_name, GroupGrantRow.role, GroupGrantRow.scope)
        with self.db.read() as s:
            return [(g, r, sc) for g, r, sc in s.execute(q.order_by(GroupGrantRow.id))]

    @staticmethod
    def _issue(s: Any, name: str, role: str, scope: str, now: datetime) -> IssuedToken:
        if not name.strip():
            raise ValidationFailed("tokens.name", "required")
        if role not in (Role.QUEUE_ADMIN.value, Role.MEMBER.value):
            raise ValidationFailed("tokens.role", f"must be queue-admin or member, got {role!r}")
        check_name(scope, "tokens.scope")
        row, plaintext = add_token(s, name, role, scope, now)
        return IssuedToken(token_record(row), plaintext)
