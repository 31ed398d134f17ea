"""Roles, authorization decisions and API-token helpers.

Why: one pure ``authorize`` function is easy to test exhaustively (every role x
action) and gives the API a human-readable reason for each 403. The queue tree
lives elsewhere, so callers pass ``is_in_subtree(queue, root)``.

Roles:
  * ``platform-admin`` — everything.
  * ``queue-admin`` (scope = a queue) — manage queues *below* its scope root
    (not the root itself, so it cannot raise its own quota), and submit, read,
    cancel and approve workloads in the subtree.
  * ``member`` (scope = a queue) — submit to and read workloads in the subtree,
    cancel its own workloads there.
  * ``viewer`` (scope optional) — read-only; scoped viewers read workloads in the
    subtree only, unscoped viewers read all workloads.
Every role may read cluster configuration (pools, queues, priority classes,
cluster). Only platform-admin reads the audit log and manages tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

TOKEN_PREFIX = "gpt_"


class Role(StrEnum):
    PLATFORM_ADMIN = "platform-admin"
    QUEUE_ADMIN = "queue-admin"
    MEMBER = "member"
    VIEWER = "viewer"


class Action(StrEnum):
    READ = "read"
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    SUBMIT = "submit"
    CANCEL = "cancel"
    APPROVE = "approve"
    READ_AUDIT = "audit.read"
    MANAGE_TOKENS = "tokens.manage"


CONFIG_KINDS = frozenset({"ResourcePool", "Queue", "PriorityClass", "Cluster"})
SCOPED_ROLES = frozenset({Role.QUEUE_ADMIN, Role.MEMBER})


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. ``scope`` is the root queue of its subtree (None = cluster-wide)."""

    name: str
    role: Role
    scope: str | None = None
    token_id: int | None = None


@dataclass(frozen=True)
class Resource:
    """What is acted on.

    ``queue``: for a Workload, its queue; for a Queue, its *parent* (None for a
    top-level queue) — the queue whose admins govern it. ``owner``: a workload's
    submitter, used for "cancel own".
    """

    kind: str
    name: str = ""
    queue: str | None = None
    owner: str | None = None


@dataclass(frozen=True)
class Decision:
    """Result of :func:`authorize`; ``reason`` is suitable for a 403 body."""

    allowed: bool
    reason: str

    def __bool__(self) -> bool:
        return self.allowed


SubtreeFn = Callable[[str, str], bool]


def _allow(reason: str) -> Decision:
    return Decision(True, reason)


def _deny(reason: str) -> Decision:
    return Decision(False, reason)


def _in_scope(p: Principal, queue: str | None, is_in_subtree: SubtreeFn) -> bool:
    return p.scope is not None and queue is not None and is_in_subtree(queue, p.scope)


def authorize(
    principal: Principal, action: Action | str, resource: Resource, is_in_subtree: SubtreeFn
) -> Decision:
    """Decide whether ``principal`` may do ``action`` on ``resource``, with the reason why (not)."""
    try:
        act = Action(action)
    except ValueError:
        return _deny(f"unknown action {action!r}")
    try:
        role = Role(principal.role)
    except ValueError:
        return _deny(f"unknown role {principal.role!r}")
    who = f"{role.value} {principal.name!r}"
    if role in SCOPED_ROLES and not principal.scope:
        return _deny(f"{who} has no queue scope; scoped roles must name a queue")
    if role is Role.PLATFORM_ADMIN:
        return _allow(f"{who} may do anything")

    if act is Action.READ_AUDIT or act is Action.MANAGE_TOKENS:
        return _deny(f"{act.value} requires platform-admin; caller is {who}")

    kind = resource.kind
    where = f"queue {resource.queue!r}" if resource.queue else "no queue"
    scope_txt = f"subtree of {principal.scope!r}" if principal.scope else "cluster"

    if kind in CONFIG_KINDS:
        if act is Action.READ:
            return _allow(f"every role may read {kind}")
        if (
            role is Role.QUEUE_ADMIN
            and kind == "Queue"
            and act in (Action.CREATE, Action.UPDATE, Action.DELETE)
        ):
            if _in_scope(principal, resource.queue, is_in_subtree):
                return _allow(f"{who} manages queues below {principal.scope!r}")
            return _deny(
                f"{who} may only {act.value} queues whose parent is in the subtree of "
                f"{principal.scope!r}; queue {resource.name!r} has parent {resource.queue!r}"
            )
        return _deny(f"{act.value} on {kind} requires platform-admin; caller is {who}")

    if kind != "Workload":
        return _deny(f"{who} may not {act.value} {kind}")

    if act is Action.READ:
        if role is Role.VIEWER and principal.scope is None:
            return _allow(f"{who} is a cluster-wide viewer")
        if _in_scope(principal, resource.queue, is_in_subtree):
            return _allow(f"{who} may read workloads in the {scope_txt}")
        return _deny(f"{who} may only read workloads in the {scope_txt}; workload is in {where}")

    if role is Role.VIEWER:
        return _deny(f"{who} is read-only and may not {act.value} workloads")

    if act is Action.SUBMIT:
        if _in_scope(principal, resource.queue, is_in_subtree):
            return _allow(f"{who} may submit to the {scope_txt}")
        return _deny(f"{who} may only submit to queues in the {scope_txt}; requested {where}")

    if act is Action.CANCEL:
        if not _in_scope(principal, resource.queue, is_in_subtree):
            return _deny(f"{who} may only cancel workloads in the {scope_txt}; workload is in {where}")
        if role is Role.QUEUE_ADMIN:
            return _allow(f"{who} may cancel any workload in the {scope_txt}")
        if resource.owner == principal.name:
            return _allow(f"{who} may cancel its own workloads")
        return _deny(
            f"{who} may only cancel its own workloads; {resource.name!r} belongs to {resource.owner!r}"
        )

    if act is Action.APPROVE:
        if role is not Role.QUEUE_ADMIN:
            return _deny(f"approve requires queue-admin of the queue or platform-admin; caller is {who}")
        if _in_scope(principal, resource.queue, is_in_subtree):
            return _allow(f"{who} may approve workloads in the {scope_txt}")
        return _deny(f"{who} may only approve workloads in the {scope_txt}; workload is in {where}")

    return _deny(f"{who} may not {act.value} a Workload")


def generate_token() -> tuple[str, str]:
    """Return ``(plaintext, sha256_hex)``; only the hash is stored.

    256 bits of randomness make a plain (unsalted) sha256 safe and allow O(1)
    lookup by hash, the usual scheme for API tokens.
    """
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return plaintext, hash_token(plaintext)


def hash_token(plaintext: str) -> str:
    """sha256 hex of a token, used as its lookup key."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def token_matches(plaintext: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented token with a stored hash."""
    return hmac.compare_digest(hash_token(plaintext), stored_hash)


def parse_bearer(header: str | None) -> str | None:
    """Extract the token from an ``Authorization: Bearer <token>`` header value."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
