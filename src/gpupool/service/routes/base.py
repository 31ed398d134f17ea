"""What every route module shares: the Service the endpoints work with, the ApiError every
refusal becomes, the JSON error handlers, and the Caller/Svc dependencies.

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

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpupool import oidc
from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource, Role, authorize, parse_bearer
from gpupool.manifests import ManifestError
from gpupool.service import openapi as oa
from gpupool.service.admission import (
    Refusal,
)
from gpupool.service.backends import Backend
from gpupool.service.batch import SubmitBatcher
from gpupool.service.config import ServiceConfig
from gpupool.service.controller import Controller
from gpupool.service.convert import (
    error_items,
)
from gpupool.service.leader import LeaderElector
from gpupool.service.limits import PendingCounter, TokenBuckets, controller_waiting
from gpupool.service.metrics import Metrics
from gpupool.service.readmodel import ControllerReadModel
from gpupool.service.view import ConfigLookups
from gpupool.store import NotFound, Store, StoreError, WorkloadRecord

log = logging.getLogger("gpupool.api")

TOKEN_CACHE_S = 5.0
#: the detail of the 400 FastAPI raises when it cannot read a JSON body (see ``install_errors``)
FASTAPI_BODY_ERROR = "There was an error parsing the body"
#: the largest id or sequence number any store column holds (a signed 64-bit integer)
MAX_ID = 2**63 - 1


class ApiError(Exception):
    """An error the client can act on; becomes the JSON error body."""

    def __init__(
        self,
        status: int,
        message: str,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []
        self.headers = headers  # e.g. Retry-After of a 429


class Denied(ApiError):
    """A 403 whose audit record the caller still has to write."""

    def __init__(self, message: str, entry: AuditEntry) -> None:
        super().__init__(403, message)
        self.entry = entry


def _err(
    status: int, message: str, errors: list[dict[str, str]] | None = None, extra: dict[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"status": status, "message": message, "errors": errors or []}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if extra:
        headers = {**(headers or {}), **extra}
    return JSONResponse(body, status_code=status, headers=headers)


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
        #: what the routes show of the controller's state (never ``controller.engine`` directly)
        self.read = ControllerReadModel(self.controller)
        #: single sign-on (gpupool.oidc): ID tokens from the configured issuer; None when off
        self.oidc = oidc.from_env()
        #: fair to everyone (gpupool.service.limits): pending work per queue and user, and the
        #: submit rate per token (None: unlimited)
        lim = self.config.tenant_limits
        ctl = self.controller
        self.pending_limits = PendingCounter(lim.default, controller_waiting(ctl), lambda: ctl.cycles)
        rate = lim.submit_rate
        self.submit_rate = TokenBuckets(rate, lim.submit_burst) if rate else None

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
        p = self._oidc_principal(token) if self.oidc and oidc.looks_like_jwt(token) else None
        p = p or self.store.authenticate(token)
        if p is None:
            raise ApiError(401, "authentication failed: the token is not recognised or has been revoked")
        with self._tlock:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            self._tokens[token] = (now, p)
        return p

    def _oidc_principal(self, token: str) -> Principal:
        """The caller an OIDC ID token names; 401 with the reason it is refused."""
        assert self.oidc is not None
        try:
            return self.oidc.principal(token)
        except oidc.OidcError as exc:
            raise ApiError(401, f"authentication failed: {exc}") from None

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


async def principal(request: Request) -> Principal:
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


Caller = Annotated[Principal, Depends(principal)]
Svc = Annotated[Service, Depends(_svc)]


#: what a request body that is absent or not a JSON object is told, on every route
BODY_MISSING = "the request body must be a JSON object; none was sent"
BODY_NOT_OBJECT = "the request body must be a JSON object"


def body_error(problem: str) -> ApiError:
    """The 422 for a request body that is not a JSON object: located at ``body``."""
    return ApiError(422, f"invalid request: body: {problem}", [{"field": "body", "problem": problem}])


def undecodable(exc: BaseException | None) -> str:
    """What is wrong with a body that could not even be read as JSON text."""
    if isinstance(exc, UnicodeDecodeError):
        return (
            f"{BODY_NOT_OBJECT} in UTF-8; byte 0x{exc.object[exc.start]:02x} at character "
            f"{exc.start} is not UTF-8"
        )
    return f"{BODY_NOT_OBJECT}; it could not be read ({type(exc).__name__ if exc else 'unreadable'})"


def json_object(raw: bytes, content_type: str | None = None) -> dict[str, Any]:
    """A JSON object request body, or the 422 located at ``body`` that every route gives."""
    try:
        value = json.loads(raw) if raw else None
    except UnicodeDecodeError as exc:
        raise body_error(undecodable(exc)) from None
    except ValueError as exc:
        if content_type and "json" not in content_type.lower():  # as FastAPI's routes say it
            raise body_error(_not_object(raw)) from None
        raise body_error(f"invalid JSON at character {getattr(exc, 'pos', 0)}") from None
    if not isinstance(value, dict):
        raise body_error(BODY_MISSING if value is None and not raw else _not_object(value))
    return value


#: pydantic's error types for a body that is absent or not a JSON object at all
_WHOLE_BODY = frozenset({"missing", "dict_type", "model_type", "model_attributes_type"})


def _not_object(value: Any) -> str:
    if isinstance(value, bytes | bytearray):  # not read as JSON: no JSON content type was sent
        return f"{BODY_NOT_OBJECT} sent with content-type application/json"
    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value))
    return f"{BODY_NOT_OBJECT}, not {kind or 'a number'}"


def refusal_error(r: Refusal) -> ApiError:
    return ApiError(r.status, r.message, [{"field": r.field, "problem": r.problem}])


def install_errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return _err(exc.status, exc.message, exc.errors, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        items = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":  # its loc is ("body", offset): the field is the body
                where = e.get("loc", ("body", "?"))[-1]
                items.append({"field": "body", "problem": f"invalid JSON at character {where}"})
                continue
            # the body as a whole is absent or not an object (not a check of the whole model:
            # a model-level validator's own message is kept below)
            if tuple(e.get("loc", ())) == ("body",) and e.get("type") in _WHOLE_BODY:
                missing = e.get("type") == "missing"
                problem = BODY_MISSING if missing else _not_object(e.get("input"))
                items.append({"field": "body", "problem": problem})
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
        if exc.status_code == 400 and exc.detail == FASTAPI_BODY_ERROR:
            # FastAPI's answer when the body is not even JSON text (not UTF-8, say): it named
            # nothing; located at the body like every other body error
            e = body_error(undecodable(exc.__cause__))
            return _err(e.status, e.message, e.errors)
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
