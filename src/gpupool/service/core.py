"""The Service: what every use-case, route, loop and backend of one running gpupool shares
(configuration, store, backend, controller, metrics, the submit batcher, the leader lease) and
the caller checks they all make the same way (authenticate, authorize, what a caller may see).

Why it is not in the HTTP layer: the Kubernetes source, the local backend and the CLI's direct
paths act through the same use-cases (gpupool.service.usecases) as the routes do, and a class
they all need must not live in a module that imports FastAPI's routing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpupool import oidc
from gpupool.audit import AuditEntry
from gpupool.auth import Action, Principal, Resource, Role, authorize, parse_bearer
from gpupool.service.backends import Backend
from gpupool.service.batch import SubmitBatcher
from gpupool.service.config import ServiceConfig
from gpupool.service.controller import Controller
from gpupool.service.errors import ApiError, Denied
from gpupool.service.leader import LeaderElector
from gpupool.service.limits import PendingCounter, TokenBuckets, controller_waiting
from gpupool.service.metrics import Metrics
from gpupool.service.readmodel import ControllerReadModel
from gpupool.service.view import ConfigLookups
from gpupool.service.workload_names import scoped_key
from gpupool.store import NotFound, Store, WorkloadRecord

TOKEN_CACHE_S = 5.0


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
        """The workload, or 404 when it does not exist or lies outside the caller's subtree.

        ``name`` is resolved among the workloads the caller can read: the one stored under it,
        else the one the caller's scope stored under its derived key because another scope
        holds the name (gpupool.service.usecases.scoped_names)."""
        rec = self._readable(p, name)
        if rec is None and p.scope is not None:
            rec = self._readable(p, scoped_key(name, p.scope))
        if rec is None:
            where = (
                f" among the workloads visible to {p.role.value} {p.name!r} (queue subtree {p.scope!r})"
                if p.scope
                else ""
            )
            raise ApiError(
                404, f"workload {name!r} not found{where}", [{"field": "name", "problem": "not found"}]
            )
        return rec

    def _readable(self, p: Principal, key: str) -> WorkloadRecord | None:
        try:
            rec = self.store.get_workload(key)
        except NotFound:
            return None
        return rec if self.can_read_workload(p, rec.queue) else None

    def visible_queues(self, p: Principal) -> list[str] | None:
        """None: every queue; else the queues of the caller's subtree."""
        if p.role is Role.PLATFORM_ADMIN or (p.role is Role.VIEWER and p.scope is None):
            return None
        ctl = self.controller
        return [q for q in ctl.parents if p.scope is not None and ctl.is_in_subtree(q, p.scope)]
