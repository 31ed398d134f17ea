"""Binding pods to the exact devices the engine chose: ``POST pods/{name}/binding``.

Why the Binding carries the annotations: the API server copies a Binding's annotations onto the
pod in the same write that sets ``spec.nodeName``, so no pod is ever on a node without the
device record HAMi's device plugin reads (a separate patch could land after the kubelet starts
the container). The ``metadata.uid`` precondition makes the bind refuse a pod that was deleted
and recreated under the same name since the decision.

Why a per-node lane and the node lock: HAMi's plugin finds the pod being allocated through the
node annotation ``hami.io/mutex.lock`` and releases it after ``Allocate``, so binds to one HAMi
node are serialised (as HAMi's own scheduler does); binds to different nodes run in parallel on
a thread pool. A lock whose holder is already running, finished or gone is stale and taken over
(the plugin's own expiry is five minutes, far too long to wait for a pod that has started).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpupool.kube import annotations as kube_ann
from gpupool.kube import inventory
from gpupool.kube.client import RESOURCES, ApiError, KubeApi
from gpupool.kube.informer import Informers, object_key

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


class Binder:
    """Binds pods, in parallel across nodes and in order within one."""

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

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def bind_all(self, jobs: Sequence[BindJob]) -> list[BindResult]:
        """Bind every job: one lane per node, all lanes at once; returns when all are done."""
        lanes: dict[str, list[BindJob]] = defaultdict(list)
        for j in jobs:
            lanes[str(j.placement["node"])].append(j)
        futures = [self.pool.submit(self._lane, node, lane) for node, lane in lanes.items()]
        out: list[BindResult] = []
        for f in futures:
            out.extend(f.result())
        return out

    def _lane(self, node: str, jobs: list[BindJob]) -> list[BindResult]:
        out = []
        for j in jobs:
            try:
                out.append(self.bind(j))
            except Exception as exc:  # one bad pod must not lose the lane's other results
                log.exception("bind of %s failed", object_key(j.pod))
                out.append(BindResult(j, False, message=f"{type(exc).__name__}: {exc}"))
        return out

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
            if self._hami_node(node):
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
        tried first: the patch carries its resourceVersion, so a stale cache costs a 409 and
        a fresh read, never a lost lock. A lock held by the pod this lane bound just before is
        waited for (up to ``lock_wait_s``, watching the cache, no requests) rather than failed:
        the device plugin frees it within moments."""
        deadline = time.monotonic() + self.lock_wait_s
        fresh = False
        while True:
            cached = None if fresh else self.informers.nodes.get("", node)
            obj = cached if cached is not None else self.api.get(RESOURCES["nodes"], None, node)
            fresh = False
            md = obj.get("metadata") or {}
            held = str((md.get("annotations") or {}).get(kube_ann.HAMI_NODE_LOCK) or "")
            if not held or self._stale(held, ns, pod, now, node):
                if self._take(node, md, ns, pod, now):
                    return ""
                fresh, held = True, "a concurrent writer"
            if time.monotonic() >= deadline:
                return f"node {node} is locked by {held}"
            if not fresh:
                self._wait_release(node, held, deadline)

    def _take(self, node: str, md: Mapping[str, Any], ns: str, pod: str, now: float) -> bool:
        """Write the lock on the node version read; False on a conflict (someone was first)."""
        patch = {
            "metadata": {
                "resourceVersion": md.get("resourceVersion", ""),
                "annotations": {kube_ann.HAMI_NODE_LOCK: kube_ann.node_lock_value(ns, pod, now)},
            }
        }
        try:
            self.api.patch(RESOURCES["nodes"], None, node, patch)
        except ApiError as exc:
            if exc.code != 409:
                raise
            return False
        return True

    def _wait_release(self, node: str, held: str, deadline: float) -> None:
        """Until the cached node shows another lock value (or none), or the deadline."""
        while time.monotonic() < deadline:
            obj = self.informers.nodes.get("", node) or {}
            now_held = str(
                ((obj.get("metadata") or {}).get("annotations") or {}).get(kube_ann.HAMI_NODE_LOCK) or ""
            )
            if now_held != held:
                return
            time.sleep(0.005)

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
