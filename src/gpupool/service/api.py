"""The REST API (FastAPI): configuration, workloads, approvals, views, audit, tokens, metrics.

Why these conventions:
* Every error is JSON ``{"error": {"status", "message", "errors": [{"field", "problem"}]}}`` with
  a 4xx status that says what to fix; no request can produce a traceback.
* Workloads outside a caller's queue subtree are answered 404 for every verb (read, cancel,
  approve...), so a tenant cannot even learn that another team's workload exists; acting on a
  queue the caller may see but not use (submit to another team's queue, manage config without
  the role) is 403 with the reason from gpupool.auth.
* Every mutation is written with its audit record in the same store transaction; denied
  mutations are audited too.
"""

from __future__ import annotations

import asyncio
import gc
import io
import json
import logging
import sys
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from fastapi import Body, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpupool.audit import AuditEntry, canonical_json
from gpupool.auth import Action, Principal, Resource, Role, authorize, parse_bearer
from gpupool.manifests import KUEUE_QUEUE_LABEL, Document, ManifestError
from gpupool.model import UNLIMITED, Workload
from gpupool.quantity import QuantityError, parse_duration
from gpupool.service import openapi as oa
from gpupool.service.admission import (
    Refusal,
    exception_duration_s,
    is_exception,
    needs_approval,
    queue_refusal,
    request_refusal,
)
from gpupool.service.backends import Backend, make_backend
from gpupool.service.batch import SubmitBatcher
from gpupool.service.config import ServiceConfig, seed_config, write_token_file
from gpupool.service.controller import Controller
from gpupool.service.convert import (
    CORDON_ANNOTATION,
    bundle_from_manifests,
    error_items,
    object_manifest,
    parse_manifest,
    resource_version,
    without_server_metadata,
    workload_model,
)
from gpupool.service.failures import device_health, history_view, node_health
from gpupool.service.guard import PARSED_KEY, RequestGuard
from gpupool.service.leader import LeaderElector, install_standby_guard, readiness, start_leader
from gpupool.service.metrics import Metrics
from gpupool.service.openapi import AUTH, BODY, READ, WRITE, doc
from gpupool.service.view import ConfigLookups, ConfigView
from gpupool.store import TERMINAL_PHASES, NotFound, ObjectRecord, Store, StoreError, WorkloadRecord
from gpupool.store.schema import PHASES, WorkloadRow

log = logging.getLogger("gpupool.api")

PLURALS = {
    "pools": "ResourcePool",
    "queues": "Queue",
    "priorityclasses": "PriorityClass",
    "clusters": "Cluster",
}
CONFIG_ACTIONS = {
    "ResourcePool": "pool",
    "Queue": "queue",
    "PriorityClass": "priorityclass",
    "Cluster": "cluster",
}
TOKEN_CACHE_S = 5.0
#: the largest id or sequence number any store column holds (a signed 64-bit integer)
MAX_ID = 2**63 - 1


class ApiError(Exception):
    """An error the client can act on; becomes the JSON error body."""

    def __init__(self, status: int, message: str, errors: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []


class Denied(ApiError):
    """A 403 whose audit record the caller still has to write."""

    def __init__(self, message: str, entry: AuditEntry) -> None:
        super().__init__(403, message)
        self.entry = entry


def _err(status: int, message: str, errors: list[dict[str, str]] | None = None) -> JSONResponse:
    body = {"error": {"status": status, "message": message, "errors": errors or []}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


# ---------------------------------------------------------------------- request bodies
class TokenRequest(BaseModel):
    name: str = Field(min_length=1, max_length=253, description="who the token is for")
    role: Role
    scope: str | None = Field(
        default=None, description="root queue of the subtree (queue-admin, member, viewer)"
    )


class ApproveRequest(BaseModel):
    reason: str = Field(default="", max_length=2000)
    until: datetime | None = Field(
        default=None, description="end of an exception window (exception requests only)"
    )
    duration: str | None = Field(
        default=None, description="exception window length, e.g. '2h' (instead of until)"
    )


class RejectRequest(BaseModel):
    reason: str = Field(min_length=1, max_length=2000, description="why the request is rejected (required)")


class ApplyRequest(BaseModel):
    items: list[dict[str, Any]] = Field(
        min_length=1, description="manifests, applied all-or-nothing after validation"
    )


# ---------------------------------------------------------------------- views
def workload_view(rec: WorkloadRecord) -> dict[str, Any]:
    return {
        "name": rec.name,
        "queue": rec.queue,
        "priorityClass": rec.priority_class,
        "owner": rec.owner,
        "phase": rec.phase,
        "reason": rec.reason,
        "placement": rec.placement,
        "submittedAt": rec.submitted_at.isoformat(),
        "admittedAt": rec.admitted_at.isoformat() if rec.admitted_at else None,
        "finishedAt": rec.finished_at.isoformat() if rec.finished_at else None,
        "resourceVersion": rec.resource_version,
        "seq": rec.seq,
        "manifest": rec.manifest,
    }


def normalise_workload(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form: the Kueue queue-name label becomes spec.queue (so lookups by queue work)."""
    m = {k: v for k, v in manifest.items() if k != "status"}
    spec = dict(m.get("spec") or {})
    labels = (m.get("metadata") or {}).get("labels") or {}
    if not spec.get("queue") and isinstance(labels, Mapping) and labels.get(KUEUE_QUEUE_LABEL):
        spec["queue"] = labels[KUEUE_QUEUE_LABEL]
        m["spec"] = spec
    return m


def _vec(v: tuple[int, int, int] | None) -> dict[str, float | None] | None:
    if v is None:
        return None

    def f(x: int, scale: float) -> float | None:
        return None if x >= UNLIMITED else x / scale

    return {"gpu": f(v[0], 1000), "cpu": f(v[1], 1000), "memoryMiB": f(v[2], 1)}


@dataclass(slots=True)
class _Prepared:
    body: dict[str, Any]
    model: Workload
    queue: str
    approval: bool
    audit: AuditEntry


@dataclass
class Service:
    """What the endpoints share."""

    config: ServiceConfig
    store: Store
    backend: Backend
    controller: Controller
    metrics: Metrics
    batcher: SubmitBatcher
    bootstrap_token: str | None = None
    #: the leader lease keeper (gpupool.service.leader); None when the controller does not run
    leader: LeaderElector | None = None

    def __post_init__(self) -> None:
        self._tokens: dict[str, tuple[float, Principal]] = {}
        self._tlock = threading.Lock()

    # -- auth ---------------------------------------------------------------------------------
    def authenticate(self, header: str | None) -> Principal:
        token = parse_bearer(header)
        if token is None:
            why = (
                "no Authorization header"
                if not header
                else "the Authorization header is not 'Bearer <token>'"
            )
            raise ApiError(
                401,
                f"authentication required: {why}; send 'Authorization: Bearer <token>' "
                f"(the bootstrap admin token is in {self.config.token_file})",
            )
        now = time.monotonic()
        with self._tlock:
            hit = self._tokens.get(token)
        if hit is not None and now - hit[0] < TOKEN_CACHE_S:
            return hit[1]
        p = self.store.authenticate(token)
        if p is None:
            raise ApiError(401, "authentication failed: the token is not recognised or has been revoked")
        with self._tlock:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            self._tokens[token] = (now, p)
        return p

    def cached_principal(self, token: str) -> Principal | None:
        with self._tlock:
            hit = self._tokens.get(token)
        if hit is not None and time.monotonic() - hit[0] < TOKEN_CACHE_S:
            return hit[1]
        return None

    def forget_tokens(self) -> None:
        with self._tlock:
            self._tokens.clear()

    def check(
        self,
        p: Principal,
        action: Action,
        res: Resource,
        mutating: bool = True,
        defer: bool = False,
        tree: ConfigLookups | None = None,
    ) -> None:
        """403 unless allowed; a denied mutation is audited (``defer``: by the caller, off the event
        loop). ``tree``: the queue tree to judge by (default: the one in force)."""
        d = authorize(p, action, res, (tree or self.controller).is_in_subtree)
        if not d.allowed:
            entry = AuditEntry(
                p.name,
                "request.denied",
                res.kind,
                res.name,
                {"action": str(action), "role": str(p.role), "reason": d.reason},
            )
            if mutating and defer:
                raise Denied(f"forbidden: {d.reason}", entry)
            if mutating:
                self.store.append_audit(entry)
            raise ApiError(403, f"forbidden: {d.reason}")

    def can_read_workload(self, p: Principal, queue: str) -> bool:
        return authorize(
            p, Action.READ, Resource("Workload", queue=queue), self.controller.is_in_subtree
        ).allowed

    def visible_workload(self, p: Principal, name: str) -> WorkloadRecord:
        """The workload, or 404 when it does not exist or lies outside the caller's subtree."""
        try:
            rec = self.store.get_workload(name)
        except NotFound:
            rec = None
        if rec is None or not self.can_read_workload(p, rec.queue):
            where = (
                f" among the workloads visible to {p.role.value} {p.name!r} (queue subtree {p.scope!r})"
                if p.scope
                else ""
            )
            raise ApiError(
                404, f"workload {name!r} not found{where}", [{"field": "name", "problem": "not found"}]
            )
        return rec

    def visible_queues(self, p: Principal) -> list[str] | None:
        """None: every queue; else the queues of the caller's subtree."""
        if p.role is Role.PLATFORM_ADMIN or (p.role is Role.VIEWER and p.scope is None):
            return None
        ctl = self.controller
        return [q for q in ctl.parents if p.scope is not None and ctl.is_in_subtree(q, p.scope)]


async def _principal(request: Request) -> Principal:
    svc: Service = request.app.state.svc
    header = request.headers.get("authorization")
    token = parse_bearer(header)
    if token is not None:
        hit = svc.cached_principal(token)
        if hit is not None:
            return hit
    return await run_in_threadpool(svc.authenticate, header)


async def _svc(request: Request) -> Service:
    svc: Service = request.app.state.svc
    return svc


Caller = Annotated[Principal, Depends(_principal)]
Svc = Annotated[Service, Depends(_svc)]


def _json_object(raw: bytes) -> dict[str, Any]:
    """A JSON object request body, or the same 422 FastAPI gives for a ``dict`` body parameter."""
    try:
        value = json.loads(raw) if raw else None
    except ValueError as exc:
        problem = f"JSON decode error: {exc}"
        raise ApiError(
            422, f"invalid request: body: {problem}", [{"field": "body", "problem": problem}]
        ) from None
    if not isinstance(value, dict):
        problem = "Field required" if value is None else "Input should be a valid dictionary"
        raise ApiError(422, f"invalid request: body: {problem}", [{"field": "body", "problem": problem}])
    return value


def _refused(r: Refusal) -> ApiError:
    return ApiError(422, r.message, [{"field": r.field, "problem": r.problem}])


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------- the app
def create_app(
    config: ServiceConfig | None = None,
    *,
    store: Store | None = None,
    backend: Backend | None = None,
    start_controller: bool = True,
) -> FastAPI:
    """The FastAPI application; the store, backend and controller start with it (lifespan)."""
    cfg = config or ServiceConfig()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The scheduling cycle is pure Python and holds the GIL while it runs; hand the
        # request threads the interpreter every millisecond rather than every 5 (CPython's
        # default) so a long cycle delays an API answer by ~1 ms slices, not 5 ms ones.
        sys.setswitchinterval(0.001)
        st = store or Store.open(cfg.url)
        seed_config(st, cfg.config_dir)
        token = st.ensure_bootstrap_admin()
        if token is not None and cfg.write_token_file:
            write_token_file(cfg.token_file, token)
        be = backend or make_backend(
            cfg.backend,
            state_file=cfg.backend_state_file,
            time_scale=cfg.time_scale,
            failure_rates=cfg.failure_rates,
            node_mtbf_s=cfg.node_mtbf_s,
            node_repair_s=cfg.node_repair_s,
        )
        metrics = Metrics()
        ctl = Controller(st, be, tick_s=cfg.tick_s, min_interval_s=cfg.min_interval_s, hooks=metrics.hooks())
        ctl.faults.backoff_s, ctl.faults.max_backoff_s = cfg.retry_backoff_s, cfg.retry_max_backoff_s
        batcher = SubmitBatcher(st)
        app.state.svc = Service(cfg, st, be, ctl, metrics, batcher, token)
        if start_controller:
            start_leader(app.state.svc)  # the controller runs only while this replica holds the lease
        else:
            ctl.recover()
        # Why: a full (oldest-generation) collection walks every object the process holds —
        # the libraries, the configuration, the engine's indexes — and stops every request for
        # tens of milliseconds; under a submit burst those stalls were the whole p99 (bench
        # burst: 120-160 ms with, 36-49 ms without). What exists once the service is up lives
        # as long as the process, so it is moved out of the collector's sight (gc.freeze);
        # everything created later is collected as usual.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            batcher.close()
            if app.state.svc.leader is not None:
                app.state.svc.leader.stop()
            ctl.stop()
            if store is None:
                st.close()

    app = FastAPI(
        title="gpupool",
        version="0.1.0",
        description="GPU compute scheduling platform: pools, queues, workloads, approvals, audit.",
        lifespan=lifespan,
    )
    _install_errors(app)
    install_standby_guard(app)
    app.add_middleware(RequestGuard, max_body=cfg.max_body_bytes, max_depth=cfg.max_json_depth)
    _routes(app)
    # route matching is a linear scan: put the hot path (submit) first
    routes = app.router.routes
    hot = [
        r for r in routes if getattr(r, "path", "") == "/v1/workloads" and "POST" in getattr(r, "methods", ())
    ]
    app.router.routes[:] = hot + [r for r in routes if r not in hot]
    from gpupool.web import mount as mount_web

    mount_web(app)
    return app


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return _err(exc.status, exc.message, exc.errors)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        items = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":  # its loc is ("body", offset): the field is the body
                where = e.get("loc", ("body", "?"))[-1]
                items.append({"field": "body", "problem": f"invalid JSON at character {where}"})
                continue
            loc = [str(x) for x in e.get("loc", ()) if x not in ("body", "query", "path", "header")]
            items.append(
                {"field": ".".join(loc) or str((e.get("loc") or ["body"])[0]), "problem": str(e.get("msg"))}
            )
        msg = "invalid request: " + "; ".join(f"{i['field']}: {i['problem']}" for i in items)
        return _err(422, msg, items)

    @app.exception_handler(ManifestError)
    async def _manifest(_: Request, exc: ManifestError) -> JSONResponse:
        items = error_items(exc)
        return _err(422, f"{len(items)} problem(s) in the manifest; nothing was applied", items)

    @app.exception_handler(StoreError)
    async def _store(_: Request, exc: StoreError) -> JSONResponse:
        return _err(exc.status_code, str(exc), [{"field": exc.field, "problem": exc.problem}])

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = str(exc.detail) if exc.detail else "error"
        if exc.status_code == 404:
            msg = "no such endpoint; see /docs or /openapi.json"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette's Allow names only the first matching route's methods
            headers["Allow"] = ", ".join(oa.allowed_methods(request))
            msg = f"method {request.method} is not allowed on {request.url.path}; use {headers['Allow']}"
        resp = _err(exc.status_code, msg)
        resp.headers.update(headers)
        return resp

    @app.exception_handler(Exception)
    async def _any(_: Request, exc: Exception) -> JSONResponse:  # last resort: never a traceback
        log.exception("unhandled error")
        return _err(500, f"internal error ({type(exc).__name__}); the request was not applied")


def _config_resource(kind: str, name: str, manifest: Mapping[str, Any] | None, svc: Service) -> Resource:
    parent = None
    if kind == "Queue":
        spec = (manifest or {}).get("spec") or {}
        parent = spec.get("parent") if isinstance(spec, Mapping) else None
        if manifest is None:
            parent = svc.controller.parents.get(name)
    return Resource(kind, name, queue=parent)


def _routes(app: FastAPI) -> None:
    # ------------------------------------------------------------------ health & metrics
    @app.get("/healthz", tags=["health"], **doc(oa.Health))
    def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], **oa.READY_DOC)
    def readyz(svc: Svc) -> JSONResponse:
        """Readiness: store reachable, controller recovered and running, backend healthy."""
        problems = []
        try:
            with svc.store.engine.connect() as c:
                c.execute(sa.text("SELECT 1"))
        except Exception as exc:
            problems.append(f"store unreachable: {type(exc).__name__}")
        if svc.leader is not None and not svc.leader.is_leader:  # a standby: ready to serve reads
            return readiness(svc.leader, problems, svc.backend.health().detail)
        ctl = svc.controller
        if not ctl.ready:
            problems.append("controller has not finished recovery")
        if not ctl.alive:
            problems.append("controller loop is not running")
        if ctl.last_error:
            problems.append(f"last controller cycle failed: {ctl.last_error}")
        h = svc.backend.health()
        if not h.ok:
            problems.append("backend unhealthy")
        body = {"status": "ready" if not problems else "not ready", "problems": problems, "backend": h.detail}
        body.update(svc.leader.describe() if svc.leader is not None else {})
        return JSONResponse(body, status_code=200 if not problems else 503)

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"content": oa.METRICS_CONTENT}, **doc(None, *AUTH)["responses"]},
    )
    def metrics(request: Request, svc: Svc) -> Response:
        """Prometheus metrics (gpupool_ prefix). They name every queue and pool, so they need a
        platform-admin or cluster-wide viewer token unless the server runs with public metrics."""
        if not svc.config.metrics_public:
            p = svc.authenticate(request.headers.get("authorization"))
            if not (p.role is Role.PLATFORM_ADMIN or (p.role is Role.VIEWER and p.scope is None)):
                raise ApiError(
                    403,
                    "forbidden: metrics name every queue; they need a platform-admin or a cluster-wide "
                    f"viewer token (caller is {p.role.value} {p.name!r})",
                )

        def refresh(m: Metrics) -> None:
            with svc.store.engine.connect() as c:
                rows = c.execute(
                    sa.select(WorkloadRow.phase, sa.func.count()).group_by(WorkloadRow.phase)
                ).all()
            counts = {p: n for p, n in rows}
            for p in PHASES:
                m.workloads.labels(p).set(counts.get(p, 0))
            ctl = svc.controller
            with ctl.lock:
                for pool in ctl.bundle.pools:
                    m.gpu_allocated.labels(pool.name).set(ctl.engine.cluster.used_gpu_milli(pool.name) / 1000)
                    cap = ctl.engine.quota.capacity.get(pool.name, (0, 0, 0))
                    m.gpu_capacity.labels(pool.name).set(cap[0] / 1000)

        return Response(svc.metrics.render(refresh), media_type="text/plain; version=0.0.4")

    # ------------------------------------------------------------------ whoami & tokens
    @app.get("/v1/whoami", tags=["auth"], **doc(oa.WhoAmI, *AUTH))
    def whoami(p: Caller) -> dict[str, Any]:
        """Who the presented token belongs to."""
        return {"name": p.name, "role": p.role.value, "scope": p.scope}

    @app.post("/v1/tokens", tags=["auth"], status_code=201, **doc(oa.IssuedToken, *BODY, status=201))
    def create_token(body: TokenRequest, p: Caller, svc: Svc) -> dict[str, Any]:
        """Issue an API token (platform-admin). The token is shown once."""
        svc.check(p, Action.MANAGE_TOKENS, Resource("Token", body.name))
        if body.scope is not None and body.scope not in svc.controller.parents:
            raise ApiError(
                422,
                f"scope: queue {body.scope!r} does not exist",
                [{"field": "scope", "problem": "no such queue"}],
            )
        issued = svc.store.create_token(
            body.name, body.role, body.scope, audit=AuditEntry(p.name, "token.create", "Token", body.name)
        )
        r = issued.record
        return {"id": r.id, "name": r.name, "role": r.role, "scope": r.scope, "token": issued.token}

    @app.get("/v1/tokens", tags=["auth"], **doc(oa.TokenList, *AUTH, 403))
    def list_tokens(p: Caller, svc: Svc) -> dict[str, Any]:
        """Token metadata, never the tokens (platform-admin)."""
        svc.check(p, Action.MANAGE_TOKENS, Resource("Token"), mutating=False)
        return {
            "items": [
                {
                    "id": t.id,
                    "name": t.name,
                    "role": t.role,
                    "scope": t.scope,
                    "revoked": t.revoked,
                    "createdAt": t.created_at.isoformat(),
                }
                for t in svc.store.list_tokens()
            ]
        }

    @app.delete("/v1/tokens/{token_id}", tags=["auth"], **doc(oa.RevokedToken, *WRITE, 404))
    def revoke_token(token_id: Annotated[int, Path(ge=1, le=MAX_ID)], p: Caller, svc: Svc) -> dict[str, Any]:
        """Revoke a token (platform-admin); takes effect at once on this server."""
        svc.check(p, Action.MANAGE_TOKENS, Resource("Token", str(token_id)))
        t = svc.store.revoke_token(token_id, audit=AuditEntry(p.name, "token.revoke", "Token", str(token_id)))
        svc.forget_tokens()
        return {"id": t.id, "name": t.name, "revoked": t.revoked}

    # ------------------------------------------------------------------ configuration objects
    def _parse_set(items: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Document]]:
        """Every manifest of a set validated, duplicates refused: all located errors at once."""
        docs: list[tuple[dict[str, Any], Document]] = []
        errors: list[str] = []
        seen: dict[tuple[str, str], int] = {}
        for i, m in enumerate(items):
            try:
                d = parse_manifest(m, f"items[{i}]")
            except ManifestError as exc:
                errors.extend(exc.errors)
                continue
            first = seen.setdefault((d.kind, d.name), i)
            if first != i:
                errors.append(
                    f"{d.source}: metadata.name: duplicate {d.kind} {d.name!r} (first at items[{first}])"
                )
            docs.append(({k: v for k, v in m.items() if k != "status"}, d))
        if errors:
            raise ManifestError(errors)
        return docs

    def _check_config(svc: Service, p: Principal, docs: list[tuple[dict[str, Any], Document]]) -> ConfigView:
        """Authorize each change (a queue move where it is and where it goes) and build the
        configuration the set would leave, which must be valid as a whole."""
        for m, d in docs:
            svc.check(p, Action.UPDATE, _config_resource(d.kind, d.name, m, svc))
            if d.kind == "Queue" and d.name in svc.controller.parents:
                # moving a queue needs authority where it is now, not only where it goes
                svc.check(p, Action.UPDATE, _config_resource(d.kind, d.name, None, svc))
        current = {(r.kind, r.name): object_manifest(r) for r in svc.store.list_objects()}
        for m, d in docs:
            current[(d.kind, d.name)] = without_server_metadata(m)
        return ConfigView(bundle_from_manifests(current.values(), skip_invalid=True))

    def _check_workloads(
        svc: Service, p: Principal, docs: list[tuple[dict[str, Any], Document]], view: ConfigView | None
    ) -> list[_Prepared]:
        """Each workload checked against the configuration the set leaves, and against the
        stored workloads (a name taken with another manifest); raises with every problem."""
        preps: list[_Prepared] = []
        errors: list[str] = []
        conflicts: list[dict[str, str]] = []
        for m, d in docs:
            try:
                prep = _prepare(svc, p, m, view)
            except Denied as den:
                svc.store.append_audit(den.entry)
                raise
            except ManifestError as exc:
                errors.extend(exc.errors)
                continue
            except ApiError as exc:
                errors.extend(f"{d.source}: {e['field']}: {e['problem']}" for e in exc.errors)
                continue
            clash = _name_clash(svc, p, prep)
            if clash:
                conflicts.append({"field": f"{d.source}: metadata.name", "problem": clash})
            preps.append(prep)
        if errors:
            raise ManifestError(errors)
        if conflicts:
            raise ApiError(409, f"{len(conflicts)} workload name(s) taken; nothing was applied", conflicts)
        return preps

    def _name_clash(svc: Service, p: Principal, prep: _Prepared) -> str | None:
        try:
            rec = svc.store.get_workload(prep.model.name)
        except NotFound:
            return None
        if rec.owner == p.name and canonical_json(rec.manifest) == canonical_json(prep.body):
            return None
        return (
            f"workload {rec.name!r} already exists with a different manifest or owner; "
            "a resubmission must repeat the original exactly, otherwise choose another name"
        )

    def _apply_set(svc: Service, p: Principal, items: list[dict[str, Any]]) -> list[dict[str, str]]:
        """Apply a set whole or not at all: everything is validated and authorized against the
        configuration the set leaves before anything is written; configuration objects are then
        written in one transaction, and the workloads submitted. Only a race lost after the
        checks (a name taken meanwhile) can fail a workload alone; its result says so."""
        docs = _parse_set(items)
        config = [(m, d) for m, d in docs if d.kind != "Workload"]
        workloads = [(m, d) for m, d in docs if d.kind == "Workload"]
        ctl = svc.controller
        results: list[dict[str, str]] = []
        with ctl.lock:
            view = _check_config(svc, p, config) if config else None
            preps = _check_workloads(svc, p, workloads, view)
            if config:
                done = svc.store.apply_objects(
                    [
                        (
                            without_server_metadata(m),
                            AuditEntry(p.name, f"{CONFIG_ACTIONS[d.kind]}.apply", d.kind, d.name),
                            resource_version(m),  # sent back from a GET: 409 if stale
                        )
                        for m, d in config
                    ]
                )
                results = [{"kind": r.kind, "name": r.name, "result": outcome} for r, outcome in done]
                if any(r["result"] != "unchanged" for r in results):
                    ctl.reload_config()
        for prep in preps:
            results.append(_submit_prepared(svc, p, prep))
        return results

    def _submit_prepared(svc: Service, p: Principal, prep: _Prepared) -> dict[str, str]:
        phase = "AwaitingApproval" if prep.approval else "Pending"
        try:
            rec, created = svc.batcher.submit(prep.body, owner=p.name, phase=phase, audit=prep.audit).result()
        except StoreError as exc:
            return {"kind": "Workload", "name": prep.model.name, "result": "failed", "error": str(exc)}
        _after(svc, prep, rec, created)
        return {"kind": "Workload", "name": rec.name, "result": "created" if created else "unchanged"}

    @app.post("/v1/apply", tags=["config"], **doc(oa.ApplyResults, *BODY, 404))
    def apply(body: ApplyRequest, p: Caller, svc: Svc) -> dict[str, Any]:
        """kubectl-apply a set of manifests, whole or not at all: every object is validated and
        authorized against the configuration the set leaves (a new Queue and a Workload in it may
        come together) before anything is written; then configuration objects are written in one
        transaction and the workloads submitted (idempotent by name)."""
        return {"results": _apply_set(svc, p, body.items)}

    def _kind(plural: str) -> str:
        kind = PLURALS.get(plural)
        if kind is None:
            raise ApiError(
                404,
                f"unknown resource type {plural!r}; one of {', '.join(PLURALS)}",
                [{"field": "kind", "problem": "unknown"}],
            )
        return kind

    @app.get("/v1/config/{plural}", tags=["config"], **doc(oa.ConfigList, *READ, 422))
    def list_objects(plural: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """List pools, queues, priorityclasses or clusters (every role may read configuration)."""
        kind = _kind(plural)
        items = [r.to_manifest() for r in svc.store.list_objects(kind)]
        if kind == "PriorityClass":
            stored = {i["metadata"]["name"] for i in items}
            for pc in svc.controller.bundle.priority_classes:
                if pc.name not in stored:
                    items.append(
                        {
                            "apiVersion": "gpupool.io/v1alpha1",
                            "kind": "PriorityClass",
                            "metadata": {"name": pc.name, "annotations": {"gpupool.io/builtin": "true"}},
                            "spec": {
                                "value": pc.value,
                                "preemptible": pc.preemptible,
                                "description": pc.description,
                            },
                        }
                    )
        return {"kind": kind, "items": items}

    @app.get("/v1/config/{plural}/{name}", tags=["config"], **doc(oa.Manifest, *READ, 422))
    def get_object(plural: str, name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """One configuration object."""
        return svc.store.get_object(_kind(plural), name).to_manifest()

    @app.put("/v1/config/{plural}/{name}", tags=["config"], **doc(oa.ApplyResult, *BODY, 404))
    def put_object(
        plural: str, name: str, p: Caller, svc: Svc, manifest: dict[str, Any] = Body(...)
    ) -> dict[str, Any]:
        """Create or update one object (the manifest's kind and name must match the path)."""
        kind = _kind(plural)
        raw_meta = manifest.get("metadata")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        if manifest.get("kind") != kind or meta.get("name") != name:
            raise ApiError(
                422,
                f"the manifest must be a {kind} named {name!r}",
                [{"field": "kind/metadata.name", "problem": "does not match the URL"}],
            )
        return _apply_set(svc, p, [manifest])[0]

    @app.delete("/v1/config/{plural}/{name}", tags=["config"], **doc(oa.Deleted, *WRITE, 404))
    def delete_object(plural: str, name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """Delete an object; refused (409) while anything refers to it."""
        kind = _kind(plural)
        svc.check(p, Action.DELETE, _config_resource(kind, name, None, svc))
        ctl = svc.controller
        with ctl.lock:
            rec: ObjectRecord = svc.store.get_object(kind, name)
            if kind == "Queue":
                live = svc.store.list_workloads(
                    queues=[name],
                    phases=["Pending", "AwaitingApproval", "Admitted", "Running", "Preempted"],
                    limit=1,
                )
                if live:
                    raise ApiError(
                        409,
                        f"queue {name!r} still has workloads (e.g. {live[0].name}); cancel or finish them first",
                        [{"field": "metadata.name", "problem": "queue in use"}],
                    )
            if kind == "ResourcePool":
                used = [r.name for r in ctl.engine.running.values() if r.admission.pool == name]
                if used:
                    raise ApiError(
                        409,
                        f"pool {name!r} still runs workloads (e.g. {used[0]})",
                        [{"field": "metadata.name", "problem": "pool in use"}],
                    )
            rest = [object_manifest(r) for r in svc.store.list_objects() if (r.kind, r.name) != (kind, name)]
            try:
                bundle_from_manifests(rest, skip_invalid=True)
            except ManifestError as exc:
                raise ApiError(
                    409, f"{kind} {name!r} is still referenced; nothing was deleted", error_items(exc)
                ) from exc
            svc.store.delete_object(
                kind, name, audit=AuditEntry(p.name, f"{CONFIG_ACTIONS[kind]}.delete", kind, name)
            )
            ctl.reload_config()
            svc.forget_tokens()  # tokens scoped to a deleted queue were revoked with it
        return {"kind": kind, "name": name, "result": "deleted", "resourceVersion": rec.resource_version}

    # ------------------------------------------------------------------ workloads
    def _prepare(
        svc: Service, p: Principal, body: Mapping[str, Any], view: ConfigView | None = None
    ) -> _Prepared:
        """Validate and authorize a submission from memory only (safe on the event loop);
        against ``view`` (a configuration about to be applied) instead of the one in force."""
        doc = parse_manifest(body)
        if doc.kind != "Workload":
            raise ApiError(
                422,
                f"kind: expected Workload, got {doc.kind}",
                [{"field": "kind", "problem": "must be Workload"}],
            )
        body = normalise_workload(body)
        ctl: Controller | ConfigView = view or svc.controller
        bundle = ctl.bundle
        model = workload_model(body, bundle.priority_classes, 0.0, doc=doc)
        queue = model.queue
        refused = queue_refusal(queue, ctl)
        if refused is None:
            svc.check(
                p,
                Action.SUBMIT,
                Resource("Workload", doc.name, queue=queue, owner=p.name),
                defer=True,
                tree=ctl,
            )
            refused = request_refusal(model, body, ctl)
        if refused is not None:
            raise _refused(refused)
        exception = is_exception(body)
        approval = needs_approval(model, body, bundle, ctl)
        audit = AuditEntry(
            p.name,
            "workload.submit",
            "Workload",
            doc.name,
            {"queue": queue, "approval": approval, "exception": exception},
        )
        return _Prepared(dict(body), model, queue, approval, audit)

    def _after(svc: Service, prep: _Prepared, rec: WorkloadRecord, created: bool) -> WorkloadRecord:
        """Hand a committed submission to the controller (or open its approval request)."""
        if not created:
            return rec
        svc.metrics.submits.labels(prep.queue).inc()
        if prep.approval:
            # the workload is committed: a failure to open its request must not answer 500 for
            # an accepted submission; it is rejected with the reason instead (never left waiting)
            with svc.controller.lock:
                svc.controller.open_approval(rec, time.time())
            return svc.store.get_workload(rec.name)
        svc.controller.submitted(rec, prep.model)
        return rec

    def _submit(svc: Service, p: Principal, body: Mapping[str, Any]) -> tuple[WorkloadRecord, bool]:
        try:
            prep = _prepare(svc, p, body)
        except Denied as d:
            svc.store.append_audit(d.entry)
            raise
        phase = "AwaitingApproval" if prep.approval else "Pending"
        rec, created = svc.batcher.submit(prep.body, owner=p.name, phase=phase, audit=prep.audit).result()
        return _after(svc, prep, rec, created), created

    @app.post(
        "/v1/workloads",
        tags=["workloads"],
        status_code=201,
        response_model=None,
        responses={
            **doc(oa.WorkloadView, *BODY, status=201, description="created")["responses"],
            200: {"model": oa.WorkloadView, "description": "already submitted, unchanged"},
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object", "title": "Workload manifest"}}},
            }
        },
    )
    async def submit(request: Request) -> Response:
        """Submit a Workload manifest; idempotent by name (200 with the existing workload).

        Acknowledged only once durable: concurrent submits share one commit (group commit).
        The hot path: it reads the token and the body itself instead of through FastAPI's
        dependency and body models, which cost as much CPU as the rest of the request."""
        svc: Service = request.app.state.svc
        p = await _principal(request)
        parsed = request.scope.get(PARSED_KEY)  # the guard parsed it already
        manifest = parsed if isinstance(parsed, dict) else _json_object(await request.body())
        try:
            prep = _prepare(svc, p, manifest)
        except Denied as d:
            await run_in_threadpool(svc.store.append_audit, d.entry)
            raise
        phase = "AwaitingApproval" if prep.approval else "Pending"
        fut = svc.batcher.submit(prep.body, owner=p.name, phase=phase, audit=prep.audit)
        rec, created = await asyncio.wrap_future(fut)
        if created and prep.approval:
            rec = await run_in_threadpool(_after, svc, prep, rec, created)
        else:
            rec = _after(svc, prep, rec, created)
        # serialised directly: the view is plain JSON already
        body = json.dumps(workload_view(rec), separators=(",", ":"))
        return Response(body, status_code=201 if created else 200, media_type="application/json")

    @app.get("/v1/workloads", tags=["workloads"], **doc(oa.WorkloadList, *AUTH, 422))
    def list_workloads(
        p: Caller,
        svc: Svc,
        queue: str | None = None,
        phase: Annotated[list[str] | None, Query()] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        after: Annotated[int, Query(ge=0, le=MAX_ID, description="seq to page after")] = 0,
    ) -> dict[str, Any]:
        """Workloads the caller may see, in arrival order."""
        visible = svc.visible_queues(p)
        queues = visible
        if queue is not None:
            queues = [queue] if visible is None or queue in visible else []
        recs = svc.store.list_workloads(queues=queues, phases=phase, after_seq=after, limit=limit)
        return {"items": [workload_view(r) for r in recs]}

    @app.get("/v1/workloads/{name}", tags=["workloads"], **doc(oa.WorkloadView, *READ, 422))
    def get_workload(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """One workload (404 when it is not visible to the caller), with its attempts and failures."""
        rec = svc.visible_workload(p, name)
        return {**workload_view(rec), **history_view(svc.store.list_events(name))}

    def _cancel(name: str, p: Principal, svc: Service) -> dict[str, Any]:
        rec = svc.visible_workload(p, name)
        svc.check(p, Action.CANCEL, Resource("Workload", name, queue=rec.queue, owner=rec.owner))
        return workload_view(svc.controller.cancel(name, p.name))

    @app.post("/v1/workloads/{name}/cancel", tags=["workloads"], **doc(oa.WorkloadView, *WRITE, 404))
    def cancel(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """Cancel (idempotent: a finished workload is returned as it is)."""
        return _cancel(name, p, svc)

    @app.delete("/v1/workloads/{name}", tags=["workloads"], **doc(oa.WorkloadView, *WRITE, 404))
    def delete_workload(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """Same as cancel: workloads are kept for the record."""
        return _cancel(name, p, svc)

    @app.get("/v1/workloads/{name}/events", tags=["workloads"], **doc(oa.EventList, *READ, 422))
    def events(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """The workload's event stream, oldest first."""
        svc.visible_workload(p, name)
        return {
            "items": [
                {"type": e.type, "reason": e.reason, "message": e.message, "at": e.at.isoformat()}
                for e in svc.store.list_events(name)
            ]
        }

    @app.get("/v1/workloads/{name}/explain", tags=["workloads"], **doc(oa.Explanation, *READ, 422))
    def explain(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """Position in its queue and the engine's reason it waits."""
        rec = svc.visible_workload(p, name)
        out = svc.controller.explain(rec)
        if rec.phase == "AwaitingApproval":
            out["approvals"] = [
                {"id": a.id, "state": a.state, "reason": a.reason, "expiresAt": a.expires_at.isoformat()}
                for a in svc.store.list_approvals(workload=name)
            ]
        return out

    # ------------------------------------------------------------------ approvals
    def _decide(
        name: str, p: Principal, svc: Service, approve: bool, reason: str, until: float | None
    ) -> dict[str, Any]:
        rec = svc.visible_workload(p, name)
        svc.check(p, Action.APPROVE, Resource("Workload", name, queue=rec.queue, owner=rec.owner))
        pending = svc.store.list_approvals(state="Pending", workload=name)
        if not pending:
            raise ApiError(
                409,
                f"workload {name!r} has no pending approval (phase {rec.phase})",
                [{"field": "name", "problem": "nothing to approve"}],
            )
        exc = is_exception(rec.manifest)
        if until is not None and not exc:
            raise ApiError(
                422,
                "until/duration only apply to exception requests (spec.exception)",
                [{"field": "until", "problem": "not an exception request"}],
            )
        if approve and exc and until is None:
            until = time.time() + (exception_duration_s(rec.manifest) or 3600.0)
        if until is not None and until <= time.time():
            raise ApiError(
                422, "until: must be in the future", [{"field": "until", "problem": "in the past"}]
            )
        detail: dict[str, Any] = {"approval": pending[0].id, "reason": reason}
        if until is not None:
            detail["until"] = datetime.fromtimestamp(until, UTC).isoformat()
        a = svc.store.decide_approval(
            pending[0].id,
            approver=p.name,
            approve=approve,
            reason=reason,
            audit=AuditEntry(
                p.name, "workload.approve" if approve else "workload.reject", "Workload", name, detail
            ),
        )
        if approve and exc and until is not None:
            svc.controller.grant_exception(name, until)
        svc.controller.resync()
        out = workload_view(svc.store.get_workload(name))
        out["approval"] = {
            "id": a.id,
            "state": a.state,
            "approver": a.approver,
            "reason": a.reason,
            "until": detail.get("until"),
        }
        return out

    @app.post("/v1/workloads/{name}/approve", tags=["approvals"], **doc(oa.WorkloadView, *BODY, 404))
    def approve(name: str, p: Caller, svc: Svc, body: ApproveRequest | None = None) -> dict[str, Any]:
        """Approve a workload waiting for approval; for an exception, optionally until a time."""
        body = body or ApproveRequest()
        until = body.until.timestamp() if body.until is not None else None
        if body.duration is not None:
            try:
                until = time.time() + parse_duration(body.duration)
            except QuantityError as exc:
                raise ApiError(422, f"duration: {exc}", [{"field": "duration", "problem": str(exc)}]) from exc
        return _decide(name, p, svc, True, body.reason, until)

    @app.post("/v1/workloads/{name}/reject", tags=["approvals"], **doc(oa.WorkloadView, *BODY, 404))
    def reject(name: str, body: RejectRequest, p: Caller, svc: Svc) -> dict[str, Any]:
        """Reject a workload waiting for approval, with a reason."""
        return _decide(name, p, svc, False, body.reason, None)

    @app.get("/v1/approvals", tags=["approvals"], **doc(oa.ApprovalList, *AUTH, 422))
    def approvals(
        p: Caller, svc: Svc, state: Literal["Pending", "Approved", "Rejected", "Expired"] | None = None
    ) -> dict[str, Any]:
        """Approval requests for workloads the caller may see."""
        out = []
        for a in svc.store.list_approvals(state=state):
            try:
                rec = svc.store.get_workload(a.workload)
            except NotFound:
                continue
            if svc.can_read_workload(p, rec.queue):
                out.append(
                    {
                        "id": a.id,
                        "workload": a.workload,
                        "queue": rec.queue,
                        "state": a.state,
                        "requestedBy": a.requested_by,
                        "approver": a.approver,
                        "reason": a.reason,
                        "requestedAt": a.requested_at.isoformat(),
                        "expiresAt": a.expires_at.isoformat(),
                    }
                )
        return {"items": out}

    # ------------------------------------------------------------------ cluster views
    def _device_map(svc: Service, p: Principal) -> dict[str, dict[int, list[dict[str, Any]]]]:
        devs: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
        for r in svc.controller.running_view().values():
            shown = r.name if svc.can_read_workload(p, r.workload.queue) else "(another team)"
            for pod in r.admission.pods:
                for d in pod.devices:
                    devs[pod.node][d].append({"workload": shown, "gpuMilli": pod.gpu_milli})
        return devs

    def _node_view(
        svc: Service, p: Principal, devs: dict[str, dict[int, list[dict[str, Any]]]], full: bool
    ) -> list[dict[str, Any]]:
        ctl = svc.controller
        pools = ctl.bundle.pools
        out = []
        for n in ctl.nodes():
            used = devs.get(n.name, {})
            alloc = sum(a["gpuMilli"] for lst in used.values() for a in lst)
            v: dict[str, Any] = {
                "name": n.name,
                "gpuModel": n.gpu_model,
                "gpus": n.gpu_count,
                "gpuAllocated": alloc / 1000,
                "pool": next((pl.name for pl in pools if pl.selects(n)), None),
                "schedulable": n.schedulable,
                "health": node_health(ctl.faults, n.name),
                "rack": n.rack,
                "nvlinkDomain": n.nvlink_domain,
            }
            if full:
                v["devices"] = [
                    {
                        "index": i,
                        "allocatedMilli": sum(a["gpuMilli"] for a in used.get(i, [])),
                        "workloads": used.get(i, []),
                        **device_health(ctl.faults, n.name, i),
                    }
                    for i in range(n.gpu_count)
                ]
            out.append(v)
        return out

    @app.get("/v1/nodes", tags=["cluster"], **doc(oa.NodeList, *AUTH))
    def nodes(p: Caller, svc: Svc) -> dict[str, Any]:
        """Nodes with their GPU allocation."""
        return {"items": _node_view(svc, p, _device_map(svc, p), False)}

    @app.get("/v1/nodes/{name}", tags=["cluster"], **doc(oa.NodeView, *READ, 422))
    def node(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """One node and each of its devices (workloads of other teams are not named)."""
        for v in _node_view(svc, p, _device_map(svc, p), True):
            if v["name"] == name:
                return v
        raise ApiError(404, f"node {name!r} not found", [{"field": "name", "problem": "no such node"}])

    def _set_cordon(name: str, cordon: bool, p: Principal, svc: Service) -> dict[str, Any]:
        ctl = svc.controller
        if name not in {n.name for n in ctl.nodes()}:
            raise ApiError(404, f"node {name!r} not found", [{"field": "name", "problem": "no such node"}])
        svc.check(p, Action.UPDATE, Resource("Cluster", name))
        with ctl.lock:
            for rec in svc.store.list_objects("Cluster"):
                m = object_manifest(rec)
                nodes_here = {n.name for n in bundle_from_manifests([m]).nodes}
                if name not in nodes_here:
                    continue
                ann = dict(m["metadata"].get("annotations") or {})
                cur = {x for x in ann.get(CORDON_ANNOTATION, "").split(",") if x}
                cur = cur | {name} if cordon else cur - {name}
                if cur:
                    ann[CORDON_ANNOTATION] = ",".join(sorted(cur))
                else:
                    ann.pop(CORDON_ANNOTATION, None)
                m["metadata"]["annotations"] = ann
                svc.store.apply_object(
                    m, audit=AuditEntry(p.name, "node.cordon" if cordon else "node.uncordon", "Node", name)
                )
                ctl.reload_config()
                return {"name": name, "schedulable": not cordon}
        raise ApiError(
            404,
            f"node {name!r} is not defined by any Cluster object",
            [{"field": "name", "problem": "no such node"}],
        )

    @app.post("/v1/nodes/{name}/cordon", tags=["cluster"], **doc(oa.Cordoned, *WRITE, 404))
    def cordon(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """Stop placing new work on a node (platform-admin); a node change event."""
        return _set_cordon(name, True, p, svc)

    @app.post("/v1/nodes/{name}/uncordon", tags=["cluster"], **doc(oa.Cordoned, *WRITE, 404))
    def uncordon(name: str, p: Caller, svc: Svc) -> dict[str, Any]:
        """Allow new work on a node again (platform-admin)."""
        return _set_cordon(name, False, p, svc)

    from gpupool.service.fault_routes import add_routes as add_fault_routes

    add_fault_routes(app, _set_cordon)  # drain, device health

    @app.get("/v1/cluster", tags=["cluster"], **doc(oa.ClusterView, *AUTH))
    def cluster(p: Caller, svc: Svc) -> dict[str, Any]:
        """Pools with capacity and allocation, and the controller's state."""
        ctl = svc.controller
        with ctl.lock:
            pools = []
            for pool in ctl.bundle.pools:
                cap = ctl.engine.quota.capacity.get(pool.name, (0, 0, 0))
                pools.append(
                    {
                        "name": pool.name,
                        "gpus": cap[0] / 1000,
                        "gpuAllocated": ctl.engine.cluster.used_gpu_milli(pool.name) / 1000,
                        "nodes": sum(1 for n in ctl.bundle.nodes if pool.selects(n)),
                        "preemptible": pool.preemptible,
                        "requiresApproval": pool.requires_approval,
                        "pricePerGPUHour": pool.price_per_gpu_hour,
                    }
                )
            return {
                "nodes": len(ctl.bundle.nodes),
                "gpus": sum(n.gpu_count for n in ctl.bundle.nodes),
                "pools": pools,
                "pending": len(ctl.pending),
                "running": len(ctl.engine.running),
                "cycles": ctl.cycles,
                "backend": svc.backend.health().detail,
            }

    @app.get("/v1/quota", tags=["cluster"], **doc(oa.QuotaList, *AUTH, 422))
    def quota(p: Caller, svc: Svc, queue: str | None = None, pool: str | None = None) -> dict[str, Any]:
        """Quota per queue and pool: guarantee, limit (guarantee + borrowing), in use."""
        ctl = svc.controller
        visible = svc.visible_queues(p)
        with ctl.lock:
            q = ctl.engine.quota
            items = []
            for qn in q.queues:
                if queue is not None and qn != queue:
                    continue
                if visible is not None and qn not in visible:
                    continue
                for pl in q.pools:
                    if pool is not None and pl != pool:
                        continue
                    key = (qn, pl)
                    if not q.usable.get(key):
                        continue
                    items.append(
                        {
                            "queue": qn,
                            "pool": pl,
                            "parent": q.queues[qn].parent,
                            "guarantee": _vec(q.G[key]),
                            "limit": _vec(q.limit[key]),
                            "used": _vec(q.U[key]),
                        }
                    )
            return {"items": items}

    # ------------------------------------------------------------------ audit
    @app.get("/v1/audit/verify", tags=["audit"], **doc(oa.AuditVerify, *AUTH, 403, 422))
    def audit_verify(
        p: Caller,
        svc: Svc,
        expected_count: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
        expected_head: Annotated[str | None, Query(max_length=128)] = None,
        checkpoint_count: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
        checkpoint_head: Annotated[str | None, Query(max_length=128)] = None,
    ) -> dict[str, Any]:
        """Verify the hash chain; names the first bad record (platform-admin). With a checkpoint
        (count and head hash taken earlier, see ``gpupool audit checkpoint``) the record at that
        count must still carry that hash, however many records came after."""
        svc.check(p, Action.READ_AUDIT, Resource("Audit"), mutating=False)
        cp = None
        if checkpoint_count is not None and checkpoint_head is not None:
            cp = (checkpoint_count, checkpoint_head)
        r = svc.store.verify_audit(expected_count=expected_count, expected_head=expected_head, checkpoint=cp)
        return {
            "ok": r.ok,
            "count": r.count,
            "headHash": r.head_hash,
            "firstBadSeq": r.first_bad_seq,
            "problem": r.problem,
        }

    @app.get(
        "/v1/audit/export",
        tags=["audit"],
        response_class=Response,
        responses={200: {"content": oa.AUDIT_EXPORT_CONTENT}, **doc(None, *AUTH, 403, 422)["responses"]},
    )
    def audit_export(p: Caller, svc: Svc, format: Literal["jsonl", "csv"] = "jsonl") -> Response:
        """The audit log as JSONL or CSV (platform-admin)."""
        svc.check(p, Action.READ_AUDIT, Resource("Audit"), mutating=False)
        buf = io.StringIO()
        svc.store.export_audit(format, buf)
        media = "application/x-ndjson" if format == "jsonl" else "text/csv"
        return Response(buf.getvalue(), media_type=media)

    @app.get("/v1/audit", tags=["audit"], **doc(oa.AuditList, *AUTH, 403, 422))
    def audit_list(
        p: Caller,
        svc: Svc,
        after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> dict[str, Any]:
        """Audit records after a seq (platform-admin)."""
        svc.check(p, Action.READ_AUDIT, Resource("Audit"), mutating=False)
        return {"items": [r.to_dict() for r in svc.store.audit_records(after_seq=after, limit=limit)]}


__all__ = ["TERMINAL_PHASES", "ApiError", "Service", "create_app", "workload_view"]
