"""The persistent store: the facade and composition root of the store's parts.

Why: the control plane needs durable, transactional state on SQLite (default, single node) and
PostgreSQL (HA). Each public method is one transaction; mutations that must be audited take an
``AuditEntry`` and write the hash-chained record in the same transaction, so state and audit
never diverge. Manifests are stored as JSON so this layer does not depend on the engine.

``Store`` holds its parts as fields, each passed what it needs (compose, don't mix in):

- ``db`` (``database.Database``): engine, read and write sessions, the fence, the clock;
- ``audit_log`` (``audit_log.AuditLog``): appends inside a caller's transaction, reading, verifying;
- one repository per aggregate, each given the ``Database`` and the ``AuditLog``: ``objects``
  (configuration objects), ``revisions`` (their history), ``onboarding`` (a team's objects,
  tokens and group grants in one transaction), ``submissions`` (workload submission and its
  group commit, ``pg_pipeline`` on PostgreSQL), ``workloads`` (reads, pending reasons, phases,
  events), ``tokens``, ``approvals``, ``incidents``, ``leases`` (the leader lease) and
  ``utilisation`` (hourly GPU rollups).

A write spanning aggregates is one transaction: its repository opens it and passes the open
session to the other's method (``onboarding`` -> ``objects.put_in``; deleting a queue ->
``tokens.revoke_scoped``), or ``Database.write(join=s)`` joins it. The methods below delegate,
one line each and grouped by repository, so callers keep ``store.get_object(...)``.

Shared pieces: ``validation`` (what is checked before a write), ``phases`` (the workload
lifecycle), ``rows`` (tables and row -> record).
"""

from __future__ import annotations

import copy
from typing import Self

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.store.approvals import ApprovalRepository
from gpupool.store.audit_log import AuditLog
from gpupool.store.database import (
    DEFAULT_URL,
    MIGRATIONS_DIR,
    SQLITE_BUSY_TIMEOUT_MS,
    Clock,
    Database,
    create_engine,
    run_migrations,
)
from gpupool.store.delegate import Via
from gpupool.store.incidents import IncidentRepository
from gpupool.store.leadership import LeaseRepository
from gpupool.store.objects import ObjectRepository
from gpupool.store.onboarding import OnboardingRepository
from gpupool.store.phases import ALLOWED_TRANSITIONS, EVENT_TYPES, TERMINAL_PHASES, WARNING_PHASES
from gpupool.store.revisions import RevisionRepository
from gpupool.store.submissions import SubmissionRepository
from gpupool.store.tokens import TokenRepository
from gpupool.store.turns import WriteTurn
from gpupool.store.utilisation import UtilisationRollups
from gpupool.store.validation import NAME_RE, OBJECT_KINDS, check_submission
from gpupool.store.workloads import WorkloadRepository

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


class Store:
    """Repository over the gpupool database. Thread-safe; one transaction per call."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self._compose(Database(engine, clock=clock))

    def _compose(self, db: Database) -> None:
        """Build every part over ``db`` (a fenced view recomposes over a fenced copy)."""
        self.db = db
        self.audit_log = audit = AuditLog(db)
        self.tokens = TokenRepository(db, audit)
        self.objects = ObjectRepository(db, audit, self.tokens)
        self.onboarding = OnboardingRepository(db, audit, self.objects)
        self.revisions = RevisionRepository(db, audit)
        self.submissions = SubmissionRepository(db, audit)
        self.workloads = WorkloadRepository(db, audit)
        self.approvals = ApprovalRepository(db, audit)
        self.incidents = IncidentRepository(db, audit)
        self.leases = LeaseRepository(db)
        #: the hourly GPU utilisation rollups (a repository of its own over this database)
        self.utilisation = UtilisationRollups(db)

    @classmethod
    def open(cls, url: str = DEFAULT_URL, *, clock: Clock | None = None, echo: bool = False) -> Self:
        """Connect and migrate to the latest schema (``alembic upgrade head``); no separate step."""
        engine = create_engine(url, echo)
        try:
            run_migrations(engine)
        except Exception:
            engine.dispose()
            raise
        return cls(engine, clock=clock)

    def close(self) -> None:
        """Release pooled connections (the lease keeper's too)."""
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fenced(self, epoch: int, *, idle_timeout_s: float = 4.0) -> Self:
        """A view of this store whose every write transaction first checks the lease's epoch.

        Why a view: the controller's decisions go through many methods; handing it a fenced
        view guards them all (NotLeader, nothing written, once the lease moved on) while the
        API's own writes keep the plain store. The view shares the engine: do not ``close`` it.
        ``idle_timeout_s``: PostgreSQL aborts a fenced transaction left idle that long.
        """
        view = copy.copy(self)
        view._compose(self.db.fenced(epoch, idle_timeout_s))
        return view

    @property
    def fence(self) -> int | None:
        """The fencing token this view checks (None for the plain store)."""
        return self.db.fence

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (shared by fenced views)."""
        return self.db.engine

    @property
    def clock(self) -> Clock:
        """The store's clock (tests set it to drive time)."""
        return self.db.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self.db.clock = clock

    @property
    def turn(self) -> WriteTurn:
        """The lease keeper's turn at the database between a bulk write's batches."""
        return self.db.turn

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.db.dialect

    def ping(self) -> None:
        """One round trip to the database; raises what the driver raises when it is unreachable
        (readiness reports the exception's type)."""
        with self.engine.connect() as c:
            c.execute(sa.text("SELECT 1"))

    # the leader lease (LeaseRepository)
    get_lease = Via("leases", LeaseRepository.get_lease)
    acquire_lease = Via("leases", LeaseRepository.acquire_lease)
    renew_lease = Via("leases", LeaseRepository.renew_lease)
    release_lease = Via("leases", LeaseRepository.release_lease)

    # configuration objects (ObjectRepository), their history and onboarding
    apply_object = Via("objects", ObjectRepository.apply_object)
    create_object = Via("objects", ObjectRepository.create_object)
    update_object = Via("objects", ObjectRepository.update_object)
    apply_objects = Via("objects", ObjectRepository.apply_objects)
    get_object = Via("objects", ObjectRepository.get_object)
    list_objects = Via("objects", ObjectRepository.list_objects)
    delete_object = Via("objects", ObjectRepository.delete_object)
    list_revisions = Via("revisions", RevisionRepository.list_revisions)
    kind_revisions = Via("revisions", RevisionRepository.kind_revisions)
    get_revision = Via("revisions", RevisionRepository.get_revision)
    onboard_team = Via("onboarding", OnboardingRepository.onboard_team)
    oidc_group_grants = Via("onboarding", OnboardingRepository.oidc_group_grants)

    # workloads: submission (SubmissionRepository), reads, phases and events (WorkloadRepository)
    submit_workload = Via("submissions", SubmissionRepository.submit_workload)
    submit_workloads = Via("submissions", SubmissionRepository.submit_workloads)
    pending_reasons = Via("workloads", WorkloadRepository.pending_reasons)
    set_pending_reasons = Via("workloads", WorkloadRepository.set_pending_reasons)
    get_workload = Via("workloads", WorkloadRepository.get_workload)
    list_workloads = Via("workloads", WorkloadRepository.list_workloads)
    page_workloads = Via("workloads", WorkloadRepository.page_workloads)
    phase_counts = Via("workloads", WorkloadRepository.phase_counts)
    transition_workload = Via("workloads", WorkloadRepository.transition_workload)
    apply_transitions = Via("workloads", WorkloadRepository.apply_transitions)
    add_event = Via("workloads", WorkloadRepository.add_event)
    list_events = Via("workloads", WorkloadRepository.list_events)

    # the audit chain (AuditLog)
    append_audit = Via("audit_log", AuditLog.append_audit)
    audit_records = Via("audit_log", AuditLog.audit_records)
    audit_head = Via("audit_log", AuditLog.audit_head)
    verify_audit = Via("audit_log", AuditLog.verify_audit)
    export_audit = Via("audit_log", AuditLog.export_audit)

    # API tokens (TokenRepository)
    create_token = Via("tokens", TokenRepository.create_token)
    authenticate = Via("tokens", TokenRepository.authenticate)
    revoke_token = Via("tokens", TokenRepository.revoke_token)
    list_tokens = Via("tokens", TokenRepository.list_tokens)
    ensure_bootstrap_admin = Via("tokens", TokenRepository.ensure_bootstrap_admin)

    # approvals (ApprovalRepository)
    request_approval = Via("approvals", ApprovalRepository.request_approval)
    decide_approval = Via("approvals", ApprovalRepository.decide_approval)
    expire_approvals = Via("approvals", ApprovalRepository.expire_approvals)
    get_approval = Via("approvals", ApprovalRepository.get_approval)
    list_approvals = Via("approvals", ApprovalRepository.list_approvals)

    # incidents and their deliveries (IncidentRepository)
    sync_incidents = Via("incidents", IncidentRepository.sync_incidents)
    ack_incident = Via("incidents", IncidentRepository.ack_incident)
    resolve_incident = Via("incidents", IncidentRepository.resolve_incident)
    list_incidents = Via("incidents", IncidentRepository.list_incidents)
    incidents_between = Via("incidents", IncidentRepository.incidents_between)
    get_incident = Via("incidents", IncidentRepository.get_incident)
    open_delivery = Via("incidents", IncidentRepository.open_delivery)
    update_delivery = Via("incidents", IncidentRepository.update_delivery)
