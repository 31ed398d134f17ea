"""The persistent store: typed repository over SQLAlchemy, migrated on open.

Why: the control plane needs durable, transactional state on SQLite (default,
single node) and PostgreSQL (HA). Each public method is one transaction;
mutations that must be audited take an ``AuditEntry`` and write the
hash-chained record in the same transaction, so state and audit never diverge.
Manifests are stored as JSON so this layer does not depend on the engine.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from gpupool import audit as auditlog
from gpupool.audit import AuditEntry, AuditRecord, VerifyResult
from gpupool.auth import Principal, Role, generate_token, hash_token, token_matches
from gpupool.store import lease as leaselib
from gpupool.store.errors import Conflict, NotFound, NotLeader, StoreError, ValidationFailed
from gpupool.store.lease import Lease
from gpupool.store.records import (
    API_VERSION,
    KEEP,
    ApprovalRecord,
    EventRecord,
    IssuedToken,
    ObjectRecord,
    PhaseChange,
    TokenRecord,
    WorkloadRecord,
    WorkloadSubmission,
    _Keep,
)
from gpupool.store.schema import (
    PHASES,
    ApprovalRow,
    AuditAnchorRow,
    AuditRow,
    EventRow,
    ObjectRow,
    TokenRow,
    WorkloadRow,
)

DEFAULT_URL = "sqlite:///./.gpupool/gpupool.db"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
OBJECT_KINDS = ("ResourcePool", "Queue", "PriorityClass", "Cluster")
TERMINAL_PHASES = frozenset({"Succeeded", "Failed", "Cancelled", "Rejected"})
ALLOWED_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "Pending": frozenset({"AwaitingApproval", "Admitted", "Rejected", "Cancelled", "Failed"}),
    "AwaitingApproval": frozenset({"Pending", "Admitted", "Rejected", "Cancelled"}),
    "Admitted": frozenset({"Running", "Pending", "Preempted", "Cancelled", "Failed", "Succeeded"}),
    # Running -> Pending: a failed run requeued by its retry policy (the backend already stopped it)
    "Running": frozenset({"Succeeded", "Failed", "Cancelled", "Preempted", "Pending"}),
    "Preempted": frozenset({"Pending", "Cancelled", "Failed"}),
    **{p: frozenset() for p in TERMINAL_PHASES},
}
WARNING_PHASES = frozenset({"Failed", "Rejected", "Preempted"})
EVENT_TYPES = ("Normal", "Warning")
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SQLITE_BUSY_TIMEOUT_MS = 30_000

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _json_copy(value: Any, field: str) -> Any:
    """Normalise through JSON: rejects non-JSON values early and detaches from caller's objects."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(field, f"not JSON-serialisable: {exc}") from exc


def _canonical(value: Any) -> str:
    return auditlog.canonical_json(value)


def _check_name(name: Any, field: str = "metadata.name") -> str:
    if not isinstance(name, str) or not name:
        raise ValidationFailed(field, "required, must be a non-empty string")
    if not NAME_RE.match(name):
        raise ValidationFailed(
            field, f"{name!r} is not a valid name (lowercase letters, digits, '-', '.'; at most 253 chars)"
        )
    return name


def _check_str_map(value: Any, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValidationFailed(field, "must be a mapping of strings to strings")
    return dict(value)


def _object_parts(manifest: Any) -> tuple[str, str, dict[str, Any], dict[str, str], dict[str, str]]:
    """A configuration object's kind, name, spec, labels and annotations, validated."""
    kind, name, meta, spec = _check_manifest(manifest, OBJECT_KINDS)
    labels = _check_str_map(meta.get("labels"), "metadata.labels")
    annotations = _check_str_map(meta.get("annotations"), "metadata.annotations")
    return kind, name, spec, labels, annotations


def _check_manifest(
    manifest: Any, kinds: Collection[str], *, copy: bool = True
) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """Validate the envelope; returns (kind, name, metadata, spec); ``copy=False`` when already detached."""
    if not isinstance(manifest, Mapping):
        raise ValidationFailed("manifest", "must be a mapping")
    if manifest.get("apiVersion") != API_VERSION:
        raise ValidationFailed("apiVersion", f"must be {API_VERSION!r}, got {manifest.get('apiVersion')!r}")
    kind = manifest.get("kind")
    if kind not in kinds:
        raise ValidationFailed("kind", f"must be one of {sorted(kinds)}, got {kind!r}")
    meta = manifest.get("metadata")
    if not isinstance(meta, Mapping):
        raise ValidationFailed("metadata", "required, must be a mapping")
    name = _check_name(meta.get("name"))
    spec = manifest.get("spec", {})
    if not isinstance(spec, Mapping):
        raise ValidationFailed("spec", "must be a mapping")
    return str(kind), name, dict(meta), _json_copy(dict(spec), "spec") if copy else dict(spec)


def _create_engine(url: str, echo: bool) -> Engine:
    """SQLite: WAL, foreign keys, busy timeout, explicit BEGIN (IMMEDIATE for writers). PG: pre-ping."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return sa.create_engine(u, echo=echo, pool_pre_ping=True)
    db = u.database or ""
    memory = db in ("", ":memory:") or "mode=memory" in db or u.query.get("mode") == "memory"
    kwargs: dict[str, Any] = {
        "connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
    }
    if memory:
        kwargs["poolclass"] = StaticPool
    else:
        Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(u, echo=echo, **kwargs)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see _on_begin)
        cur = dbapi_conn.cursor()
        if not memory:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Writers take the write lock up front: no lock-upgrade deadlocks, appends serialize.
        mode = conn.get_execution_options().get("gpupool_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def run_migrations(engine: Engine) -> None:
    """Upgrade the database to head, serialized against other processes doing the same."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    locked = engine.execution_options(gpupool_begin="IMMEDIATE")
    with locked.connect() as conn, conn.begin():
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(7461931)"))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def _obj(row: ObjectRow) -> ObjectRecord:
    return ObjectRecord(
        row.kind,
        row.name,
        row.spec,
        row.labels,
        row.annotations,
        row.resource_version,
        row.created_at,
        row.updated_at,
    )


def _wl(row: WorkloadRow) -> WorkloadRecord:
    return _row_record(row)


def _ev(row: EventRow) -> EventRecord:
    return EventRecord(row.id, row.workload, row.type, row.reason, row.message, row.at)


def _tok(row: TokenRow) -> TokenRecord:
    return TokenRecord(row.id, row.name, row.role, row.scope, row.created_at, row.revoked, row.revoked_at)


def _appr(row: ApprovalRow) -> ApprovalRecord:
    return ApprovalRecord(
        row.id,
        row.workload,
        row.requested_by,
        row.state,
        row.approver,
        row.reason,
        row.requested_at,
        row.decided_at,
        row.expires_at,
    )


def _aud(row: AuditRow) -> AuditRecord:
    return AuditRecord(
        row.seq, row.at, row.actor, row.action, row.kind, row.name, row.detail, row.prev_hash, row.hash
    )


def _check_version(field_owner: str, current: int, expected: int | None) -> None:
    if expected is not None and current != expected:
        raise Conflict(
            "metadata.resourceVersion",
            f"{field_owner} was modified: expected version {expected}, current is {current}",
        )


def _table(cls: Any) -> sa.Table:
    t: sa.Table = cls.__table__
    return t


_WT, _ET, _AT, _ANCHOR = _table(WorkloadRow), _table(EventRow), _table(AuditRow), _table(AuditAnchorRow)


def _insert_ignore(dialect: str, table: sa.Table) -> Any:
    """``INSERT .. ON CONFLICT DO NOTHING`` for the dialect (both support it with RETURNING)."""
    if dialect == "postgresql":
        return pg_insert(table).on_conflict_do_nothing(index_elements=["name"])
    return sqlite_insert(table).on_conflict_do_nothing(index_elements=["name"])


def check_submission(
    manifest: Any, *, owner: str, phase: str = "Pending", audit: AuditEntry | None = None
) -> WorkloadSubmission:
    """Validate a Workload submission and detach it (one JSON round trip); raises ValidationFailed.

    Why separate from writing: the API validates on the request path and hands the result to
    the group-commit writer, which then needs no check of its own.
    """
    if not isinstance(manifest, Mapping):
        raise ValidationFailed("manifest", "must be a mapping")
    stored = _json_copy({k: v for k, v in manifest.items() if k != "status"}, "manifest")
    _kind, name, _meta, spec = _check_manifest(stored, ("Workload",), copy=False)
    queue = spec.get("queue")
    if not isinstance(queue, str) or not queue:
        raise ValidationFailed("spec.queue", "required, must be a non-empty string")
    _check_name(queue, "spec.queue")
    pc = spec.get("priorityClass")
    if pc is not None and (not isinstance(pc, str) or not pc or len(pc) > 253):
        raise ValidationFailed(
            "spec.priorityClass", "must be a non-empty string (at most 253 chars) when given"
        )
    if not isinstance(owner, str) or not owner or len(owner) > 253:
        raise ValidationFailed("owner", "required, must be a non-empty string (at most 253 chars)")
    if phase not in ("Pending", "AwaitingApproval"):
        raise ValidationFailed("phase", "initial phase must be Pending or AwaitingApproval")
    return WorkloadSubmission(stored, name, queue, pc, owner, phase, audit)


def _same(sub: WorkloadSubmission, owner: str, manifest: Mapping[str, Any]) -> Conflict | None:
    """None when ``sub`` resubmits what is stored, else the Conflict.

    One message whether the owner or the manifest differs: telling them apart would tell a
    member that another team uses the name."""
    if owner != sub.owner or (
        manifest is not sub.manifest and _canonical(manifest) != _canonical(sub.manifest)
    ):
        return Conflict(
            "metadata.name",
            f"workload {sub.name!r} already exists with a different manifest or owner; "
            "a resubmission must repeat the original exactly, otherwise choose another name",
        )
    return None


def _new_record(sub: WorkloadSubmission, seq: int, now: datetime) -> WorkloadRecord:
    return WorkloadRecord(
        seq=seq,
        name=sub.name,
        queue=sub.queue,
        priority_class=sub.priority_class,
        owner=sub.owner,
        manifest=sub.manifest,
        phase=sub.phase,
        placement=None,
        reason="",
        submitted_at=now,
        admitted_at=None,
        finished_at=None,
        resource_version=1,
    )


def _row_record(row: Any) -> WorkloadRecord:
    """A Core result row of the workloads table as a record."""
    return WorkloadRecord(
        seq=row.seq,
        name=row.name,
        queue=row.queue,
        priority_class=row.priority_class,
        owner=row.owner,
        manifest=row.manifest,
        phase=row.phase,
        placement=row.placement,
        reason=row.reason,
        submitted_at=row.submitted_at,
        admitted_at=row.admitted_at,
        finished_at=row.finished_at,
        resource_version=row.resource_version,
    )


def _chain_rows(
    entries: Sequence[AuditEntry], now: datetime, count: int, head: str
) -> tuple[list[dict[str, Any]], int, str]:
    """Audit rows chained after (count, head) from the locked anchor; returns (rows, count, head)."""
    rows = []
    for entry in entries:
        try:
            rec = auditlog.chain(entry, seq=count + 1, at=now, prev_hash=head)
        except ValueError as exc:
            raise ValidationFailed("audit", str(exc)) from exc
        count, head = rec.seq, rec.hash
        rows.append(
            {
                "seq": rec.seq,
                "at": rec.at,
                "actor": rec.actor,
                "action": rec.action,
                "kind": rec.kind,
                "name": rec.name,
                "detail": dict(rec.detail),
                "prev_hash": rec.prev_hash,
                "hash": rec.hash,
            }
        )
    return rows, count, head


# ---- PostgreSQL group commit in three round trips (psycopg pipeline mode)
#
# Why: on PostgreSQL each statement is a round trip to another process; on a busy machine
# every one of them waits to be scheduled, and the batch (anchor lock, insert, events, audit,
# anchor update, commit) took seven. Pipelined, it takes three: [lock anchor + insert],
# [events + audit + anchor update], [commit], with the same statements and the same
# transaction. Durability is unchanged (the commit is a normal synchronous commit).

_PG_WL_COLS = (
    "name, queue, priority_class, owner, manifest, phase, placement, reason, "
    "submitted_at, admitted_at, finished_at, resource_version"
)


@functools.cache
def _pg_pipeline_ok() -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return False
    return bool(psycopg.Pipeline.is_supported())


def _pg_raw(conn: sa.Connection) -> Any:
    return conn.connection.dbapi_connection


def _pg_lock_and_insert(
    conn: sa.Connection, subs: Sequence[WorkloadSubmission], now: datetime
) -> tuple[tuple[int, str], dict[str, int]]:
    """``Store._lock_and_insert`` in one round trip (errors surface as SQLAlchemy DBAPIError)."""
    from psycopg.types.json import Json

    raw = _pg_raw(conn)
    try:
        with raw.pipeline(), raw.cursor() as c1:
            c1.execute("SELECT count, head_hash FROM audit_anchor WHERE id = 1 FOR UPDATE")
            curs = []
            for part in _chunks(subs):
                cur = raw.cursor()
                curs.append(cur)
                cur.execute(
                    f"INSERT INTO workloads ({_PG_WL_COLS}) VALUES "
                    + ",".join(["(%s,%s,%s,%s,%s,%s,NULL,'',%s,NULL,NULL,1)"] * len(part))
                    + " ON CONFLICT (name) DO NOTHING RETURNING seq, name",
                    [
                        v
                        for sub in part
                        for v in (
                            sub.name,
                            sub.queue,
                            sub.priority_class,
                            sub.owner,
                            Json(sub.manifest),
                            sub.phase,
                            now,
                        )
                    ],
                )
            row = c1.fetchone()
            seqs: dict[str, int] = {}
            for cur in curs:
                seqs.update((name, seq) for seq, name in cur.fetchall())
                cur.close()
    except Exception as exc:
        raise _wrap_pg(exc) from exc
    assert row is not None
    return (int(row[0]), str(row[1])), seqs


def _pg_append(
    conn: sa.Connection,
    events: Sequence[Mapping[str, Any]],
    audit_rows: Sequence[Mapping[str, Any]],
    count: int,
    head: str,
) -> None:
    """Events, audit records and the anchor update in one round trip."""
    from psycopg.types.json import Json

    raw = _pg_raw(conn)
    try:
        with raw.pipeline(), raw.cursor() as cur:
            for part in _chunks(events):
                cur.execute(
                    "INSERT INTO events (workload, type, reason, message, at) VALUES "
                    + ",".join(["(%s,%s,%s,%s,%s)"] * len(part)),
                    [v for e in part for v in (e["workload"], e["type"], e["reason"], e["message"], e["at"])],
                )
            for part in _chunks(audit_rows):
                cur.execute(
                    "INSERT INTO audit (seq, at, actor, action, kind, name, detail, prev_hash, hash) VALUES "
                    + ",".join(["(%s,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(part)),
                    [
                        v
                        for a in part
                        for v in (
                            a["seq"],
                            a["at"],
                            a["actor"],
                            a["action"],
                            a["kind"],
                            a["name"],
                            Json(a["detail"]),
                            a["prev_hash"],
                            a["hash"],
                        )
                    ],
                )
            if audit_rows:
                cur.execute("UPDATE audit_anchor SET count = %s, head_hash = %s WHERE id = 1", (count, head))
    except Exception as exc:
        raise _wrap_pg(exc) from exc


def _chunks(items: Sequence[Any], size: int = 1000) -> Iterator[Sequence[Any]]:
    """Slices small enough for PostgreSQL's 65,535 bind parameters per statement."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _wrap_pg(exc: Exception) -> Exception:
    """psycopg errors from the raw connection as SQLAlchemy's, as every other store call raises."""
    import psycopg

    if isinstance(exc, psycopg.Error):
        return DBAPIError(None, None, exc)
    return exc


class Store:
    """Repository over the gpupool database. Thread-safe; one transaction per call."""

    def __init__(self, engine: Engine, *, clock: Clock | None = None) -> None:
        self.engine = engine
        self.clock: Clock = clock or _utcnow
        sqlite = engine.dialect.name == "sqlite"
        writer = engine.execution_options(gpupool_begin="IMMEDIATE") if sqlite else engine
        snapshot = engine if sqlite else engine.execution_options(isolation_level="REPEATABLE READ")
        self._core_writer = writer
        self._reader = sessionmaker(engine, expire_on_commit=False)
        self._writer = sessionmaker(writer, expire_on_commit=False)
        self._snapshot = sessionmaker(snapshot, expire_on_commit=False)
        #: fencing token every write of this view checks (None: unfenced; see ``fenced``)
        self._fence: int | None = None
        self._fence_idle_ms = 0

    @classmethod
    def open(cls, url: str = DEFAULT_URL, *, clock: Clock | None = None, echo: bool = False) -> Store:
        """Connect and migrate to the latest schema (``alembic upgrade head``); no separate step."""
        engine = _create_engine(url, echo)
        try:
            run_migrations(engine)
        except Exception:
            engine.dispose()
            raise
        return cls(engine, clock=clock)

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return str(self.engine.dialect.name)

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One write transaction. On PostgreSQL it takes the audit anchor's row lock first:
        every writer then locks in the same order (anchor, then rows), so a scheduling cycle, a
        batch of submits and an approval can never deadlock each other. (SQLite's writer is
        already exclusive.)"""
        with self._writer.begin() as s:
            if self.dialect == "postgresql":
                s.execute(sa.select(_ANCHOR.c.id).where(_ANCHOR.c.id == 1).with_for_update())
            self._check_fence(s.connection())
            yield s

    def _check_fence(self, conn: sa.Connection) -> None:
        """In a fenced view, fail the transaction (NotLeader) unless we still hold the lease."""
        if self._fence is not None:
            leaselib.check_fence(conn, self._fence, self._fence_idle_ms)

    @contextmanager
    def _read(self, snapshot: bool = False) -> Iterator[Session]:
        with (self._snapshot if snapshot else self._reader).begin() as s:
            yield s

    def _now(self, at: datetime | None) -> datetime:
        now = at if at is not None else self.clock()
        if now.tzinfo is None:
            raise ValidationFailed("at", "times must be timezone-aware")
        return now.astimezone(UTC)

    def _audit(
        self, s: Session, entry: AuditEntry | None, at: datetime, kind: str = "", name: str = ""
    ) -> AuditRecord | None:
        """Append to the chain inside the caller's transaction (its writer locked the anchor first)."""
        if entry is None:
            return None
        entry = replace(entry, kind=entry.kind or kind, name=entry.name or name)
        anchor = s.execute(
            sa.select(AuditAnchorRow)
            .where(AuditAnchorRow.id == 1)
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalar_one()
        try:
            rec = auditlog.chain(entry, seq=anchor.count + 1, at=at, prev_hash=anchor.head_hash)
        except ValueError as exc:
            raise ValidationFailed("audit", str(exc)) from exc
        s.add(
            AuditRow(
                seq=rec.seq,
                at=rec.at,
                actor=rec.actor,
                action=rec.action,
                kind=rec.kind,
                name=rec.name,
                detail=dict(rec.detail),
                prev_hash=rec.prev_hash,
                hash=rec.hash,
            )
        )
        anchor.count = rec.seq
        anchor.head_hash = rec.hash
        s.flush()
        return rec

    def _audit_many(
        self, s: Session, entries: Sequence[AuditEntry], at: datetime, kind: str = "", name: str = ""
    ) -> None:
        """Append several records under one anchor lock, one INSERT and one anchor update.

        Why: a scheduling cycle (or a bulk cancel) audits one decision per workload; appending
        them one by one cost an anchor read and a flush each.
        """
        if len(entries) <= 1:
            for entry in entries:
                self._audit(s, entry, at, kind, name)
            return
        s.flush()
        conn = s.connection()
        row = conn.execute(
            sa.select(_ANCHOR.c.count, _ANCHOR.c.head_hash).where(_ANCHOR.c.id == 1).with_for_update()
        ).one()
        full = [replace(e, kind=e.kind or kind, name=e.name or name) for e in entries]
        rows, count, head = _chain_rows(full, at, int(row[0]), str(row[1]))
        conn.execute(sa.insert(_AT), rows)
        conn.execute(sa.update(_ANCHOR).where(_ANCHOR.c.id == 1).values(count=count, head_hash=head))

    # ------------------------------------------------------------- leader lease

    def fenced(self, epoch: int, *, idle_timeout_s: float = 4.0) -> Store:
        """A view of this store whose every write transaction first checks the lease's epoch.

        Why a view: the controller's decisions go through many methods; handing it a fenced
        view guards them all (NotLeader, nothing written, once the lease moved on) while the
        API's own writes keep the plain store. The view shares the engine: do not ``close`` it.
        ``idle_timeout_s``: PostgreSQL aborts a fenced transaction left idle that long.
        """
        view = copy.copy(self)
        view._fence = epoch
        view._fence_idle_ms = max(1, int(idle_timeout_s * 1000))
        return view

    @property
    def fence(self) -> int | None:
        """The fencing token this view checks (None for the plain store)."""
        return self._fence

    def get_lease(self) -> Lease:
        """The leader lease as stored (holder empty when nobody holds it)."""
        with self.engine.connect() as conn:
            return leaselib.read(conn)

    def acquire_lease(
        self,
        holder: str,
        url: str,
        ttl_s: float,
        *,
        dead_holder: str | None = None,
        at: datetime | None = None,
    ) -> Lease | None:
        """Take the lease with a new epoch when it is free, expired, already ours or held by
        ``dead_holder``; None when another holder keeps it. One conditional UPDATE (atomic)."""
        if not holder:
            raise ValidationFailed("holder", "required")
        if ttl_s <= 0:
            raise ValidationFailed("ttl_s", "must be > 0")
        now = self._now(at)
        with self._core_writer.begin() as conn:
            return leaselib.take(conn, holder, url, now, ttl_s, dead_holder)

    def renew_lease(self, holder: str, epoch: int, ttl_s: float, *, at: datetime | None = None) -> Lease:
        """Extend our lease by ``ttl_s`` from now; NotLeader when someone took it over."""
        now = self._now(at)
        with self._core_writer.begin() as conn:
            got = leaselib.renew(conn, holder, epoch, now, ttl_s)
        if got is None:
            raise NotLeader(f"the leader lease (epoch {epoch}) was taken over")
        return got

    def release_lease(self, holder: str, epoch: int, *, at: datetime | None = None) -> bool:
        """Give our lease up (clean stop); False when it was not ours any more."""
        now = self._now(at)
        with self._core_writer.begin() as conn:
            return leaselib.release(conn, holder, epoch, now)

    # ------------------------------------------------------------------ objects

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
        parts = _object_parts(manifest)
        now = self._now(at)
        try:
            with self._write() as s:
                return self._put_in(s, parts, mode, expected_version, audit, now)
        except IntegrityError as exc:  # concurrent create of the same kind+name
            raise Conflict("metadata.name", f"{parts[0]} {parts[1]!r} already exists") from exc

    def apply_objects(
        self,
        items: Sequence[tuple[Mapping[str, Any], AuditEntry | None, int | None]],
        *,
        at: datetime | None = None,
    ) -> list[tuple[ObjectRecord, Literal["created", "updated", "unchanged"]]]:
        """kubectl-apply several objects in one transaction: all of them, or (on any error) none.
        Each item: manifest, audit entry, expected resourceVersion (None: unconditional)."""
        parts = [(_object_parts(m), a, v) for m, a, v in items]
        now = self._now(at)
        try:
            with self._write() as s:
                return [self._put_in(s, p, "apply", v, a, now) for p, a, v in parts]
        except IntegrityError as exc:
            raise Conflict("metadata.name", "an object of the set was created concurrently; retry") from exc

    def _put_in(
        self,
        s: Session,
        parts: tuple[str, str, dict[str, Any], dict[str, str], dict[str, str]],
        mode: Literal["apply", "create", "update"],
        expected_version: int | None,
        audit: AuditEntry | None,
        now: datetime,
    ) -> tuple[ObjectRecord, Literal["created", "updated", "unchanged"]]:
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
            self._audit(s, audit, now, kind, name)
            return _obj(row), "created"
        if mode == "create":
            raise Conflict("metadata.name", f"{kind} {name!r} already exists")
        _check_version(f"{kind} {name!r}", row.resource_version, expected_version)
        same = (_canonical(row.spec), _canonical(row.labels), _canonical(row.annotations)) == (
            _canonical(spec),
            _canonical(labels),
            _canonical(annotations),
        )
        if same:
            return _obj(row), "unchanged"
        row.spec, row.labels, row.annotations = spec, labels, annotations
        row.resource_version += 1
        row.updated_at = now
        s.flush()
        self._audit(s, audit, now, kind, name)
        return _obj(row), "updated"

    def get_object(self, kind: str, name: str) -> ObjectRecord:
        """One object; NotFound if missing."""
        with self._read() as s:
            row = s.execute(
                sa.select(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.name == name)
            ).scalar_one_or_none()
            if row is None:
                raise NotFound(kind, name)
            return _obj(row)

    def list_objects(self, kind: str | None = None) -> list[ObjectRecord]:
        """All objects (of one kind), ordered by kind then name."""
        if kind is not None and kind not in OBJECT_KINDS:
            raise ValidationFailed("kind", f"must be one of {list(OBJECT_KINDS)}, got {kind!r}")
        q = sa.select(ObjectRow).order_by(ObjectRow.kind, ObjectRow.name)
        if kind is not None:
            q = q.where(ObjectRow.kind == kind)
        with self._read() as s:
            return [_obj(r) for r in s.execute(q).scalars()]

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
        now = self._now(at)
        with self._write() as s:
            row = s.execute(
                sa.select(ObjectRow).where(ObjectRow.kind == kind, ObjectRow.name == name).with_for_update()
            ).scalar_one_or_none()
            if row is None:
                raise NotFound(kind, name)
            _check_version(f"{kind} {name!r}", row.resource_version, expected_version)
            rec = _obj(row)
            s.delete(row)
            s.flush()
            self._audit(s, audit, now, kind, name)
            if kind == "Queue":
                self._revoke_scoped(s, name, now)
            return rec

    # ---------------------------------------------------------------- workloads

    def submit_workload(
        self,
        manifest: Mapping[str, Any],
        *,
        owner: str,
        phase: Literal["Pending", "AwaitingApproval"] = "Pending",
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> tuple[WorkloadRecord, bool]:
        """Submit; idempotent by name. Returns (record, created).

        Same name with the same manifest (ignoring ``status``) and owner returns
        the existing row with created=False; anything different is a Conflict.
        """
        sub = check_submission(manifest, owner=owner, phase=phase, audit=audit)
        res = self.submit_workloads([sub], at=at)[0]
        if isinstance(res, StoreError):
            raise res
        return res

    def submit_workloads(
        self, batch: Sequence[WorkloadSubmission], *, at: datetime | None = None
    ) -> list[tuple[WorkloadRecord, bool] | StoreError]:
        """Submit many in ONE transaction (group commit); one result per item, in order.

        Why: a submit is durable only once committed, and the audit chain serialises appends on
        one anchor row, so concurrent submits are cheapest when they share a commit. Each item
        has ``submit_workload``'s semantics: (record, created), or a StoreError (a Conflict for
        a different manifest or owner under an existing name) that fails that item alone. The
        same name twice in a batch is a resubmit of the first. Rows, ``Submitted`` events and
        audit records are written together or not at all. Should the database refuse the batch
        as a whole, each item is retried in its own transaction so one bad item cannot fail the
        others.
        """
        if not batch:
            return []
        now = self._now(at)
        try:
            with self._core_writer.begin() as conn:
                return self._submit_batch(conn, batch, now)
        except DBAPIError:
            if len(batch) == 1:
                raise
            out: list[tuple[WorkloadRecord, bool] | StoreError] = []
            for sub in batch:
                try:
                    with self._core_writer.begin() as conn:
                        out.extend(self._submit_batch(conn, [sub], now))
                except DBAPIError as exc:
                    out.append(StoreError("workload", f"the database refused it: {type(exc.orig).__name__}"))
            return out

    @staticmethod
    def _lock_and_insert(
        conn: sa.Connection, subs: Sequence[WorkloadSubmission], now: datetime
    ) -> tuple[tuple[int, str], dict[str, int]]:
        """Lock the audit anchor, insert the new names: ((count, head), name -> seq of those inserted).

        INSERT .. ON CONFLICT DO NOTHING: a name that exists (or that a concurrent writer is
        inserting: PostgreSQL waits for it) is skipped, and the caller compares it.
        """
        row = conn.execute(
            sa.select(_ANCHOR.c.count, _ANCHOR.c.head_hash).where(_ANCHOR.c.id == 1).with_for_update()
        ).one()
        ins = _insert_ignore(conn.dialect.name, _WT).returning(_WT.c.seq, _WT.c.name)
        rows = [
            {
                "name": sub.name,
                "queue": sub.queue,
                "priority_class": sub.priority_class,
                "owner": sub.owner,
                "manifest": sub.manifest,
                "phase": sub.phase,
                "placement": None,
                "reason": "",
                "submitted_at": now,
                "admitted_at": None,
                "finished_at": None,
                "resource_version": 1,
            }
            for sub in subs
        ]
        seqs = {name: seq for seq, name in conn.execute(ins, rows)}
        return (int(row[0]), str(row[1])), seqs

    def _submit_batch(
        self, conn: sa.Connection, batch: Sequence[WorkloadSubmission], now: datetime
    ) -> list[tuple[WorkloadRecord, bool] | StoreError]:
        out: list[tuple[WorkloadRecord, bool] | StoreError | None] = [None] * len(batch)
        firsts: dict[str, int] = {}
        for i, sub in enumerate(batch):
            firsts.setdefault(sub.name, i)
        new = [batch[i] for i in firsts.values()]
        # the anchor first: batches (of this or another process) then never wait on each other's
        # uncommitted names, so they cannot deadlock; every audited write takes it anyway
        pg = conn.dialect.name == "postgresql" and _pg_pipeline_ok()
        anchor, seqs = _pg_lock_and_insert(conn, new, now) if pg else self._lock_and_insert(conn, new, now)
        self._check_fence(conn)
        missing = sorted({sub.name for sub in new} - seqs.keys())
        existing: dict[str, Any] = {}
        if missing:
            q = sa.select(_WT).where(_WT.c.name.in_(missing))
            existing = {r.name: r for r in conn.execute(q)}
        created: list[WorkloadSubmission] = []
        for i, sub in enumerate(batch):
            first = firsts[sub.name]
            if sub.name in seqs:
                if i == first:
                    created.append(sub)
                    out[i] = (_new_record(sub, seqs[sub.name], now), True)
                else:  # the same name twice in one batch: the later one is a resubmit
                    out[i] = _same(sub, batch[first].owner, batch[first].manifest) or (
                        _new_record(batch[first], seqs[sub.name], now),
                        False,
                    )
                continue
            row = existing.get(sub.name)
            if row is None:  # deleted between the insert and the select: cannot happen, be explicit
                out[i] = StoreError("metadata.name", f"workload {sub.name!r} could not be stored; retry")
                continue
            out[i] = _same(sub, row.owner, row.manifest) or (_row_record(row), False)
        if created:
            events = [
                {
                    "workload": c.name,
                    "type": "Normal",
                    "reason": "Submitted",
                    "message": f"queue {c.queue}",
                    "at": now,
                }
                for c in created
            ]
            entries = [
                replace(c.audit, kind=c.audit.kind or "Workload", name=c.audit.name or c.name)
                for c in created
                if c.audit is not None
            ]
            audit_rows, count, head = _chain_rows(entries, now, *anchor)
            if pg:
                _pg_append(conn, events, audit_rows, count, head)
            else:
                conn.execute(sa.insert(_ET), events)
                if audit_rows:
                    conn.execute(sa.insert(_AT), audit_rows)
                    conn.execute(
                        sa.update(_ANCHOR).where(_ANCHOR.c.id == 1).values(count=count, head_hash=head)
                    )
        return [r if r is not None else StoreError("workload", "not processed") for r in out]

    def pending_reasons(self, names: Sequence[str] | None = None) -> dict[str, str]:
        """Name -> stored reason of the Pending workloads (of ``names``; all in arrival order).

        Why: the controller resyncs its pending set periodically, and checks that what it was
        handed is still Pending; reading two narrow columns instead of whole rows keeps that
        cheap with a large backlog.
        """
        q = sa.select(_WT.c.name, _WT.c.reason).where(_WT.c.phase == "Pending").order_by(_WT.c.seq)
        out: dict[str, str] = {}
        with self.engine.connect() as conn:
            if names is None:
                out.update((n, r) for n, r in conn.execute(q))
            else:
                for part in _chunks(sorted(set(names))):
                    out.update((n, r) for n, r in conn.execute(q.where(_WT.c.name.in_(part))))
        return out

    def set_pending_reasons(self, reasons: Mapping[str, str]) -> int:
        """Record why Pending workloads wait (the scheduler's latest reason), in one transaction.

        Why: the reason must be visible in every workload view and survive a restart, yet the
        scheduler re-derives it every cycle; the caller passes only the reasons whose text
        changed, so a cycle costs one statement, not a write per pending workload. Only rows
        still Pending are touched (a workload admitted or cancelled meanwhile keeps its own
        reason); resourceVersion is not bumped and nothing is audited: this is advisory status,
        not a decision. Returns the number of rows updated.
        """
        if not reasons:
            return 0
        # the driver's executemany directly: SQLAlchemy's per-row parameter processing cost more
        # than the UPDATEs themselves for a few thousand reasons (and it runs in the scheduler)
        # (PostgreSQL: one statement over two arrays instead of a round trip per row)
        pairs = sorted(reasons.items())
        with self._core_writer.begin() as conn:
            if self.dialect == "postgresql":
                # the anchor first, as every writer does (no lock-order deadlock with a cycle)
                conn.execute(sa.select(_ANCHOR.c.id).where(_ANCHOR.c.id == 1).with_for_update())
                self._check_fence(conn)
                res = conn.exec_driver_sql(
                    "UPDATE workloads AS w SET reason = v.r FROM unnest(%s::text[], %s::text[]) AS v(n, r) "
                    "WHERE w.name = v.n AND w.phase = 'Pending'",
                    ([n for n, _ in pairs], [r for _, r in pairs]),
                )
            else:
                self._check_fence(conn)
                res = conn.exec_driver_sql(
                    "UPDATE workloads SET reason = ? WHERE name = ? AND phase = 'Pending'",
                    [(r, n) for n, r in pairs],
                )
            return int(res.rowcount)

    def get_workload(self, name: str) -> WorkloadRecord:
        """One workload; NotFound if missing."""
        with self._read() as s:
            row = s.execute(sa.select(WorkloadRow).where(WorkloadRow.name == name)).scalar_one_or_none()
            if row is None:
                raise NotFound("Workload", name)
            return _wl(row)

    def list_workloads(
        self,
        *,
        queues: Collection[str] | None = None,
        phases: Collection[str] | None = None,
        owner: str | None = None,
        names: Collection[str] | None = None,
        after_seq: int = 0,
        limit: int | None = None,
    ) -> list[WorkloadRecord]:
        """Workloads in arrival order, filtered; ``after_seq``/``limit`` page through them."""
        if phases is not None:
            bad = sorted(set(phases) - set(PHASES))
            if bad:
                raise ValidationFailed("phase", f"unknown phases {bad}")
        if limit is not None and limit < 0:
            raise ValidationFailed("limit", "must be >= 0")
        q = sa.select(WorkloadRow).where(WorkloadRow.seq > after_seq).order_by(WorkloadRow.seq)
        if queues is not None:
            q = q.where(WorkloadRow.queue.in_(list(queues)))
        if phases is not None:
            q = q.where(WorkloadRow.phase.in_(list(phases)))
        if owner is not None:
            q = q.where(WorkloadRow.owner == owner)
        if names is not None:
            q = q.where(WorkloadRow.name.in_(list(names)))
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return [_wl(r) for r in s.execute(q).scalars()]

    def phase_counts(self) -> dict[str, int]:
        """How many workloads are in each phase (phases with none are absent); for the metrics."""
        with self.engine.connect() as c:
            rows = c.execute(sa.select(WorkloadRow.phase, sa.func.count()).group_by(WorkloadRow.phase)).all()
        return {p: n for p, n in rows}

    def ping(self) -> None:
        """One round trip to the database; raises what the driver raises when it is unreachable
        (readiness reports the exception's type)."""
        with self.engine.connect() as c:
            c.execute(sa.text("SELECT 1"))

    def transition_workload(
        self,
        name: str,
        phase: str,
        *,
        reason: str = "",
        placement: Mapping[str, Any] | _Keep | None = KEEP,
        expected_version: int | None = None,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> WorkloadRecord:
        """Move one workload to ``phase`` (see ALLOWED_TRANSITIONS); records an event."""
        change = PhaseChange(name, phase, reason, placement, expected_version)
        return self.apply_transitions([change], audit=[audit] if audit else None, at=at)[0]

    def apply_transitions(
        self,
        changes: Sequence[PhaseChange],
        *,
        audit: Sequence[AuditEntry] | None = None,
        at: datetime | None = None,
        events: Sequence[tuple[str, str, str, str]] = (),
    ) -> list[WorkloadRecord]:
        """Apply several phase changes atomically (e.g. one scheduling cycle): all or none.

        Entering Admitted sets admitted_at; a terminal phase sets finished_at;
        Pending/AwaitingApproval clear the placement unless one is given.
        ``audit`` entries (any number) are appended in the same transaction, and so are
        ``events`` ``(workload, type, reason, message)`` (e.g. a failure record that must never
        be lost while its requeue is kept, or the reverse).
        """
        now = self._now(at)
        names = [c.name for c in changes]
        if len(set(names)) != len(names):
            raise ValidationFailed("changes", "a workload appears more than once")
        for c in changes:
            if c.phase not in PHASES:
                raise ValidationFailed("phase", f"unknown phase {c.phase!r}; one of {list(PHASES)}")
        out: dict[str, WorkloadRecord] = {}
        with self._write() as s:
            rows = {
                r.name: r
                for r in s.execute(
                    sa.select(WorkloadRow)
                    .where(WorkloadRow.name.in_(names))
                    .order_by(WorkloadRow.name)
                    .with_for_update()
                ).scalars()
            }
            for c in changes:
                row = rows.get(c.name)
                if row is None:
                    raise NotFound("Workload", c.name)
                _check_version(f"workload {c.name!r}", row.resource_version, c.expected_version)
                old = row.phase
                same_ok = c.phase == old and old not in TERMINAL_PHASES
                if not same_ok and c.phase not in ALLOWED_TRANSITIONS[old]:
                    raise Conflict("phase", f"workload {c.name!r} cannot go from {old} to {c.phase}")
                row.phase = c.phase
                row.reason = c.reason
                if not isinstance(c.placement, _Keep):
                    row.placement = (
                        None if c.placement is None else _json_copy(dict(c.placement), "placement")
                    )
                elif c.phase in ("Pending", "AwaitingApproval"):
                    row.placement = None
                if c.phase == "Admitted" and old != "Admitted":
                    row.admitted_at = now
                if c.phase in TERMINAL_PHASES:
                    row.finished_at = now
                row.resource_version += 1
                s.add(
                    EventRow(
                        workload=c.name,
                        type="Warning" if c.phase in WARNING_PHASES else "Normal",
                        reason=c.phase,
                        message=c.reason or f"{old} -> {c.phase}",
                        at=now,
                    )
                )
            for wl, typ, reason, message in events:
                if typ not in EVENT_TYPES:
                    raise ValidationFailed("type", f"must be one of {list(EVENT_TYPES)}")
                s.add(EventRow(workload=wl, type=typ, reason=reason, message=message, at=now))
            s.flush()
            self._audit_many(s, audit or (), now, "Workload", names[0] if len(names) == 1 else "")
            out = {n: _wl(rows[n]) for n in names}
        return [out[n] for n in names]

    # ------------------------------------------------------------------- events

    def add_event(
        self, workload: str, type: str, reason: str, message: str = "", *, at: datetime | None = None
    ) -> EventRecord:
        """Record an event against a workload (NotFound if the workload is unknown)."""
        if type not in EVENT_TYPES:
            raise ValidationFailed("type", f"must be one of {list(EVENT_TYPES)}")
        if not reason:
            raise ValidationFailed("reason", "required")
        now = self._now(at)
        with self._write() as s:
            if s.execute(sa.select(WorkloadRow.seq).where(WorkloadRow.name == workload)).first() is None:
                raise NotFound("Workload", workload)
            row = EventRow(workload=workload, type=type, reason=reason, message=message, at=now)
            s.add(row)
            s.flush()
            return _ev(row)

    def list_events(self, workload: str | None = None, *, limit: int | None = None) -> list[EventRecord]:
        """Events oldest first, optionally for one workload; ``limit`` keeps the newest."""
        q = sa.select(EventRow).order_by(EventRow.id.desc())
        if workload is not None:
            q = q.where(EventRow.workload == workload)
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return [_ev(r) for r in reversed(s.execute(q).scalars().all())]

    # -------------------------------------------------------------------- audit

    def append_audit(self, entry: AuditEntry, *, at: datetime | None = None) -> AuditRecord:
        """Append a standalone audit record (e.g. a denied request or a login)."""
        now = self._now(at)
        with self._write() as s:
            rec = self._audit(s, entry, now)
            assert rec is not None
            return rec

    def audit_records(self, *, after_seq: int = 0, limit: int | None = None) -> list[AuditRecord]:
        """Audit records in seq order."""
        q = sa.select(AuditRow).where(AuditRow.seq > after_seq).order_by(AuditRow.seq)
        if limit is not None:
            q = q.limit(limit)
        with self._read() as s:
            return [_aud(r) for r in s.execute(q).scalars()]

    def audit_head(self) -> tuple[int, str]:
        """(count, head hash) from the anchor; keep a copy elsewhere to detect wholesale rewrites."""
        with self._read() as s:
            anchor = s.get_one(AuditAnchorRow, 1)
            return anchor.count, anchor.head_hash

    def _iter_audit(self, s: Session) -> Iterator[AuditRecord]:
        q = sa.select(AuditRow).order_by(AuditRow.seq).execution_options(yield_per=1000)
        for row in s.execute(q).scalars():
            yield _aud(row)
            s.expunge(row)

    def verify_audit(
        self,
        *,
        expected_count: int | None = None,
        expected_head: str | None = None,
        checkpoint: tuple[int, str] | None = None,
    ) -> VerifyResult:
        """Verify the whole chain against the anchor (and optional external expectations), one snapshot.

        ``checkpoint`` (count, head hash) is an external witness taken earlier: the chain may have
        grown since, but record ``count`` must still have that hash (see :func:`auditlog.verify`).
        """
        with self._read(snapshot=True) as s:
            anchor = s.get_one(AuditAnchorRow, 1)
            count, head = anchor.count, anchor.head_hash
            result = auditlog.verify(
                self._iter_audit(s), expected_count=count, expected_head=head, checkpoint=checkpoint
            )
        if result.ok and (expected_count is not None or expected_head is not None):
            result = auditlog.verify(
                self.audit_records(), expected_count=expected_count, expected_head=expected_head
            )
        return result

    def export_audit(self, fmt: Literal["jsonl", "csv"], out: TextIO) -> int:
        """Stream the audit log as JSONL or CSV; returns the number of records."""
        if fmt not in ("jsonl", "csv"):
            raise ValidationFailed("format", "must be 'jsonl' or 'csv'")
        with self._read(snapshot=True) as s:
            records = self._iter_audit(s)
            return (
                auditlog.export_jsonl(records, out) if fmt == "jsonl" else auditlog.export_csv(records, out)
            )

    # ------------------------------------------------------------------- tokens

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
            _check_name(scope, "scope")
        now = self._now(at)
        plaintext, digest = generate_token()
        with self._write() as s:
            row = TokenRow(
                token_hash=digest,
                name=name,
                role=r.value,
                scope=scope,
                created_at=now,
                revoked=False,
                revoked_at=None,
            )
            s.add(row)
            s.flush()
            detail_entry = None
            if audit is not None:
                detail = {"role": r.value, "scope": scope, "id": row.id, **dict(audit.detail)}
                detail_entry = replace(audit, detail=detail)
            self._audit(s, detail_entry, now, "Token", name)
            return IssuedToken(_tok(row), plaintext)

    def authenticate(self, token: str) -> Principal | None:
        """The principal for a presented token, or None if unknown or revoked (O(1) by hash)."""
        if not token:
            return None
        digest = hash_token(token)
        with self._read() as s:
            row = s.execute(sa.select(TokenRow).where(TokenRow.token_hash == digest)).scalar_one_or_none()
            if row is None or row.revoked or not token_matches(token, row.token_hash):
                return None
            return Principal(name=row.name, role=Role(row.role), scope=row.scope, token_id=row.id)

    def revoke_token(
        self, token_id: int, *, audit: AuditEntry | None = None, at: datetime | None = None
    ) -> TokenRecord:
        """Revoke (idempotent); NotFound for an unknown id."""
        now = self._now(at)
        with self._write() as s:
            row = s.get(TokenRow, token_id, with_for_update=True)
            if row is None:
                raise NotFound("Token", str(token_id))
            if not row.revoked and row.role == "platform-admin":
                self._keep_one_admin(s, row.id)
            if not row.revoked:
                row.revoked = True
                row.revoked_at = now
                s.flush()
                self._audit(s, audit, now, "Token", row.name)
            return _tok(row)

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

    def _revoke_scoped(self, s: Session, queue: str, now: datetime) -> None:
        """Tokens scoped to a deleted queue die with it: a queue created later under the same
        name (perhaps by another team) must not inherit them."""
        rows = s.execute(
            sa.select(TokenRow).where(TokenRow.scope == queue, TokenRow.revoked.is_(False)).with_for_update()
        ).scalars()
        for row in rows:
            row.revoked, row.revoked_at = True, now
            s.flush()
            self._audit(
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
        with self._read() as s:
            return [_tok(r) for r in s.execute(q).scalars()]

    def ensure_bootstrap_admin(
        self, *, name: str = "bootstrap-admin", at: datetime | None = None
    ) -> str | None:
        """On first start (no tokens at all) create a platform-admin token and return it; else None.

        Safe against concurrent first starts: the audit anchor is locked before checking.
        """
        now = self._now(at)
        with self._write() as s:
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
            self._audit(s, entry, now, "Token", name)
            return plaintext

    # ---------------------------------------------------------------- approvals

    def request_approval(
        self,
        workload: str,
        requested_by: str,
        *,
        expires_at: datetime,
        reason: str = "",
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> ApprovalRecord:
        """Open an approval request; Conflict if one is already pending for the workload."""
        now = self._now(at)
        exp = self._now(expires_at)
        if exp <= now:
            raise ValidationFailed("expires_at", "must be in the future")
        if not requested_by:
            raise ValidationFailed("requested_by", "required")
        with self._write() as s:
            if s.execute(sa.select(WorkloadRow.seq).where(WorkloadRow.name == workload)).first() is None:
                raise NotFound("Workload", workload)
            pending = s.execute(
                sa.select(ApprovalRow.id).where(
                    ApprovalRow.workload == workload, ApprovalRow.state == "Pending"
                )
            ).first()
            if pending is not None:
                raise Conflict("workload", f"workload {workload!r} already has pending approval {pending[0]}")
            row = ApprovalRow(
                workload=workload,
                requested_by=requested_by,
                state="Pending",
                approver=None,
                reason=reason,
                requested_at=now,
                decided_at=None,
                expires_at=exp,
            )
            s.add(row)
            s.flush()
            self._audit(s, audit, now, "Workload", workload)
            return _appr(row)

    def decide_approval(
        self,
        approval_id: int,
        *,
        approver: str,
        approve: bool,
        reason: str = "",
        allow_self_approval: bool = False,
        audit: AuditEntry | None = None,
        at: datetime | None = None,
    ) -> ApprovalRecord:
        """Approve or reject a pending request, atomically moving an AwaitingApproval workload
        to Pending (approved) or Rejected. Conflict if already decided or expired, or (by
        default) if the approver is the requester (four-eyes)."""
        now = self._now(at)
        if not approver:
            raise ValidationFailed("approver", "required")
        with self._write() as s:
            row = s.get(ApprovalRow, approval_id, with_for_update=True)
            if row is None:
                raise NotFound("Approval", str(approval_id))
            if row.state != "Pending":
                raise Conflict("state", f"approval {approval_id} is already {row.state}")
            if row.expires_at <= now:
                raise Conflict(
                    "expires_at", f"approval {approval_id} expired at {row.expires_at.isoformat()}"
                )
            if approver == row.requested_by and not allow_self_approval:
                raise Conflict("approver", "the requester cannot approve their own request")
            row.state = "Approved" if approve else "Rejected"
            row.approver = approver
            row.reason = reason or row.reason
            row.decided_at = now
            wl = s.execute(
                sa.select(WorkloadRow).where(WorkloadRow.name == row.workload).with_for_update()
            ).scalar_one()
            if wl.phase == "AwaitingApproval":
                self._set_phase(
                    s, wl, "Pending" if approve else "Rejected", reason or f"{row.state} by {approver}", now
                )
            s.flush()
            self._audit(s, audit, now, "Workload", row.workload)
            return _appr(row)

    def _set_phase(self, s: Session, wl: WorkloadRow, phase: str, reason: str, now: datetime) -> None:
        old = wl.phase
        wl.phase = phase
        wl.reason = reason
        wl.resource_version += 1
        if phase in TERMINAL_PHASES:
            wl.finished_at = now
        s.add(
            EventRow(
                workload=wl.name,
                type="Warning" if phase in WARNING_PHASES else "Normal",
                reason=phase,
                message=reason or f"{old} -> {phase}",
                at=now,
            )
        )

    def expire_approvals(self, *, actor: str = "system", at: datetime | None = None) -> list[ApprovalRecord]:
        """Mark overdue pending approvals Expired; their AwaitingApproval workloads become Rejected."""
        now = self._now(at)
        with self._write() as s:
            rows = (
                s.execute(
                    sa.select(ApprovalRow)
                    .where(ApprovalRow.state == "Pending", ApprovalRow.expires_at <= now)
                    .order_by(ApprovalRow.id)
                    .with_for_update()
                )
                .scalars()
                .all()
            )
            for row in rows:
                row.state = "Expired"
                row.decided_at = now
                wl = s.execute(sa.select(WorkloadRow).where(WorkloadRow.name == row.workload)).scalar_one()
                if wl.phase == "AwaitingApproval":
                    self._set_phase(s, wl, "Rejected", "approval expired", now)
            s.flush()
            for row in rows:
                entry = AuditEntry(actor=actor, action="approval.expire", detail={"approval": row.id})
                self._audit(s, entry, now, "Workload", row.workload)
            return [_appr(r) for r in rows]

    def get_approval(self, approval_id: int) -> ApprovalRecord:
        """One approval; NotFound if missing."""
        with self._read() as s:
            row = s.get(ApprovalRow, approval_id)
            if row is None:
                raise NotFound("Approval", str(approval_id))
            return _appr(row)

    def list_approvals(
        self, *, state: str | None = None, workload: str | None = None
    ) -> list[ApprovalRecord]:
        """Approvals oldest first, filtered by state and/or workload."""
        q = sa.select(ApprovalRow).order_by(ApprovalRow.id)
        if state is not None:
            q = q.where(ApprovalRow.state == state)
        if workload is not None:
            q = q.where(ApprovalRow.workload == workload)
        with self._read() as s:
            return [_appr(r) for r in s.execute(q).scalars()]
