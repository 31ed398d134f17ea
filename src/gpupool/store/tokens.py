"""API tokens and principals: issued once in plaintext, kept as a hash, revoked for good.

Why the last admin is kept: with no live platform-admin token nobody could issue tokens again.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpupool.audit import AuditEntry
from gpupool.auth import Principal, Role, generate_token, hash_token, token_matches
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import Database
from gpupool.store.errors import Conflict, NotFound, ValidationFailed
from gpupool.store.records import IssuedToken, TokenRecord
from gpupool.store.rows import beyond_ids, token_record
from gpupool.store.schema import AuditAnchorRow, TokenRow
from gpupool.store.validation import check_name


def add_token(s: Session, name: str, role: str, scope: str | None, now: datetime) -> tuple[TokenRow, str]:
    """A new token's row in the open transaction ``s`` (flushed, so it has its id) and its
    plaintext, shown once: only the sha256 is stored. Shared by ``issue_token`` and onboarding,
    which issues a team's tokens in the same transaction as its queues."""
    plaintext, digest = generate_token()
    row = TokenRow(
        token_hash=digest, name=name, role=role, scope=scope, created_at=now, revoked=False, revoked_at=None
    )
    s.add(row)
    s.flush()
    return row, plaintext


class TokenRepository:
    """Issuing, authenticating, revoking and listing tokens, and the first start's admin token."""

    def __init__(self, db: Database, audit: AuditLog) -> None:
        self.db = db
        self.audit = audit

    def create_token(
        self,
        name: str,
        role: Role | str,
        scope: str | None = None,
        *,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> IssuedToken:
        """Issue a token; the plaintext is returned once and only its sha256 is stored."""
        if not isinstance(name, str) or not name.strip():
            raise ValidationFailed("name", "required")
        try:
            r = Role(role)
        except ValueError as exc:
            raise ValidationFailed("role", f"must be one of {[x.value for x in Role]}") from exc
        if r in (Role.QUEUE_ADMIN, Role.MEMBER) and not scope:
            raise ValidationFailed("scope", f"{r.value} tokens need a queue scope")
        if r is Role.PLATFORM_ADMIN and scope:
            raise ValidationFailed("scope", "platform-admin tokens are cluster-wide; omit scope")
        if scope is not None:
            check_name(scope, "scope")
        now = self.db.now(at)
        with self.db.write() as s:
            row, plaintext = add_token(s, name, r.value, scope, now)
            detail_entry = None
            if audit is not None:
                detail = {"role": r.value, "scope": scope, "id": row.id, **dict(audit.detail)}
                detail_entry = replace(audit, detail=detail)
            self.audit.append(s, detail_entry, now, "Token", name)
            return IssuedToken(token_record(row), plaintext)

    def authenticate(self, token: str) -> Principal | None:
        """The principal for a presented token, or None if unknown or revoked (O(1) by hash)."""
        if not token:
            return None
        digest = hash_token(token)
        with self.db.read() as s:
            row = s.execute(sa.select(TokenRow).where(TokenRow.token_hash == digest)).scalar_one_or_none()
            if row is None or row.revoked or not token_matches(token, row.token_hash):
                return None
            return Principal(name=row.name, role=Role(row.role), scope=row.scope, token_id=row.id)

    def revoke_token(
        self, token_id: int, *, audit: AuditEntry | None = None, at: datetime | None = None
    ) -> TokenRecord:
        """Revoke (idempotent); NotFound for an unknown id."""
        now = self.db.now(at)
        if beyond_ids(token_id):  # no id is that large (PostgreSQL could not even compare it)
            raise NotFound("Token", str(token_id))
        with self.db.write() as s:
            row = s.get(TokenRow, token_id, with_for_update=True)
            if row is None:
                raise NotFound("Token", str(token_id))
            if not row.revoked and row.role == "platform-admin":
                self._keep_one_admin(s, row.id)
            if not row.revoked:
                row.revoked = True
                row.revoked_at = now
                s.flush()
                self.audit.append(s, audit, now, "Token", row.name)
            return token_record(row)

    @staticmethod
    def _keep_one_admin(s: Session, token_id: int) -> None:
        """Refuse to revoke the last live platform-admin token: nobody could manage tokens again."""
        others = s.execute(
            sa.select(sa.func.count())
            .select_from(TokenRow)
            .where(TokenRow.role == "platform-admin", TokenRow.revoked.is_(False), TokenRow.id != token_id)
        ).scalar_one()
        if not others:
            raise Conflict(
                "id", "this is the last platform-admin token; create another platform-admin token first"
            )

    def revoke_scoped(self, s: Session, queue: str, now: datetime) -> None:
        """Tokens scoped to a deleted queue die with it: a queue created later under the same
        name (perhaps by another team) must not inherit them."""
        rows = s.execute(
            sa.select(TokenRow).where(TokenRow.scope == queue, TokenRow.revoked.is_(False)).with_for_update()
        ).scalars()
        for row in rows:
            row.revoked, row.revoked_at = True, now
            s.flush()
            self.audit.append(
                s,
                AuditEntry(
                    "system",
                    "token.revoke",
                    "Token",
                    row.name,
                    {"id": row.id, "reason": f"queue {queue!r} deleted"},
                ),
                now,
                "Token",
                row.name,
            )

    def list_tokens(self, *, include_revoked: bool = True) -> list[TokenRecord]:
        """Token metadata, oldest first."""
        q = sa.select(TokenRow).order_by(TokenRow.id)
        if not include_revoked:
            q = q.where(TokenRow.revoked.is_(False))
        with self.db.read() as s:
            return [token_record(r) for r in s.execute(q).scalars()]

    def ensure_bootstrap_admin(
        self, *, name: str = "bootstrap-admin", at: datetime | None = None
    ) -> str | None:
        """On first start (no tokens at all) create a platform-admin token and return it; else None.

        Safe against concurrent first starts: the audit anchor is locked before checking.
        """
        now = self.db.now(at)
        with self.db.write() as s:
            s.execute(sa.select(AuditAnchorRow).where(AuditAnchorRow.id == 1).with_for_update()).scalar_one()
            if s.execute(sa.select(TokenRow.id).limit(1)).first() is not None:
                return None
            plaintext, digest = generate_token()
            row = TokenRow(
                token_hash=digest,
                name=name,
                role=Role.PLATFORM_ADMIN.value,
                scope=None,
                created_at=now,
                revoked=False,
                revoked_at=None,
            )
            s.add(row)
            s.flush()
            entry = AuditEntry(
                actor="system", action="token.bootstrap", detail={"role": Role.PLATFORM_ADMIN.value}
            )
            self.audit.append(s, entry, now, "Token", name)
            return plaintext
