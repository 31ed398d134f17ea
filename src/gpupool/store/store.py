"""The persistent store: typed repository over SQLAlchemy, migrated on open.

Why: the control plane needs durable, transactional state on SQLite (default,
single node) and PostgreSQL (HA). Each public method is one transaction;
mutations that must be audited take an ``AuditEntry`` and write the
hash-chained record in the same transaction, so state and audit never diverge.
Manifests are stored as JSON so this layer does not depend on the engine.

``Store`` is composed of one mixin per kind of state, each in its own module:

- ``database``: the ``Database`` part (sessions, transactions, the clock, the fence);
- ``audit_log``: the ``AuditLog`` part (appends in a caller's transaction, reading, verifying);
- ``leadership``: the leader lease and fenced views;
- ``objects``: configuration objects (apply / create / update / delete);
- ``submissions``: workload submission and its group commit (``pg_pipeline`` on PostgreSQL);
- ``workloads``: workload reads, pending reasons, phase changes and events;
- ``tokens``: API tokens and principals;
- ``approvals``: approval requests and their decisions.

Shared pieces: ``database`` (engine and migrations), ``validation`` (what is checked before a
write), ``phases`` (the workload lifecycle), ``rows`` (tables and row -> record).
"""

from __future__ import annotations

from gpupool.store.approvals import ApprovalMethods
from gpupool.store.audit_log import AuditLog
from gpupool.store.base import Clock
from gpupool.store.database import (
    DEFAULT_URL,
    MIGRATIONS_DIR,
    SQLITE_BUSY_TIMEOUT_MS,
    create_engine,
    run_migrations,
)
from gpupool.store.delegate import Via
from gpupool.store.incidents import IncidentMethods
from gpupool.store.leadership import LeaseMethods
from gpupool.store.objects import ObjectMethods
from gpupool.store.onboarding import OnboardMethods
from gpupool.store.phases import ALLOWED_TRANSITIONS, EVENT_TYPES, TERMINAL_PHASES, WARNING_PHASES
from gpupool.store.revisions import RevisionMethods
from gpupool.store.submissions import SubmitMethods
from gpupool.store.tokens import TokenMethods
from gpupool.store.utilisation import UtilisationRollups
from gpupool.store.validation import NAME_RE, OBJECT_KINDS, check_submission
from gpupool.store.workloads import WorkloadMethods

#: the engine factory under its former name (tests open an engine without migrating)
_create_engine = create_engine

__all__ = [
    "ALLOWED_TRANSITIONS",
    "DEFAULT_URL",
    "EVENT_TYPES",
    "MIGRATIONS_DIR",
    "NAME_RE",
    "OBJECT_KINDS",
    "SQLITE_BUSY_TIMEOUT_MS",
    "TERMINAL_PHASES",
    "WARNING_PHASES",
    "Clock",
    "Store",
    "check_submission",
    "create_engine",
    "run_migrations",
]


class Store(
    OnboardMethods,  # before ObjectMethods, which it extends
    LeaseMethods,
    ObjectMethods,
    SubmitMethods,
    WorkloadMethods,
    TokenMethods,
    ApprovalMethods,
    RevisionMethods,
    IncidentMethods,
):
    """Repository over the gpupool database. Thread-safe; one transaction per call."""

    @property
    def utilisation(self) -> UtilisationRollups:
        """The hourly GPU utilisation rollups (a repository of its own over this store)."""
        return UtilisationRollups(self)

    # the audit chain (AuditLog)
    append_audit = Via("audit_log", AuditLog.append_audit)
    audit_records = Via("audit_log", AuditLog.audit_records)
    audit_head = Via("audit_log", AuditLog.audit_head)
    verify_audit = Via("audit_log", AuditLog.verify_audit)
    export_audit = Via("audit_log", AuditLog.export_audit)
