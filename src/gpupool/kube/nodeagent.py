"""A node agent: the kubelet of simulated GPU nodes, played against any API server over HTTP
(issue 24) -- the real control plane of ``gpupool kube cluster up`` or the fake one.

What it does, per node, as a kubelet does:

- registers the Node (GFD labels, ``nvidia.com/gpu`` capacity, HAMi's register annotation:
  the objects ``gpupool.kube.fake.nodes`` builds) and heartbeats through a Lease in
  ``kube-node-lease`` (renewed every ``heartbeat_s``; the Ready condition's heartbeat is
  re-posted every ``STATUS_EVERY`` renewals, as a kubelet reports status rarely once it has a
  Lease);
- takes every pod bound to one of its nodes through Pending -> Running -> Succeeded/Failed,
  writing the status a kubelet writes (``gpupool.kube.kubelet_status``, the fake's convention:
  ``fake.gpupool.io/run-seconds``, ``exit-code``, ``start-seconds``), after HAMi's checks of the
  device annotation (``hami.io/bind-phase`` set, the node lock released, refusals failed with
  ``UnexpectedAdmissionError``);
- removes a pod deleted with a grace period once that period is over, by deleting it with
  ``gracePeriodSeconds=0`` (the uid as precondition), as a kubelet does after its containers stop;
- ``set_ready(name, False)`` reports a node NotReady (its heartbeats go on with that condition)
  and parks its pods' steps until ``set_ready(name, True)``, as the fake's kubelet parks the pods
  of a NotReady node.

Shape, and why: one watch of all bound pods (``spec.nodeName!=``) rather than one per node, so a
hundred nodes cost one stream; every write is made by one worker thread from a queue of due
actions, so a pod's steps never race each other (the fake's kubelet gets the same from its event
loop); each step re-reads the pod, so a stale event only costs a GET. Requests go through
``KubeApi``, the client gpupool's backend uses, so the agent is configured by a kubeconfig.
Times (run, start, grace) are multiplied by ``time_scale``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.kube import kubelet_status as ks
from gpupool.kube.client import RESOURCES, STRATEGIC_PATCH, ApiError, KubeApi
from gpupool.kube.fake import hami

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PODS, NODES, EVENTS, LEASES = (RESOURCES[k] for k in ("pods", "nodes", "events", "leases"))
LEASE_NAMESPACE = "kube-node-lease"
#: the Node status heartbeat is re-posted every this many Lease renewals
STATUS_EVERY = 6


def micro_time(t: float | None = None) -> str:
    """A MicroTime (``renewTime``): RFC 3339 with microseconds."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


class NodeAgent:
    """The kubelets of ``nodes`` (Node objects to register), against the server ``api`` talks to.

    ``start()`` registers the nodes and their Leases and starts the threads; ``stop()`` ends
    them (idempotent). ``violations`` collects HAMi device double-bookings, as the fake's ledger
    does; ``errors`` the requests that failed (the agent goes on)."""

    def __init__(
        self,
        api: KubeApi,
        nodes: Iterable[Mapping[str, Any]],
        *,
        time_scale: float = 1.0,
        heartbeat_s: float = 10.0,
        lease_duration_s: int = 40,
        use_hami: bool = True,
    ) -> None:
        self.api = api
        self.nodes: dict[str, Obj] = {n["metadata"]["name"]: dict(n) for n in nodes}
        self.time_scale = time_scale
        self.heartbeat_s = heartbeat_s
        self.lease_duration_s = lease_duration_s
        self.use_hami = use_hami
        self.ledger = hami.Ledger()
        self.violations: list[str] = []
        self.errors: list[str] = []
        self._seen: set[str] = set()  # pod uids admitted or being admitted
        self._terminating: set[str] = set()
        self._down: set[str] = set()  # nodes set NotReady
        self._parked: dict[str, list[Callable[[], None]]] = {}  # their pods' steps, held
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stopping = threading.Event()
        self._stream: Any = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Register every node and its Lease, then start watching pods and heartbeating."""
        for name, node in self.nodes.items():
            self._register(name, node)
        for target, label in ((self._work, "work"), (self._watch_pods, "watch"), (self._heartbeat, "lease")):
            t = threading.Thread(target=target, name=f"nodeagent-{label}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the threads (the watch stream is closed to wake its reader)."""
        self._stopping.set()
        with self._cv:
            self._cv.notify_all()
        stream = self._stream
        if stream is not None:
            stream.close()
        for t in self._threads:
            t.join(timeout_s)
        self._threads = []

    def __enter__(self) -> NodeAgent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ready_nodes(self) -> list[str]:
        """The agent's nodes the server reports Ready (and not tainted not-ready/unreachable)."""
        out = []
        for name in self.nodes:
            try:
                node = self.api.get(NODES, None, name)
            except ApiError:
                continue
            taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
            if _ready(node) and not taints & {
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable",
            }:
                out.append(name)
        return out

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until every node reads Ready; TimeoutError names those that did not."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready = set(self.ready_nodes())
            if ready == set(self.nodes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nodes not Ready within {timeout_s:.0f} s: {sorted(set(self.nodes) - ready)}"
                )
            time.sleep(0.2)

    def set_ready(self, name: str, ready: bool) -> Obj:
        """Report node ``name`` Ready or NotReady, as its kubelet would (the Ready condition in
        its status, kept by the heartbeats after); a NotReady node's pods are parked until it is
        Ready again. Returns the node as written."""
        ready_cond = ks.node_ready_condition(ready, "node agent: node set NotReady")
        node = self.nodes[name]
        conds = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") != "Ready"]
        status = {**(node.get("status") or {}), "conditions": [*conds, ready_cond]}
        with self._cv:
            self.nodes[name] = {**node, "status": status}
            if ready:
                self._down.discard(name)
                held = self._parked.pop(name, [])
            else:
                self._down.add(name)
                held = []
        made = self.api.patch(
            NODES, None, name, {"status": {"conditions": status["conditions"]}}, sub="status"
        )
        for action in held:
            self._later(0, action)
        return made

    def _on_node(self, node_name: str, action: Callable[[], None]) -> Callable[[], None]:
        """``action``, parked instead while ``node_name`` is NotReady."""

        def step() -> None:
            with self._cv:
                if node_name in self._down:
                    self._parked.setdefault(node_name, []).append(step)
                    return
            action()

        return step

    # -- registration and heartbeats ------------------------------------------------------------
    def _register(self, name: str, node: Obj) -> None:
        body = {**node, "status": {**node.get("status", {}), "conditions": _fresh_conditions(node)}}
        try:
            made = self.api.create(NODES, None, body)
        except ApiError as exc:
            if exc.code != 409:
                raise
            made = self.api.patch(NODES, None, name, {"status": body["status"]}, sub="status")
        self.nodes[name] = made
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": made["metadata"]["uid"]}
                ],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": self.lease_duration_s,
                "renewTime": micro_time(),
            },
        }
        try:
            self.api.create(LEASES, LEASE_NAMESPACE, lease)
        except ApiError as exc:
            if exc.code != 409:
                raise
            self._renew(name)

    def _renew(self, name: str) -> None:
        patch = {"spec": {"holderIdentity": name, "renewTime": micro_time()}}
        try:
            self.api.patch(LEASES, LEASE_NAMESPACE, name, patch)
        except ApiError as exc:
            if exc.code != 404:
                raise
            self._register(name, self.nodes[name])  # the node or its lease was deleted: re-register

    def _heartbeat(self) -> None:
        for beat in itertools.count(1):
            if self._stopping.wait(self.heartbeat_s):
                return
            for name, node in list(self.nodes.items()):
                try:
                    self._renew(name)
                    if beat % STATUS_EVERY == 0:
                        status = {"status": {"conditions": _fresh_conditions(node)}}
                        self.api.patch(NODES, None, name, status, sub="status")
                except ApiError as exc:
                    self._error(f"heartbeat of {name}: {exc}")

    # -- the pod watch --------------------------------------------------------------------------
    def _watch_pods(self) -> None:
        """List then watch bound pods, relisting after 410 Gone or a broken stream."""
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                pods, rv = self.api.list(PODS, None, params={"fieldSelector": "spec.nodeName!="})
                for pod in pods:
                    self._on_pod("ADDED", pod)
                params = {
                    "fieldSelector": "spec.nodeName!=",
                    "resourceVersion": rv,
                    "allowWatchBookmarks": "true",
                    "timeoutSeconds": 300,
                }
                while not self._stopping.is_set():
                    for event in self.api.watch(PODS, None, params, on_open=self._opened):
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            raise ApiError(int(obj.get("code") or 0), str(obj.get("reason")), str(obj))
                        params["resourceVersion"] = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if event.get("type") != "BOOKMARK":
                            self._on_pod(str(event.get("type")), obj)
                    backoff = 0.2
            except ApiError as exc:
                if self._stopping.is_set():
                    return
                if exc.code != 410:
                    self._error(f"pod watch: {exc}")
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 5.0)

    def _opened(self, stream: Any) -> None:
        self._stream = stream
        if self._stopping.is_set():
            stream.close()

    def _on_pod(self, etype: str, pod: Obj) -> None:
        md, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid = md.get("uid", "")
        if spec.get("nodeName") not in self.nodes:
            return
        ns, name, node_name = md.get("namespace", ""), md.get("name", ""), str(spec.get("nodeName"))
        if etype == "DELETED":
            self._later(0, lambda: self._forget(uid))
        elif md.get("deletionTimestamp"):
            if uid not in self._terminating:
                self._terminating.add(uid)
                grace = float(md.get("deletionGracePeriodSeconds") or 0) * self.time_scale
                self._later(grace, self._on_node(node_name, lambda: self._remove(ns, name, uid)))
        elif (pod.get("status") or {}).get("phase", "Pending") == "Pending" and uid not in self._seen:
            self._seen.add(uid)
            self._later(0, self._on_node(node_name, lambda: self._admit(ns, name, uid)))

    # -- the worker: every write, one at a time -------------------------------------------------
    def _later(self, delay_s: float, action: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._queue, (time.monotonic() + max(0.0, delay_s), next(self._seq), action))
            self._cv.notify()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._stopping.is_set():
                    wait = self._queue[0][0] - time.monotonic() if self._queue else None
                    if wait is not None and wait <= 0:
                        break
                    self._cv.wait(wait)
                if self._stopping.is_set():
                    return
                _, _, action = heapq.heappop(self._queue)
            try:
                action()
            except ApiError as exc:
                self._error(str(exc))

    def _error(self, message: str) -> None:
        if not self._stopping.is_set():
            log.warning("node agent: %s", message)
            self.errors.append(message)

    def _forget(self, uid: str) -> None:
        self.ledger.release(uid)
        self._seen.discard(uid)
        self._terminating.discard(uid)

    def _get_pod(self, ns: str, name: str) -> Obj | None:
        """The pod as the server has it now, None when it is gone."""
        try:
            return self.api.get(PODS, ns, name)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def _current(self, ns: str, name: str, uid: str) -> Obj | None:
        """The pod if it is still the one (same uid) and not being deleted."""
        pod = self._get_pod(ns, name)
        if pod is None:
            return None
        md = pod["metadata"]
        return None if md.get("uid") != uid or md.get("deletionTimestamp") else pod

    # -- the pod's life -------------------------------------------------------------------------
    def _admit(self, ns: str, name: str, uid: str) -> None:
        pod = self._current(ns, name, uid)
        if pod is None or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        node_name = pod["spec"]["nodeName"]
        ann = dict(pod["metadata"].get("annotations") or {})
        devices = hami.node_devices(self.nodes[node_name]) if self.use_hami else None
        if devices is not None and _wants_gpu(pod):
            try:
                value = ann.get(hami.TO_ALLOCATE, "")
                if not value:
                    raise hami.AdmissionError(
                        f"pod requests {hami.GPU} but has no {hami.TO_ALLOCATE} annotation"
                    )
                grants = hami.parse_allocation(value, pod, devices)
            except hami.AdmissionError as exc:
                self._annotate(pod, {hami.BIND_PHASE: "failed"})
                self._status(pod, ks.failed_status(pod, str(exc)))
                self._event(pod, "Warning", "UnexpectedAdmissionError", f"Allocate failed due to {exc}")
                return
            self.violations += self.ledger.take(uid, f"{ns}/{name}", grants, devices)
            self._release_lock(node_name, (ns, name))
            pod = self._annotate(pod, {hami.BIND_PHASE: "success"})
        hold = ann.get(ks.START_SECONDS)
        if hold is not None:
            if self._status(pod, ks.creating_status(pod)) is None:
                return
            self._later(
                float(hold) * self.time_scale, self._on_node(node_name, lambda: self._run(ns, name, uid))
            )
            return
        self._run(ns, name, uid, pod)

    def _run(self, ns: str, name: str, uid: str, pod: Obj | None = None) -> None:
        pod = pod or self._current(ns, name, uid)
        if pod is None or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        if self._status(pod, ks.running_status(pod)) is None:
            return
        secs = (pod["metadata"].get("annotations") or {}).get(ks.RUN_SECONDS)
        if secs is not None:
            node_name = pod["spec"]["nodeName"]
            self._later(
                float(secs) * self.time_scale, self._on_node(node_name, lambda: self._finish(ns, name, uid))
            )

    def _finish(self, ns: str, name: str, uid: str) -> None:
        pod = self._current(ns, name, uid)
        if pod is None or (pod.get("status") or {}).get("phase") != "Running":
            return
        self._status(pod, ks.terminated_status(pod, ks.exit_code(pod)))
        self.ledger.release(uid)

    def complete(self, ns: str, name: str, exit_code: int = 0, timeout_s: float = 10.0) -> bool:
        """End a running pod of these nodes now, as if its containers exited with ``exit_code``
        (``Succeeded``, else ``Failed``), its devices released: the fake kubelet's ``complete``,
        for a test that ends work between two cycles it drives. False, changing nothing, when
        the pod is not running here (missing, Pending, terminating, ended). The worker makes the
        write, one at a time with the agent's own."""
        if isinstance(exit_code, bool) or not isinstance(exit_code, int) or not 0 <= exit_code <= 255:
            raise ValueError(f"exit_code must be an integer from 0 to 255, got {exit_code!r}")
        done, ended = threading.Event(), []

        def end() -> None:
            try:
                ended.append(self._complete(ns, name, exit_code))
            finally:
                done.set()

        self._later(0, end)
        if not done.wait(timeout_s):
            raise TimeoutError(f"complete {ns}/{name}: no answer from the agent within {timeout_s:g} s")
        return bool(ended and ended[0])

    def _complete(self, ns: str, name: str, code: int) -> bool:
        pod = self._get_pod(ns, name)
        if pod is None:
            return False
        md = pod["metadata"]
        if pod["spec"].get("nodeName") not in self.nodes or md.get("deletionTimestamp"):
            return False
        if (pod.get("status") or {}).get("phase") != "Running":
            return False
        if self._status(pod, ks.terminated_status(pod, code)) is None:
            return False
        self.ledger.release(str(md.get("uid", "")))
        return True

    def _remove(self, ns: str, name: str, uid: str) -> None:
        """The grace period over: the containers stopped (exit 143, SIGTERM) and the pod in a
        terminal phase, then deleted. Why the phase first, as the kubelet writes it: a Job's pods
        carry the Job controller's finalizer, and with a ``podFailurePolicy`` that controller
        judges a deleted pod only once it is terminal; without it the pod stayed Running with its
        deletionTimestamp and the Job made no replacement (issue 24)."""
        try:
            pod = self.api.get(PODS, ns, name)
        except ApiError as exc:
            if exc.code != 404:
                raise
            pod = None
        if (
            pod is not None
            and pod["metadata"].get("uid") == uid
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ):
            self._status(pod, ks.terminated_status(pod, 143))
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            self.api.delete(PODS, ns, name, body)
        except ApiError as exc:
            if exc.code not in (404, 409):  # gone already, or a new pod of the same name
                raise
        self._forget(uid)

    # -- writes -----------------------------------------------------------------------------------
    def _annotate(self, pod: Obj, annotations: Mapping[str, str]) -> Obj:
        md = pod["metadata"]
        patch = {"metadata": {"uid": md["uid"], "annotations": dict(annotations)}}
        return self.api.patch(PODS, md["namespace"], md["name"], patch)

    def _status(self, pod: Obj, status: Obj) -> Obj | None:
        """Write the pod's status (the uid as precondition); None when the pod changed
        identity or went away meanwhile. A strategic merge patch, as the kubelet's status
        manager sends: conditions merge by type, so one another writer added since ``pod`` was
        read (a DisruptionTarget) is kept, not replaced with the list read."""
        md = pod["metadata"]
        try:
            return self.api.patch(
                PODS,
                md["namespace"],
                md["name"],
                {"metadata": {"uid": md["uid"]}, "status": status},
                sub="status",
                content_type=STRATEGIC_PATCH,
            )
        except ApiError as exc:
            if exc.code in (404, 409):
                return None
            raise

    def _release_lock(self, node_name: str, me: tuple[str, str]) -> None:
        node = self.api.get(NODES, None, node_name)
        holder = hami.lock_holder(node)
        if holder is None:
            return
        if holder != me:
            self.violations.append(
                f"node {node_name} lock held by {holder[0]}/{holder[1]} while {me[0]}/{me[1]} was allocated"
            )
            return
        patch = {
            "metadata": {
                "resourceVersion": node["metadata"]["resourceVersion"],
                "annotations": {hami.NODE_LOCK: None},
            }
        }
        try:
            self.api.patch(NODES, None, node_name, patch)
        except ApiError as exc:
            if exc.code != 409:  # changed meanwhile: the scheduler took the lock again
                raise

    def _event(self, pod: Obj, etype: str, reason: str, message: str) -> None:
        self.api.create(EVENTS, pod["metadata"]["namespace"], ks.pod_event(pod, etype, reason, message))


def _fresh_conditions(node: Mapping[str, Any]) -> list[Obj]:
    """The node's conditions with Ready's heartbeat now (the kubelet posts it)."""
    now = ks.now_rfc3339()
    conds = [dict(c) for c in (node.get("status") or {}).get("conditions") or []]
    for c in conds:
        c["lastHeartbeatTime"] = now
    return conds


def _ready(node: Mapping[str, Any]) -> bool:
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _wants_gpu(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    return any(hami.gpu_request(c) > 0 for c in containers)


__all__ = ["LEASE_NAMESPACE", "NodeAgent", "micro_time"]
