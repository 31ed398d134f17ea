"""Binding pods to the exact devices the engine chose: ``POST pods/{name}/binding``.

Why the Binding carries the annotations: the API server copies a Binding's annotations onto the
pod in the same write that sets ``spec.nodeName``, so no pod is ever on a node without the
device record HAMi's device plugin reads (a separate patch could land after the kubelet starts
the container). The ``metadata.uid`` precondition makes the bind refuse a pod that was deleted
and recreated under the same name since the decision.

Why a per-node lane and the node lock: HAMi's plugin finds the pod being allocated through the
node annotation ``hami.io/mutex.lock`` and releases it after ``Allocate``, so binds to one HAMi
node are serialised (as HAMi's own scheduler does); binds to different nodes, and all binds to a
node without HAMi's register (no lock there: nothing reads it), run in parallel on a thread pool.
The next bind on a HAMi node is started by the informer's event that shows the lock released,
so threads never sit waiting for a device plugin. A lock whose holder is already running, finished or gone is stale and taken over
(the plugin's own expiry is five minutes, far too long to wait for a pod that has started).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpupool.kube import annotations as kube_ann
from gpupool.kube import inventory
from gpupool.kube.client import RESOURCES, ApiError, KubeApi
from gpupool.kube.runtime.informer import Informers, object_key

log = logging.getLogger("gpupool.kube.binder")

LOCK_EXPIRE_S = 300.0  # HAMi's HAMI_NODELOCK_EXPIRE default


@dataclass(slots=True)
class BindJob:
    """One pod to bind where the placement says."""

    workload: str
    decision: str
    pod: Mapping[str, Any]
    placement: Mapping[str, Any]  # one entry of the placement's ``pods``
    devices: Sequence[inventory.Device]


@dataclass(slots=True)
class BindResult:
    job: BindJob
    ok: bool
    #: the pod is bound somewhere else: no retry can help
    fatal: bool = False
    message: str = ""


@dataclass(slots=True)
class _Held:
    """A node lock this binder wrote and has not yet seen released (in the informer's events)."""

    value: str
    rv: str = ""
    #: the watch has shown our lock on the node (the release is the first change after it)
    seen: bool = False
    #: the rest of a pass's lane for this node, started when the device plugin frees the lock
    waiting: tuple[deque[BindJob], _Pass] | None = None
    wait_from: float = 0.0


class _Pass:
    """One ``bind_all``: the results the pool's threads hand in; done when all are in."""

    def __init__(self, n: int) -> None:
        self.results: list[BindResult] = []
        self.left = n
        self.lock = threading.Lock()
        self.done = threading.Event()

    def add(self, results: Sequence[BindResult]) -> None:
        with self.lock:
            self.results.extend(results)
            self.left -= len(results)
            if self.left <= 0:
                self.done.set()


class Binder:
    """Binds pods, in parallel across nodes and in order within one HAMi node."""

    def __init__(
        self,
        api: KubeApi,
        informers: Informers,
        *,
        concurrency: int = 32,
        lock_wait_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.lock_wait_s = lock_wait_s
        self.informers = informers
        self.clock = clock
        self.pool = ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="gpupool-bind")
        #: binds done and refused, for health and the benchmark
        self.stats: dict[str, int] = {"bound": 0, "retried": 0, "lockWaits": 0}
        self._cv = threading.Lock()
        self._held: dict[str, _Held] = {}
        self._closed = False
        informers.nodes.add_listener(self._on_node)

    def close(self) -> None:
        self._closed = True
        self.pool.shutdown(wait=False, cancel_futures=True)

    def bind_all(self, jobs: Sequence[BindJob]) -> list[BindResult]:
        """Bind every job; returns when all are done. A node without HAMi's register needs no
        lock, so all its binds go at once; a HAMi node's binds go one at a time, each started by
        the watch event that shows the plugin released the previous one's lock, so no thread
        waits on a lock (the pool's threads only send requests)."""
        if not jobs:
            return []
        lanes: dict[str, deque[BindJob]] = defaultdict(deque)
        for j in jobs:
            lanes[str(j.placement["node"])].append(j)
        p = _Pass(len(jobs))
        for node, lane in lanes.items():
            if self._hami_node(node):
                self._next(node, lane, p)
            else:
                for j in lane:
                    self.pool.submit(self._one, j, p)
        while not p.done.wait(0.05):
            if self._closed:  # the pool's queued binds were cancelled: never all in
                break
            self._expire()
        return p.results

    def _next(self, node: str, lane: deque[BindJob], p: _Pass) -> None:
        """Start the lane's next bind now, or when our lock on the node is seen released."""
        with self._cv:
            h = self._held.get(node)
            if h is not None:
                h.waiting, h.wait_from = (lane, p), time.monotonic()
                return
        self.pool.submit(self._step, node, lane, p)

    def _one(self, job: BindJob, p: _Pass) -> None:
        p.add([self._safe_bind(job)])

    def _step(self, node: str, lane: deque[BindJob], p: _Pass) -> None:
        p.add([self._safe_bind(lane.popleft())])
        if lane:
            self._next(node, lane, p)

    def _safe_bind(self, job: BindJob) -> BindResult:
        try:
            return self.bind(job)
        except Exception as exc:  # one bad pod must not lose the pass's other results
            log.exception("bind of %s failed", object_key(job.pod))
            return BindResult(job, False, message=f"{type(exc).__name__}: {exc}")

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        """The informer's node events: our lock seen, then its release (the first change
        after it) starts the waiting lane. Runs on the watch thread: no requests here."""
        md = obj.get("metadata") or {}
        name = str(md.get("name") or "")
        with self._cv:
            h = self._held.get(name)
            if h is None:
                return
            cur = str((md.get("annotations") or {}).get(kube_ann.HAMI_NODE_LOCK) or "")
            if kind != "DELETED" and (cur == h.value or (h.rv and md.get("resourceVersion") == h.rv)):
                h.seen = True
                return
            if not h.seen and kind != "DELETED":
                return  # an event from before our lock landed
            del self._held[name]
            waiting = h.waiting
        if waiting is not None:
            self.pool.submit(self._step, name, *waiting)

    def _expire(self) -> None:
        """Lanes whose lock the plugin has not released within ``lock_wait_s``: their binds fail
        this pass (retried with backoff), and the lock is judged afresh next time (``_stale``)."""
        now = time.monotonic()
        with self._cv:
            late = [
                (n, h)
                for n, h in self._held.items()
                if h.waiting is not None and now - h.wait_from > self.lock_wait_s
            ]
            for n, _h in late:
                del self._held[n]
        for node, h in late:
            assert h.waiting is not None
            lane, p = h.waiting
            why = f"node {node} is locked by {h.value} (not released within {self.lock_wait_s:g}s)"
            self.stats["lockWaits"] += len(lane)
            failed = [BindResult(j, False, message=why) for j in lane]
            lane.clear()
            p.add(failed)

    # -- one pod ----------------------------------------------------------------------------
    def bind(self, job: BindJob) -> BindResult:
        ns, name = object_key(job.pod)
        node = str(job.placement["node"])
        now = self.clock()
        try:
            ann = kube_ann.binding_annotations(
                job.workload, job.placement, job.devices, job.pod, now, job.decision
            )
        except ValueError as exc:
            return BindResult(job, False, fatal=True, message=str(exc))
        locked = False
        try:
            if self._hami_node(node) and kube_ann.plugin_allocates(job.pod):
                why = self._lock(node, ns, name, now)
                if why:
                    self.stats["lockWaits"] += 1
                    return BindResult(job, False, message=why)
                locked = True
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "uid": (job.pod.get("metadata") or {}).get("uid", ""),
                    "annotations": ann,
                },
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            self.api.post_sub(RESOURCES["pods"], ns, name, "binding", body)
        except ApiError as exc:
            if locked:
                self._unlock(node, ns, name)
            return self._refused(job, exc)
        self.stats["bound"] += 1
        return BindResult(job, True)

    def _refused(self, job: BindJob, exc: ApiError) -> BindResult:
        """A refused bind: already bound where we wanted (idempotent success), bound elsewhere
        (fatal), or anything else (retried by the caller with backoff)."""
        ns, name = object_key(job.pod)
        self.stats["retried"] += 1
        if exc.code == 409:
            try:
                cur = self.api.get(RESOURCES["pods"], ns, name)
            except ApiError:
                return BindResult(job, False, message=str(exc))
            at = str((cur.get("spec") or {}).get("nodeName") or "")
            if at == str(job.placement["node"]):
                return BindResult(job, True, message="already bound here")
            if at:
                return BindResult(job, False, fatal=True, message=f"pod {ns}/{name} is bound to {at}")
        return BindResult(job, False, message=str(exc))

    # -- HAMi's node lock -------------------------------------------------------------------
    def _hami_node(self, node: str) -> bool:
        obj = self.informers.nodes.get("", node)
        ann = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        return inventory.HAMI_REGISTER in ann

    def _lock(self, node: str, ns: str, pod: str, now: float) -> str:
        """Take the node lock for this pod ('' when taken, else why not). The cached node is
        tried first (no GET): the patch carries its resourceVersion, so a stale cache costs a
        409 and a fresh read, never a lost lock. A lock someone else holds for a pod that still
        waits for its devices fails this try (retried with backoff); our own previous lock
        never gets here (``bind_all`` starts the next bind when the watch shows it released)."""
        obj = self.informers.nodes.get("", node)
        for _ in range(3):
            if obj is None:
                obj = self.api.get(RESOURCES["nodes"], None, node)
            md = obj.get("metadata") or {}
            held = str((md.get("annotations") or {}).get(kube_ann.HAMI_NODE_LOCK) or "")
            if held and not self._stale(held, ns, pod, now, node):
                return f"node {node} is locked by {held}"
            if self._take(node, md, ns, pod, now):
                return ""
            obj = None  # a concurrent writer was first: read the node fresh
        return f"node {node}: its lock kept changing under us"

    def _take(self, node: str, md: Mapping[str, Any], ns: str, pod: str, now: float) -> bool:
        """Write the lock on the node version read; False on a conflict (someone was first).
        Registered as ours before the write, so its watch event is never missed."""
        value = kube_ann.node_lock_value(ns, pod, now)
        patch = {
            "metadata": {
                "resourceVersion": md.get("resourceVersion", ""),
                "annotations": {kube_ann.HAMI_NODE_LOCK: value},
            }
        }
        with self._cv:
            self._held[node] = h = _Held(value)
        try:
            out = self.api.patch(RESOURCES["nodes"], None, node, patch)
        except ApiError as exc:
            self._forget(node, h)
            if exc.code != 409:
                raise
            return False
        with self._cv:
            h.rv = str((out.get("metadata") or {}).get("resourceVersion") or "")
        return True

    def _forget(self, node: str, h: _Held) -> None:
        with self._cv:
            if self._held.get(node) is h:
                del self._held[node]

    def _stale(self, held: str, ns: str, pod: str, now: float, node: str = "") -> bool:
        """Whether a node lock may be taken over: it is ours, expired, unreadable, or its
        holder is not a pod bound to this node and waiting for its devices (a binder that
        died between taking the lock and binding, or a holder that has started or gone).
        The holder is read fresh: the cache may not show a bind this lane just made."""
        parts = held.split(",")
        if len(parts) < 3 or (parts[1] == ns and parts[2] == pod):
            return True
        try:
            at = datetime.strptime(parts[0], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        except ValueError:
            return True
        if now - at > LOCK_EXPIRE_S:
            return True
        cached = self.informers.pods.get(parts[1], parts[2])
        if cached is not None and _waiting_on(cached, node):
            return False  # bound here, its devices not yet allocated: the usual case, no request
        try:
            holder = self.api.get(RESOURCES["pods"], parts[1], parts[2])
        except ApiError as exc:
            return exc.code == 404
        return not _waiting_on(holder, node)

    def _unlock(self, node: str, ns: str, pod: str) -> None:
        """Release the lock a refused bind took (only if it is still ours)."""
        with self._cv:
            self._held.pop(node, None)  # ours no more either way (a lock left behind goes stale)
        try:
            obj = self.api.get(RESOURCES["nodes"], None, node)
            md = obj.get("metadata") or {}
            held = str((md.get("annotations") or {}).get(kube_ann.HAMI_NODE_LOCK) or "")
            if held.split(",")[1:3] != [ns, pod]:
                return
            patch = {
                "metadata": {
                    "resourceVersion": md.get("resourceVersion", ""),
                    "annotations": {kube_ann.HAMI_NODE_LOCK: None},
                }
            }
            self.api.patch(RESOURCES["nodes"], None, node, patch)
        except ApiError as exc:
            log.info("node %s lock not released (it expires): %s", node, exc)


def _waiting_on(pod: Mapping[str, Any], node: str) -> bool:
    """Bound to ``node`` and not started: HAMi's plugin has not allocated its devices yet."""
    phase = str((pod.get("status") or {}).get("phase", ""))
    on = str((pod.get("spec") or {}).get("nodeName") or "")
    return on == node and phase not in ("Running", "Succeeded", "Failed")


__all__ = ["BindJob", "BindResult", "Binder"]
