"""One writer only: leader election between ``gpupool serve`` replicas sharing one store.

Why: two replicas that both schedule hand the same GPUs to two workloads. Exactly one process
may decide and act, the holder of the leader lease (a row in the store, gpupool.store.lease):

* the **lease keeper** (a thread) renews the lease every ``renew_s`` while it leads; a standby
  tries to take it every ``retry_s`` and gets it once it expired (``ttl_s`` after the leader's
  last renewal) or at once when it was released (clean stop) or its holder is a dead process
  on this host (kill -9, then a restart or a standby on the same machine);
* every takeover increments the **fencing token** (epoch). The controller writes through
  ``store.fenced(epoch)``, so each decision transaction checks, inside itself, that the lease
  still carries its epoch: a deposed leader (paused past its lease, then resumed) cannot
  commit a decision, gets ``NotLeader`` and steps down;
* the controller runs (``recover``, then cycles) only while the lease is held, and its backend
  refuses to act once the lease's local deadline has passed (``ttl_s - SKEW_S`` after the last
  renewal began), so a resumed leader stops before it touches the cluster;
* a standby answers reads from the store (its view of nodes and queues is reloaded every
  ``VIEW_S``), refuses writes with 503 naming the leader (``StandbyGuard``) and reports
  ``standby`` on ``/readyz``.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gpupool.model import Node
from gpupool.service.backends import Backend, BackendHealth, Capability, RunSpec, RunState, capability
from gpupool.store import NotLeader, Store

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gpupool.service.api import Service
    from gpupool.service.controller import Controller

log = logging.getLogger("gpupool.leader")

#: a leader stops acting this long before its lease could expire in the store (clock skew, the
#: time a renewal takes to reach the database)
SKEW_S = 1.0
#: how often a standby reloads its read view (configuration, placements) from the store
VIEW_S = 5.0
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: POST endpoints under /v1/ that change nothing (a standby serves them); none today
READ_ONLY_POSTS: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Lease timing; defaults take over within ttl + retry = 9 s of a leader's death."""

    ttl_s: float = 8.0
    renew_s: float = 2.0
    retry_s: float = 1.0
    #: take over at once from a holder that is a dead process on this host
    reclaim_local: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.renew_s < self.ttl_s - SKEW_S:
            raise ValueError(f"lease renew interval must be > 0 and < ttl - {SKEW_S:g}s")
        if self.retry_s <= 0:
            raise ValueError("lease retry interval must be > 0")


def _pid_namespace() -> str:
    """This process's PID namespace (Linux): containers sharing a host name do not share PIDs."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def holder_id() -> str:
    """``host:pidns:pid:nonce``: unique per process, and says where to look whether it is alive."""
    return f"{socket.gethostname()}:{_pid_namespace()}:{os.getpid()}:{secrets.token_hex(4)}"


def dead_here(holder: str) -> bool:
    """Is ``holder`` a process of this host (and PID namespace) that no longer exists?

    False when unsure: another host, another container, or a process of another user."""
    parts = holder.rsplit(":", 3)
    if len(parts) != 4 or (parts[0], parts[1]) != (socket.gethostname(), _pid_namespace()):
        return False
    if not parts[2].isdigit():
        return False
    pid = int(parts[2])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists under another user
        return False
    return False


class GuardedBackend:
    """The controller's backend: refuses to act (NotLeader) unless this process may act as leader.

    Why: the store's fence stops a deposed leader's writes, but the cluster is outside the
    store; a leader resumed after a pause must not start, stop or poll runs either.
    Reads (``runs``, ``health``) and ``set_nodes`` pass; ``shrink`` and ``move`` are checked like
    ``stop``; other attributes (the optional read-only capabilities) are the inner backend's.
    """

    def __init__(self, inner: Backend, may_act: Callable[[], bool]) -> None:
        self.inner = inner
        self.name = inner.name
        self._may_act = may_act

    def _check(self) -> None:
        if not self._may_act():
            raise NotLeader("this process does not hold the leader lease; it must not act on the backend")

    def set_nodes(self, nodes: Sequence[Node]) -> None:
        self.inner.set_nodes(nodes)

    def start(self, runs: Sequence[RunSpec]) -> None:
        self._check()
        self.inner.start(runs)

    def stop(self, names: Sequence[str]) -> None:
        self._check()
        self.inner.stop(names)

    def poll(self, now: float) -> list[RunState]:
        self._check()
        return self.inner.poll(now)

    def forget(self, names: Sequence[str]) -> None:
        self._check()
        self.inner.forget(names)

    def shrink(self, name: str, placement: Any, message: str = "") -> None:
        """An elastic gang losing pods acts on the cluster like a stop: only the leader may."""
        self._check()
        self.inner.shrink(name, placement, message)  # type: ignore[attr-defined]

    def move(self, run: RunSpec, message: str = "") -> bool:
        """A consolidation move stops pods and starts them elsewhere: only the leader may."""
        self._check()
        return bool(self.inner.move(run, message))  # type: ignore[attr-defined]

    def runs(self) -> dict[str, RunState]:
        return self.inner.runs()

    def health(self) -> BackendHealth:
        return self.inner.health()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


class LeaderElector:
    """Holds (or waits for) the leader lease and runs the controller only while it is held."""

    def __init__(
        self,
        store: Store,
        controller: Controller,
        *,
        url: str,
        settings: LeaseSettings | None = None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.store = store
        self.controller = controller
        self.url = url
        self.settings = settings or LeaseSettings()
        self.on_change = on_change or (lambda leading: None)
        self.holder = holder_id()
        self.backend = controller.backend
        #: a second lease the backend requires (the Kubernetes Lease, gpupool.kube.runtime.lease): this
        #: replica leads only while it holds both (``Capability.LEADER_GATE``)
        self.gate: Callable[[], bool] | None = capability(self.backend, Capability.LEADER_GATE)
        controller.backend = GuardedBackend(self.backend, self.may_act)
        self._mu = threading.Lock()
        self._leading = False
        self._running = False  # the controller loop was started for the current term
        self._gen = 0  # incremented on every change of role: a stale activation gives up
        self.epoch = 0
        self._deadline = 0.0
        self._next_renew = 0.0
        self._next_view = 0.0
        #: the leader as last seen in the store (this process's URL while it leads)
        self.leader_url = ""
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ state
    def may_act(self) -> bool:
        """Leading, and the lease cannot have expired in the store yet (by the local clock)."""
        return self._leading and time.monotonic() < self._deadline and (self.gate is None or self.gate())

    @property
    def is_leader(self) -> bool:
        return self.may_act()

    def describe(self) -> dict[str, Any]:
        """Role, leader URL and epoch, for /readyz."""
        leading = self.is_leader
        return {
            "role": "leader" if leading else "standby",
            "leader": (self.url if leading else self.leader_url) or None,
            "epoch": self.epoch if leading else None,
        }

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Try once now (a lone server leads before it serves), then keep trying in a thread."""
        got = self._try_acquire()
        self._thread = threading.Thread(target=self._run, name="gpupool-lease", daemon=True)
        self._thread.start()
        if got:
            self._activate(self._gen, raise_errors=True)
        else:
            self._standby_view()

    def stop(self) -> None:
        """Stop keeping the lease; a leader stops its controller and releases the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        epoch, leading = self.epoch, self._leading
        self._deactivate("shutting down")
        if leading:
            try:
                self.store.release_lease(self.holder, epoch)
            except Exception:  # the lease then expires by itself
                log.warning("could not release the leader lease", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval()):
            try:
                self.tick()
            except Exception as exc:  # the keeper must survive a database outage
                log.warning("lease keeper: %s", exc, exc_info=True)
                self.last_error = f"{type(exc).__name__}: {exc}"

    def _interval(self) -> float:
        if self._leading:
            return max(0.05, min(0.5, self._next_renew - time.monotonic()))
        return self.settings.retry_s

    def tick(self) -> None:
        """One step of the keeper: renew (leader) or try to take over (standby)."""
        if self._leading:
            if self.gate is not None and not self.gate():
                epoch = self.epoch
                self._deactivate("the backend's own lease (the Kubernetes Lease) is not held")
                self._release(epoch)
            elif self._running and not self.controller.alive:
                self._deactivate("the controller stopped (a fenced write was refused)")
            elif time.monotonic() >= self._next_renew:
                self._renew()
            return
        if self._try_acquire():
            gen = self._gen
            threading.Thread(target=self._activate, args=(gen,), name="gpupool-takeover", daemon=True).start()
        elif time.monotonic() >= self._next_view:
            self._standby_view()

    # ------------------------------------------------------------------ the lease
    def _try_acquire(self) -> bool:
        s = self.settings
        if self.gate is not None and not self.gate():
            return False  # take the store lease only while holding the backend's lease too
        current = self.store.get_lease()
        dead = None
        if s.reclaim_local and current.holder and current.holder != self.holder and dead_here(current.holder):
            dead = current.holder
        held = current.held_at(self.store.clock()) and current.holder != self.holder
        t0 = time.monotonic()
        # a lease plainly held costs no write (on SQLite a write takes the database lock)
        got = (
            None
            if held and dead is None
            else self.store.acquire_lease(self.holder, self.url, s.ttl_s, dead_holder=dead)
        )
        if got is None:
            self.leader_url = current.url if current.holder else ""
            return False
        with self._mu:
            self._leading, self._running = True, False
            self._gen += 1
            self.epoch = got.epoch
            self._deadline = t0 + s.ttl_s - SKEW_S
            self._next_renew = t0 + s.renew_s
            self.leader_url = self.url
        log.warning("leader lease acquired (epoch %d%s)", got.epoch, f", from dead {dead}" if dead else "")
        self.on_change(True)
        return True

    def _renew(self) -> None:
        t0 = time.monotonic()
        try:
            self.store.renew_lease(self.holder, self.epoch, self.settings.ttl_s)
        except NotLeader as exc:
            self._deactivate(exc.problem)
            return
        except Exception as exc:  # the database is unreachable: keep trying until the deadline
            self.last_error = f"renewing the lease: {type(exc).__name__}: {exc}"
            if not self.may_act():
                self._deactivate("the lease could not be renewed before it expired")
            else:
                self._next_renew = time.monotonic() + min(self.settings.retry_s, self.settings.renew_s)
            return
        with self._mu:
            if self._leading:
                self._deadline = t0 + self.settings.ttl_s - SKEW_S
                self._next_renew = t0 + self.settings.renew_s
        self.last_error = ""

    # ------------------------------------------------------------------ the controller
    def _activate(self, gen: int, raise_errors: bool = False) -> None:
        """Gained the lease: fence the controller's writes, reload the cluster, recover, cycle."""
        ctl = self.controller
        try:
            with ctl.lock:
                ctl.store = self.store.fenced(self.epoch, idle_timeout_s=self.settings.ttl_s / 2)
            reload = capability(self.backend, Capability.RELOAD)
            if callable(reload):
                reload()
            ctl.recover()
        except Exception as exc:
            log.warning("taking over failed: %s", exc, exc_info=not isinstance(exc, NotLeader))
            self.last_error = f"taking over: {type(exc).__name__}: {exc}"
            epoch = self.epoch
            self._deactivate("taking over failed")
            if not isinstance(exc, NotLeader):
                self._release(epoch)
            if raise_errors and not isinstance(exc, NotLeader):
                raise
            return
        with self._mu:
            if gen != self._gen or not self.may_act():
                return
            ctl.run_loop()
            self._running = True

    def _release(self, epoch: int) -> None:
        try:
            self.store.release_lease(self.holder, epoch)
        except Exception:
            log.warning("could not release the leader lease", exc_info=True)

    def _deactivate(self, why: str) -> None:
        """Lost (or gave up) the lease: stop cycling at once and become a standby."""
        with self._mu:
            if not self._leading:
                return
            self._leading, self._running = False, False
            self._gen += 1
        self.controller.stop()
        self.controller.ready = False
        self._next_view = 0.0
        log.warning("stepped down as leader (epoch %d): %s", self.epoch, why)
        self.on_change(False)

    def _standby_view(self) -> None:
        self._next_view = time.monotonic() + VIEW_S
        try:
            self.controller.load_view()
        except Exception as exc:
            log.warning("standby could not load its view: %s", exc)


# ---------------------------------------------------------------------- the service
def start_leader(svc: Service) -> LeaderElector:
    """Create the elector for a service, start it (the controller runs while it leads)."""
    cfg = svc.config
    settings = LeaseSettings(cfg.lease_ttl_s, cfg.lease_renew_s, cfg.lease_retry_s, cfg.lease_reclaim_local)
    gauge = svc.metrics.leader
    el = LeaderElector(
        svc.store,
        svc.controller,
        url=cfg.leader_url,
        settings=settings,
        on_change=lambda leading: gauge.set(1 if leading else 0),
    )
    svc.leader = el
    el.start()
    return el


def readiness(el: LeaderElector, problems: list[str], backend: dict[str, Any]) -> JSONResponse:
    """A standby's /readyz: 200 while it can serve reads (the store answers), naming the leader.

    Why 200: a standby is useful, it serves every read; load balancers that route only to
    the leader should look at ``role`` (or send writes anywhere: a standby answers them 503
    with the leader's URL)."""
    body = {"status": "standby", "problems": problems, "backend": backend, **el.describe()}
    return JSONResponse(body, status_code=503 if problems else 200)


def refusal(el: LeaderElector) -> JSONResponse:
    """The 503 a standby answers to a write: the house error format, naming the leader."""
    url = el.leader_url
    msg = (
        f"this replica is a standby; send writes to the leader at {url}"
        if url
        else "this replica is a standby and no leader holds the lease right now; retry shortly"
    )
    body = {
        "error": {
            "status": 503,
            "message": msg,
            "errors": [{"field": "leader", "problem": url or "unknown"}],
        }
    }
    retry = str(max(1, math.ceil(el.settings.retry_s)))
    return JSONResponse(body, status_code=503, headers={"Retry-After": retry})


class StandbyGuard:
    """ASGI middleware: on a standby, writes under /v1/ are refused (503) before any handler runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] not in SAFE_METHODS
            and scope["path"].startswith("/v1/")
            and scope["path"] not in READ_ONLY_POSTS
        ):
            # app.state.svc is set once the app is built (gpupool.service.api); absent before
            svc: Service | None = getattr(getattr(scope.get("app"), "state", None), "svc", None)
            el = svc.leader if svc is not None else None
            if el is not None and not el.is_leader:
                await refusal(el)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install_standby_guard(app: FastAPI) -> None:
    """Refuse writes on a standby (called once from create_app)."""
    app.add_middleware(StandbyGuard)
