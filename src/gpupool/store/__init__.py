"""Persistent state for the gpupool control plane (SQLite or PostgreSQL).

Why a separate layer: the scheduling engine stays pure; this package stores
manifests as JSON, keeps workload lifecycle, events, tokens, approvals and the
hash-chained audit log, and migrates itself on open.
"""

from gpupool.store.errors import Conflict, NotFound, NotLeader, StoreError, ValidationFailed
from gpupool.store.lease import Lease
from gpupool.store.records import (
    KEEP,
    ApprovalRecord,
    EventRecord,
    IssuedToken,
    ObjectRecord,
    PhaseChange,
    TokenRecord,
    WorkloadRecord,
    WorkloadSubmission,
)
from gpupool.store.store import (
    ALLOWED_TRANSITIONS,
    DEFAULT_URL,
    OBJECT_KINDS,
    TERMINAL_PHASES,
    Store,
    check_submission,
    run_migrations,
)

__all__ = [
    "ALLOWED_TRANSITIONS",
    "DEFAULT_URL",
    "KEEP",
    "OBJECT_KINDS",
    "TERMINAL_PHASES",
    "ApprovalRecord",
    "Conflict",
    "EventRecord",
    "IssuedToken",
    "Lease",
    "NotFound",
    "NotLeader",
    "ObjectRecord",
    "PhaseChange",
    "Store",
    "StoreError",
    "TokenRecord",
    "ValidationFailed",
    "WorkloadRecord",
    "WorkloadSubmission",
    "check_submission",
    "run_migrations",
]
