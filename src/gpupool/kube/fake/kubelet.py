"""A simulated kubelet for every node: admits bound pods (through the HAMi stand-in), runs them,
ends them after ``fake.gpupool.io/run-seconds`` and removes deleted pods after their grace period.
``fake.gpupool.io/start-seconds`` keeps an admitted pod Pending (``ContainerCreating``, its devices
already allocated, as during an image pull) that long before it runs: what a podsReady timeout
is for.

``Kubelet.complete`` (``kubelet_of(srv).complete(ns, name)``) ends a running pod on demand, for
tests that decide themselves when work ends (the scenario parity suite's ``finish``).

Why it writes straight to the store: it is part of the server process, and going through HTTP
would double the benchmark's request count with traffic no real scheduler would cause.
A NotReady node's pods are parked and resume when it is Ready again. The statuses it writes and
the annotations above are ``gpupool.kube.kubelet_status``'s, which the HTTP node agent
(``gpupool.kube.nodeagent``, the kubelet of ``gpupool kube cluster up``) shares.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gpupool.kube.fake import hami
from gpupool.kube.fake.resources import ResourceType
from gpupool.kube.fake.storage import Obj
from gpupool.kube.kubelet_status import EXIT_CODE, RUN_SECONDS, START_SECONDS
from gpupool.kube.kubelet_status import creating_status as _creating_status
from gpupool.kube.kubelet_status import failed_status as _failed_status
from gpupool.kube.kubelet_status import pod_event as _pod_event
from gpupool.kube.kubelet_status import running_status as _running_status
from gpupool.kube.kubelet_status import terminated_status as _terminated_status

if TYPE_CHECKING:
    from gpupool.kube.fake.runtime import Runtime
    from gpupool.kube.fake.server import FakeApiServer

__all__ = ["EXIT_CODE", "RUN_SECONDS", "START_SECONDS", "Kubelet", "install", "kubelet_of"]


class Kubelet:
    """All nodes' kubelets at once (they share nothing but the store)."""

    def __init__(self, runtime: Runtime, use_hami: bool) -> None:
        self.rt, self.srv = runtime, runtime.srv
        self.store, self.ops = runtime.srv.store, runtime.srv.ops
        self.use_hami = use_hami
        self.ledger = hami.Ledger()
        self.seen: set[str] = set()  # pod uids admitted or being admitted
        self.terminating: set[str] = set()
        self.parked: dict[str, set[tuple[str, str]]] = {}

    # -- events --------------------------------------------------------------------------
    def on_pod(self, _rt: ResourceType, etype: str, pod: Obj, _old: Obj | None) -> None:
        md, spec = pod["metadata"], pod.get("spec") or {}
        uid, node = md["uid"], spec.get("nodeName")
        if etype == "DELETED":
            self.ledger.release(uid)
            self.seen.discard(uid)
            self.terminating.discard(uid)
            return
        if not node:
            return
        if md.get("deletionTimestamp"):
            if uid not in self.terminating:
                self.terminating.add(uid)
                self.step(md["namespace"], md["name"])
            return
        if (pod.get("status") or {}).get("phase", "Pending") == "Pending" and uid not in self.seen:
            self.seen.add(uid)
            self.step(md["namespace"], md["name"])

    def on_node(self, _rt: ResourceType, etype: str, node: Obj, _old: Obj | None) -> None:
        if etype != "DELETED" and _ready(node):
            for ns, name in self.parked.pop(node["metadata"]["name"], set()):
                self.step(ns, name)

    # -- the pod's life ------------------------------------------------------------------
    def step(self, ns: str, name: str) -> None:
        """Move the pod one step along: admit, finish or remove, whichever it is due for."""
        pods = self.store.types["pods"]
        pod = self.store.find(pods, ns, name)
        if pod is None:
            return
        node_name = pod["spec"].get("nodeName", "")
        node = self.store.find(self.store.types["nodes"], "", node_name)
        md, phase = pod["metadata"], (pod.get("status") or {}).get("phase", "Pending")
        if node is None and md.get("deletionTimestamp"):
            self._remove(ns, name, md["uid"])
            return
        if node is None or not _ready(node):
            self.parked.setdefault(node_name, set()).add((ns, name))
            return
        if md.get("deletionTimestamp"):
            grace = float(md.get("deletionGracePeriodSeconds") or 0) * self.srv.time_scale
            self.rt.after(grace, lambda: self._remove(ns, name, md["uid"]))
        elif phase == "Pending":
            self._admit(pod, node)
        elif phase == "Running":
            self._finish(pod)

    def _remove(self, ns: str, name: str, uid: str) -> None:
        pod = self.store.find(self.store.types["pods"], ns, name)
        if pod is not None and pod["metadata"]["uid"] == uid:
            node = self.store.find(self.store.types["nodes"], "", pod["spec"].get("nodeName", ""))
            if node is not None and not _ready(node):
                self.parked.setdefault(pod["spec"].get("nodeName", ""), set()).add((ns, name))
                return
            if node is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                # its containers stopped (143, SIGTERM) and the pod in a terminal phase before it
                # goes, as the real kubelet (and the node agent) write it: a watcher sees a
                # deleted replica Failed first (issue 24)
                done = {**pod, "status": _terminated_status(pod, 143)}
                self.store.commit(self.store.types["pods"], "MODIFIED", done, pod)
            # a node that is gone cannot stop the pod; the real pod garbage collector removes it
            self.ops.delete(self.store.types["pods"], ns, name, 0)

    def _admit(self, pod: Obj, node: Obj) -> None:
        ann = dict(pod["metadata"].get("annotations") or {})
        devices = hami.node_devices(node) if self.use_hami else None
        if devices is not None and _wants_gpu(pod):
            try:
                grants = hami.parse_allocation(ann.get(hami.TO_ALLOCATE, "") or _missing(), pod, devices)
            except hami.AdmissionError as exc:
                ann[hami.BIND_PHASE] = "failed"
                self._write(pod, ann, _failed_status(pod, str(exc)))
                self._event(pod, "Warning", "UnexpectedAdmissionError", f"Allocate failed due to {exc}")
                return
            for problem in self.ledger.take(pod["metadata"]["uid"], _ref(pod), grants, devices):
                self.store.stats.violations.append(problem)
            self._release_lock(pod, node)
            ann[hami.BIND_PHASE] = "success"
        hold = ann.get(START_SECONDS)
        if hold is not None:
            if self._write(pod, ann, _creating_status(pod)):
                md = pod["metadata"]
                ns, name, uid = md["namespace"], md["name"], md["uid"]
                self.rt.after(float(hold) * self.srv.time_scale, lambda: self._start(ns, name, uid))
            return
        self._run(pod, ann)

    def _start(self, ns: str, name: str, uid: str) -> None:
        """The end of a ``start-seconds`` hold: the same pod, still Pending, now runs."""
        pod = self.store.find(self.store.types["pods"], ns, name)
        if pod is None or pod["metadata"]["uid"] != uid or pod["status"].get("phase") != "Pending":
            return
        self._run(pod, dict(pod["metadata"].get("annotations") or {}))

    def _run(self, pod: Obj, ann: dict[str, str]) -> None:
        if self._write(pod, ann, _running_status(pod)):
            secs = ann.get(RUN_SECONDS)
            if secs is not None:
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                self.rt.after(float(secs) * self.srv.time_scale, lambda: self.step(ns, name))

    def _finish(self, pod: Obj) -> None:
        ann = pod["metadata"].get("annotations") or {}
        code = int(ann.get(EXIT_CODE, "0") or 0)
        self._write(pod, dict(ann), _terminated_status(pod, code))
        self.ledger.release(pod["metadata"]["uid"])

    # -- on demand -----------------------------------------------------------------------
    def complete(self, ns: str, name: str, exit_code: int = 0, timeout_s: float = 10.0) -> bool:
        """End a running pod now, as if its containers exited with ``exit_code``: ``Succeeded``
        with every container ``terminated`` (exit 0, reason ``Completed``), or ``Failed``
        (reason ``Error``), its devices released; a Job's controller then counts it.

        Why on demand: a test that drives cycles at its own times needs a workload to end
        between two of them, not after a wall-clock ``run-seconds``. Returns False, changing
        nothing, when the pod is not running (missing, still Pending, terminating, already
        ended). Safe from any thread: the write is made on the server's loop, as the kubelet's
        own writes are, so it never races them."""
        if isinstance(exit_code, bool) or not isinstance(exit_code, int) or not 0 <= exit_code <= 255:
            raise ValueError(f"exit_code must be an integer from 0 to 255, got {exit_code!r}")
        loop = self.rt.loop
        if loop is None or _running_loop() is loop:
            return self._complete(ns, name, exit_code)

        async def on_loop() -> bool:
            return self._complete(ns, name, exit_code)

        return asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout_s)

    def _complete(self, ns: str, name: str, code: int) -> bool:
        pod = self.store.find(self.store.types["pods"], ns, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return False
        if (pod.get("status") or {}).get("phase") != "Running":
            return False
        ann = dict(pod["metadata"].get("annotations") or {})
        if not self._write(pod, ann, _terminated_status(pod, code)):
            return False
        self.ledger.release(pod["metadata"]["uid"])
        return True

    def _write(self, pod: Obj, ann: dict[str, str], status: Obj) -> bool:
        """Commit annotations + status if the pod is still the one we looked at."""
        pods = self.store.types["pods"]
        with self.store.lock:
            cur = self.store.find(pods, pod["metadata"]["namespace"], pod["metadata"]["name"])
            if (
                cur is None
                or cur["metadata"]["uid"] != pod["metadata"]["uid"]
                or cur["metadata"].get("deletionTimestamp")
            ):
                return False
            new = {**cur, "metadata": {**cur["metadata"], "annotations": ann}, "status": status}
            self.store.commit(pods, "MODIFIED", new, cur)
            return True

    def _release_lock(self, pod: Obj, node: Obj) -> None:
        holder = hami.lock_holder(node)
        me = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        if holder is None:
            return
        if holder != me:
            self.store.stats.violations.append(
                f"node {node['metadata']['name']} lock held by {holder[0]}/"
                f"{holder[1]} while {me[0]}/{me[1]} was allocated"
            )
            return
        nodes = self.store.types["nodes"]
        with self.store.lock:
            cur = self.store.find(nodes, "", node["metadata"]["name"])
            if cur is not None and hami.lock_holder(cur) == me:
                ann = {
                    k: v for k, v in (cur["metadata"].get("annotations") or {}).items() if k != hami.NODE_LOCK
                }
                self.store.commit(
                    nodes, "MODIFIED", {**cur, "metadata": {**cur["metadata"], "annotations": ann}}, cur
                )

    def _event(self, pod: Obj, etype: str, reason: str, message: str) -> None:
        ns = pod["metadata"]["namespace"]
        self.ops.create(self.store.types["events"], ns, _pod_event(pod, etype, reason, message))


def kubelet_of(srv: FakeApiServer) -> Kubelet:
    """The server's kubelet (to end pods on demand); a server started with ``kubelet=False``
    has none, which is a usage error worth saying plainly."""
    for sim in srv.runtime.sims:
        if isinstance(sim, Kubelet):
            return sim
    raise LookupError("this FakeApiServer runs without its kubelet (kubelet=False)")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _missing() -> str:
    raise hami.AdmissionError(f"pod requests {hami.GPU} but has no {hami.TO_ALLOCATE} annotation")


def _ref(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _ready(node: Obj) -> bool:
    conds = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _wants_gpu(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    return any(
        hami.gpu_request(c) > 0 for c in list(spec.get("initContainers") or []) + spec.get("containers", [])
    )


def install(runtime: Runtime, use_hami: bool) -> None:
    """Register the kubelet's handlers on the runtime."""
    k = Kubelet(runtime, use_hami)
    runtime.sims.append(k)
    runtime.on("pods", k.on_pod)
    runtime.on("nodes", k.on_node)
