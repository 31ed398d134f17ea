"""``gpupool serve --backend kubernetes``: the same service, with the cluster as its backend.

What is assembled here (and only here, so ``serve`` keeps one small block):

* one connection (``client.KubeApi``: kubeconfig, ``--context``, or the pod's service account);
* the informer caches, the Kubernetes Lease, the backend (``KubernetesBackend``);
* the usual application (``create_app``: store, controller, store lease, API, dashboard);
* after the application started: the source (kubectl objects -> submissions), the status
  writer (reasons on the objects), and a first-bind probe that logs the time from process start
  to the first pod bound (the restart figure of issue 12).

Why the application's lifespan is wrapped rather than changed: the service starts the same way
for every backend; the Kubernetes parts need the cluster before it (the Lease and synced caches,
so the controller's first recovery sees the cluster) and the service after it (the source
submits through it).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.auth import Principal, Role
from gpupool.kube.adapters.source import SYSTEM_NAME, Outcome, SourcePolicy, policy_from_options
from gpupool.kube.outcomes import PodsReadyPolicy, pods_ready_policy
from gpupool.kube.runtime.lease import KubeLease, KubeLeaseSettings
from gpupool.service.errors import ApiError
from gpupool.service.usecases.submit import Prepared, after, prepare
from gpupool.store import TERMINAL_PHASES, NotFound, StoreError
from gpupool.store.schema import PHASES

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gpupool.kube.adapters.backend import KubernetesBackend
    from gpupool.kube.adapters.config_source import ConfigSource
    from gpupool.service.config import ServiceConfig
    from gpupool.service.core import Service

log = logging.getLogger("gpupool.kube.wiring")


@dataclass(frozen=True, slots=True)
class KubeOptions:
    """The ``serve`` options of the Kubernetes backend, checked."""

    kubeconfig: str | None = None
    context: str | None = None
    policy: SourcePolicy = field(default_factory=SourcePolicy)
    lease: KubeLeaseSettings = field(default_factory=KubeLeaseSettings)
    sync_timeout_s: float = 60.0
    pods_ready: PodsReadyPolicy = field(default_factory=PodsReadyPolicy)


#: Kueue's ``waitForPodsReady`` for ``serve``: a duration (``5m``) or ``{enable, timeout}`` as
#: YAML; unset: off (Kueue's default)
PODS_READY_ENV = "GPUPOOL_KUBE_WAIT_FOR_PODS_READY"
#: elastic inference (``gpupool.kube.adapters.elastic``): ``true`` splits a
#: ``gpupool.io/min-replicas`` Deployment or StatefulSet into a guaranteed base and preemptible
#: extras; unset: off
ELASTIC_ENV = "GPUPOOL_KUBE_ELASTIC"
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


def kube_options(
    kubeconfig: Path | None,
    context: str | None,
    namespace_queues: Sequence[str],
    restrict: bool,
    lease_namespace: str | None,
    lease_name: str = "gpupool-scheduler",
    pods_ready: Any = None,
    elastic: bool | None = None,
    reclaim_local: bool = True,
) -> KubeOptions:
    """Check the options; raises ValueError naming the option at fault. ``pods_ready``: the
    ``waitForPodsReady`` setting (a duration or ``{enable, timeout}``); when None, read from
    ``$GPUPOOL_KUBE_WAIT_FOR_PODS_READY`` (YAML), else off. ``elastic``: split
    ``gpupool.io/min-replicas`` objects (elastic inference); when None, ``$GPUPOOL_KUBE_ELASTIC``,
    else off. ``reclaim_local``: take the Kubernetes Lease at once from a dead process on this
    host (``--lease-reclaim-local``, as for the store's lease)."""
    if kubeconfig is not None and not kubeconfig.is_file():
        raise ValueError(f"--kubeconfig {kubeconfig}: no such file")
    policy = replace(policy_from_options(namespace_queues, restrict), elastic=_elastic(elastic))
    if restrict and not policy.allowed:
        raise ValueError("--restrict-namespace-queues needs at least one --namespace-queue NS=QUEUE")
    ns = lease_namespace or _pod_namespace() or "default"
    return KubeOptions(
        str(kubeconfig) if kubeconfig else None,
        context,
        policy,
        KubeLeaseSettings(namespace=ns, name=lease_name, reclaim_local=reclaim_local),
        pods_ready=_pods_ready(pods_ready),
    )


def _elastic(given: bool | None) -> bool:
    """The elastic switch: given, else ``$GPUPOOL_KUBE_ELASTIC`` (true/false, 1/0, yes/no, on/off)."""
    if given is not None:
        return given
    text = os.environ.get(ELASTIC_ENV, "").strip().lower()
    if text not in _TRUE + _FALSE:
        raise ValueError(f"{ELASTIC_ENV}: expected true or false, got {os.environ[ELASTIC_ENV]!r}")
    return text in _TRUE


def _pods_ready(given: Any) -> PodsReadyPolicy:
    where = "waitForPodsReady"
    if given is None and os.environ.get(PODS_READY_ENV, "").strip():
        import yaml

        where = f"{PODS_READY_ENV}: waitForPodsReady"
        try:
            given = yaml.safe_load(os.environ[PODS_READY_ENV])
        except yaml.YAMLError as exc:
            raise ValueError(f"{where}: not YAML: {exc}") from exc
    return pods_ready_policy(given, where)


def kube_runtime(opts: KubeOptions) -> KubeRuntime:
    """The runtime, connecting already; raises ValueError naming what is wrong with the
    kubeconfig (a missing context, no credentials), before anything else is started."""
    rt = KubeRuntime(opts)
    rt.connect()
    return rt


def _pod_namespace() -> str:
    """The namespace this process runs in, when it runs in a pod (the service account's)."""
    try:
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    except OSError:
        return ""


def process_age_s() -> float:
    """Seconds since this process started (from /proc; since import where /proc is absent)."""
    try:
        stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        btime = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return time.time() - (btime + int(stat[19]) / ticks)
    except (OSError, ValueError, IndexError, StopIteration):
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()


class FirstBind:
    """Logs (once) the time from process start to the first pod gpupool binds in this run."""

    def __init__(
        self, workload_key: str = "gpupool.io/workload", leading: Callable[[], bool] = lambda: True
    ) -> None:
        self.key = workload_key
        #: only a bind seen while this replica leads is its own (a standby sees the leader's)
        self.leading = leading
        self.seen_bound: set[tuple[str, str]] = set()
        self.synced = False
        self.seconds: float | None = None

    def mark_synced(self, pods: Sequence[dict[str, Any]]) -> None:
        """Pods bound before this process led are not its binds."""
        for p in pods:
            if (p.get("spec") or {}).get("nodeName"):
                m = p.get("metadata") or {}
                self.seen_bound.add((str(m.get("namespace")), str(m.get("name"))))
        self.synced = True

    def on_pod(self, type_: str, pod: dict[str, Any]) -> None:
        if self.seconds is not None or not self.synced or type_ == "DELETED" or not self.leading():
            return
        m = pod.get("metadata") or {}
        if not (pod.get("spec") or {}).get("nodeName") or self.key not in (m.get("annotations") or {}):
            return
        if (str(m.get("namespace")), str(m.get("name"))) in self.seen_bound:
            return
        self.seconds = process_age_s()
        log.warning(
            "first bind %.2f s after process start (%s/%s)", self.seconds, m.get("namespace"), m.get("name")
        )


class KubeRuntime:
    """Everything of the Kubernetes backend around the service, in start order."""

    def __init__(self, opts: KubeOptions, api: Any = None) -> None:
        from gpupool.kube.adapters.backend import KubernetesBackend
        from gpupool.kube.client import KubeApi, make_client
        from gpupool.kube.runtime.informer import Informers
        from gpupool.kube.runtime.lease import KubeApiLeases

        self.opts = opts
        self.api = api if api is not None else KubeApi(make_client(opts.kubeconfig, opts.context))
        self.informers = Informers(self.api)
        self.lease = KubeLease(KubeApiLeases(self.api), opts.lease)
        # the backend class itself rather than composition.make_backend("kubernetes"), which opens its own
        # connection and caches: here one connection and one set of caches serve the backend,
        # the source, the status writer and the Lease
        backend = KubernetesBackend(self.api, self.informers, pods_ready=opts.pods_ready)
        # only the Lease holder binds or evicts; the store elector reads the same gate
        backend.leader_gate = self.lease.held
        self.backend: KubernetesBackend = backend
        self.first_bind = FirstBind(leading=self.lease.held)
        self.informers.pods.add_listener(self.first_bind.on_pod)
        from gpupool.kube.adapters.source import KubeSource

        # listening before the informers start: no ADDED event is missed
        self.source: Any = KubeSource(self.informers.by_kind, _Late(), _LateEvents(), opts.policy)
        self.source.attach()
        # a new leader adopts what the cluster runs once the source has read every object
        backend.claims_settled = lambda: bool(self.source.caught_up)
        self.writer: Any = None
        self.config_source: ConfigSource | None = None  # started with the service

    def connect(self) -> None:
        """Start listing and watching now (idempotent): ``serve`` calls it before it opens the
        store and builds the application, so the caches fill meanwhile (restart time)."""
        log.warning("kubernetes: connecting, %.2f s after process start", process_age_s())
        self.informers.start()

    # ------------------------------------------------------------------ before the service
    def start_cluster(self) -> None:
        """Informers synced and the Lease tried once, before the controller's first recovery."""
        t0 = time.monotonic()
        self.connect()
        synced = self.informers.wait_synced(self.opts.sync_timeout_s)
        self.first_bind.mark_synced(self.informers.pods.items())
        held = self.lease.start()
        self.backend.run(self.opts.sync_timeout_s)  # adopt what the cluster runs; the bind loop
        # every node's inventory built (or the bind loop's build waited for) before the controller
        # recovers: a recovery that saw a half-built node view would evict the work on the rest
        self.backend.nodes.refresh()
        log.warning(
            "kubernetes: caches %s in %.2f s, %.2f s after process start (%s); Lease %s/%s %s",
            "synced" if synced else "NOT synced",
            time.monotonic() - t0,
            process_age_s(),
            ", ".join(f"{k} {len(v)}" for k, v in self.informers.by_kind.items()),
            self.opts.lease.namespace,
            self.opts.lease.name,
            "held" if held else f"held by {self.lease.holder or 'another replica'}",
        )

    # ------------------------------------------------------------------ after the service
    def start_service(self, svc: Service) -> None:
        """The source submits through the service; the status writer follows the controller."""
        from gpupool.kube.adapters.status import EventRecorder, KubeWrites, StatusWriter

        writes = KubeWrites(self.api)
        recorder = EventRecorder(writes, instance=self.lease.identity)
        if self.backend.on_nodes_changed is None:  # the cluster is the node source
            self.backend.on_nodes_changed = svc.controller.nodes_changed
        self.source.submitter = ServiceSubmitter(svc)
        self.source.events = recorder
        el = svc.leader
        self.source.gate = (lambda: el.is_leader) if el is not None else self.lease.held
        # the source's worker reads every cached object, then cancels the workloads of objects
        # deleted while gpupool was down (off the start-up path: the API serves meanwhile)
        self.source.start()
        log.warning("kubernetes: service up %.2f s after process start", process_age_s())
        self.writer = StatusWriter(
            svc.controller,
            svc.store,
            self.source,
            self.informers.by_kind,
            writes,
            recorder,
            gate=self.source.gate,
        )
        hooks = svc.controller.hooks
        before = hooks.on_cycle
        writer = self.writer

        def on_cycle(stats: Any) -> None:
            before(stats)
            writer.on_cycle(stats)

        hooks.on_cycle = on_cycle
        self.writer.start()
        from gpupool.kube.adapters.config_source import ConfigSource  # pools and queues kept in the cluster

        self.config_source = ConfigSource(
            self.api, recorder, gate=self.source.gate, on_change=self.source.retry_refused
        )
        self.config_source.start(svc)

    def stop_service(self) -> None:
        """Stop what acts through the service (the source, the status writer)."""
        for part in (self.config_source, self.writer, self.source):
            if part is not None:
                part.stop()

    def stop(self) -> None:
        self.stop_service()
        self.lease.stop()
        self.informers.stop()
        self.backend.close()


class _Late:
    """The source's submitter until the service exists: keeps work dirty (never drops it)."""

    def submit_many(self, manifests: Sequence[Any]) -> list[Any]:
        raise RuntimeError("the service is not started yet")

    def cancel(self, name: str) -> bool:
        raise RuntimeError("the service is not started yet")

    def active(self) -> set[str]:
        return set()


class _LateEvents:
    def event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        log.info("event before the service started: %s %s", reason, message)


def kube_app(cfg: ServiceConfig, kube: KubeOptions | KubeRuntime) -> FastAPI:
    """The gpupool application with the Kubernetes backend around it (``kube``: the options, or
    a runtime already connecting)."""
    from gpupool.service.api import create_app

    rt = kube if isinstance(kube, KubeRuntime) else KubeRuntime(kube)
    app = create_app(cfg, backend=rt.backend)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[None]:
        rt.start_cluster()
        try:
            async with inner(a):
                rt.start_service(a.state.svc)
                try:
                    yield
                finally:
                    rt.stop_service()  # before the service stops: the source submits through it
        finally:
            rt.stop()

    app.router.lifespan_context = lifespan
    app.state.kube = rt
    return app


class ServiceSubmitter:
    """``Submitter`` over a running service: ``prepare`` (validation, authorization, admission
    policy, approval) and the batcher (group commit), then the controller, as the API does."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.principal = Principal(SYSTEM_NAME, Role.PLATFORM_ADMIN)

    def submit_many(self, manifests: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        out: list[Outcome | None] = [None] * len(manifests)
        waiting: list[tuple[int, Prepared, Future[Any]]] = []
        for i, m in enumerate(manifests):
            name = str((m.get("metadata") or {}).get("name") or "")
            try:
                prep = prepare(self.svc, self.principal, m)
                phase = "AwaitingApproval" if prep.approval else "Pending"
                fut = self.svc.batcher.submit(
                    prep.body,
                    owner=SYSTEM_NAME,
                    phase=phase,
                    audit=prep.audit,
                    resolved_class=prep.model.priority_class or None,
                )
            except ApiError as exc:
                out[i] = Outcome(
                    name, "refused", exc.message, tuple((e["field"], e["problem"]) for e in exc.errors)
                )
                continue
            except StoreError as exc:
                out[i] = Outcome(name, "refused", str(exc))
                continue
            waiting.append((i, prep, fut))
        for i, prep, fut in waiting:  # one group commit for the whole batch
            out[i] = self._committed(prep, fut)
        return [o if o is not None else Outcome("", "refused", "not submitted") for o in out]

    def _committed(self, prep: Prepared, fut: Future[Any]) -> Outcome:
        try:
            rec, created = fut.result()
            after(self.svc, prep, rec, created)
        except StoreError as exc:
            return Outcome(prep.model.name, "refused", str(exc))
        return Outcome(rec.name, "created" if created else "unchanged")

    def cancel(self, name: str) -> bool:
        try:
            rec = self.svc.store.get_workload(name)
        except NotFound:
            return False
        if rec.phase in TERMINAL_PHASES:
            return False
        self.svc.controller.cancel(name, SYSTEM_NAME)
        return True

    def active(self) -> set[str]:
        phases = [p for p in PHASES if p not in TERMINAL_PHASES]
        return {r.name for r in self.svc.store.list_workloads(owner=SYSTEM_NAME, phases=phases)}
