"""Typed store errors.

Why: the API layer maps these to HTTP statuses (404/409/422) without parsing
messages, and the field tells a client exactly which input was wrong.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class: every store error names the offending field and the problem."""

    status_code: int = 400

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(StoreError):
    """The named object does not exist (HTTP 404)."""

    status_code = 404

    def __init__(self, kind: str, name: str) -> None:
        super().__init__("metadata.name", f"{kind} {name!r} not found")
        self.kind = kind
        self.name = name


class Conflict(StoreError):
    """The request clashes with current state: duplicate, stale version, bad transition (HTTP 409)."""

    status_code = 409


class ValidationFailed(StoreError):
    """The input is malformed (HTTP 422)."""

    status_code = 422


class NotLeader(StoreError):
    """A fenced write found the leader lease held under another fencing token (HTTP 503).

    Why its own class: the controller steps down on it (it was deposed) instead of retrying,
    and the API answers 503 so the client retries at the current leader.
    """

    status_code = 503

    def __init__(self, problem: str, epoch: int | None = None) -> None:
        super().__init__("leader", problem)
        self.epoch = epoch
