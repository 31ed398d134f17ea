"""Plain immutable records returned by the store.

Why: callers never hold ORM instances (no lazy loads or detached-instance
surprises across threads/requests); the records are cheap to serialise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpupool.audit import AuditEntry

API_VERSION = "gpupool.io/v1alpha1"


@dataclass(frozen=True)
class ObjectRecord:
    """A stored ResourcePool, Queue, PriorityClass or Cluster."""

    kind: str
    name: str
    spec: Mapping[str, Any]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    resource_version: int
    created_at: datetime
    updated_at: datetime

    def to_manifest(self) -> dict[str, Any]:
        """Rebuild the Kubernetes-style manifest, with resourceVersion in metadata."""
        meta: dict[str, Any] = {"name": self.name, "resourceVersion": str(self.resource_version)}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        return {"apiVersion": API_VERSION, "kind": self.kind, "metadata": meta, "spec": dict(self.spec)}


@dataclass(frozen=True)
class WorkloadRecord:
    """A stored workload; ``seq`` orders arrivals (monotonic, never reused)."""

    seq: int
    name: str
    queue: str
    priority_class: str | None
    owner: str
    manifest: Mapping[str, Any]
    phase: str
    placement: Mapping[str, Any] | None
    reason: str
    submitted_at: datetime
    admitted_at: datetime | None
    finished_at: datetime | None
    resource_version: int


@dataclass(frozen=True)
class EventRecord:
    """One workload event."""

    id: int
    workload: str
    type: str
    reason: str
    message: str
    at: datetime


@dataclass(frozen=True)
class TokenRecord:
    """A token's metadata (never the token itself)."""

    id: int
    name: str
    role: str
    scope: str | None
    created_at: datetime
    revoked: bool
    revoked_at: datetime | None


@dataclass(frozen=True)
class IssuedToken:
    """A freshly created token: ``token`` is shown once and is not recoverable later."""

    record: TokenRecord
    token: str


@dataclass(frozen=True)
class ApprovalRecord:
    """An approval request and its decision."""

    id: int
    workload: str
    requested_by: str
    state: str
    approver: str | None
    reason: str
    requested_at: datetime
    decided_at: datetime | None
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class WorkloadSubmission:
    """One validated submission for :meth:`Store.submit_workloads`.

    Build it with :func:`gpupool.store.check_submission`, which validates the manifest and
    detaches it from the caller's objects, so a batch can be written without re-checking.
    """

    manifest: Mapping[str, Any]
    name: str
    queue: str
    priority_class: str | None
    owner: str
    phase: str
    audit: AuditEntry | None = None


class _Keep:
    """Sentinel type: leave the placement unchanged."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()


@dataclass(frozen=True)
class PhaseChange:
    """One workload phase change for :meth:`Store.apply_transitions`."""

    name: str
    phase: str
    reason: str = ""
    placement: Mapping[str, Any] | _Keep | None = KEEP
    expected_version: int | None = None
