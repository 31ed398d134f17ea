"""Indexes over the informer caches that the backend reads every cycle: pods by top owner,
workload name -> top owner, and the devices each node's bound pods occupy.

Why indexes kept by listeners and not scans: ``start`` and the binder ask "which pods are this
workload's" and "is device 3 of node n7 free" thousands of times a second under a burst; each
watch event updates one entry instead.

The top owner of a pod is found from its controller ownerReference, one level further for the
two kinds that own through an intermediate object: a Deployment's pods through their
ReplicaSet (named ``<deployment>-<pod-template-hash>``), a JobSet's through its child Job
(label ``jobset.sigs.k8s.io/jobset-name``). A pod without a controller owner is a bare pod; its
gang (``workloads.pod_group_key``) or itself is its top owner.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from gpupool.kube import annotations as kube_ann
from gpupool.kube import inventory, workloads
from gpupool.kube.runtime.informer import Informers, object_key
from gpupool.kube.source_keys import OWNER_KINDS  # the owner kinds that stand for a workload

#: (kind, namespace, name) of a top owner; kind "Pod" or "PodGroup" for bare pods
Top = tuple[str, str, str]
PodKey = tuple[str, str]

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
TERMINAL = ("Succeeded", "Failed")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def controller_owner(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    for ref in _meta(obj).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return None


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return str((pod.get("status") or {}).get("phase", "")) in TERMINAL


def node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


class Tracker:
    """The indexes, updated from the pod and owner informers' events."""

    def __init__(self, informers: Informers, scheduler_name: str = "gpupool") -> None:
        self.informers = informers
        self.opts = inventory.InventoryOptions(scheduler_name=scheduler_name)
        self.defaults = workloads.WorkloadDefaults(scheduler_name=scheduler_name)
        self._lock = threading.RLock()
        self._top_of: dict[PodKey, Top] = {}
        self._pods_of: dict[Top, set[PodKey]] = defaultdict(set)
        #: workload name -> top owner (owner objects by their metadata; bare pods when seen)
        self._by_name: dict[str, Top] = {}
        self._name_of: dict[Top, str] = {}
        #: node -> pod -> (devices, milli) of the live bound pods gpupool placed
        self._devices: dict[str, dict[PodKey, tuple[tuple[int, ...], int]]] = defaultdict(dict)
        #: the node each pod's device use is filed under (so an event touches one node's entry,
        #: not all of them: a pod event at 1,000 nodes scanned 1,000 dicts)
        self._device_node: dict[PodKey, str] = {}
        #: binds done whose watch event has not arrived yet: pod -> (node, devices, milli)
        self._assumed: dict[PodKey, tuple[str, tuple[int, ...], int]] = {}
        #: nodes whose unmanaged pods changed since the backend last rebuilt their inventory
        self.dirty_nodes: set[str] = set()
        self.listeners: list[Any] = []

    def attach(self) -> None:
        """Listen to the caches (call before they start, so the first list is indexed too)."""
        self.informers.pods.add_listener(self._on_pod)
        for kind, attr in OWNER_KINDS.items():
            getattr(self.informers, attr).add_listener(lambda t, o, k=kind: self._on_owner(k, t, o))

    # -- owners -----------------------------------------------------------------------------
    def _on_owner(self, kind: str, typ: str, obj: Mapping[str, Any]) -> None:
        if kind == "Job" and (controller_owner(obj) or ("", ""))[0] == "JobSet":
            return  # a JobSet's child: the JobSet stands for the workload
        ns, name = object_key(obj)
        top = (kind, ns, name)
        with self._lock:
            if typ == "DELETED":
                wname = self._name_of.pop(top, None)
                if wname is not None and self._by_name.get(wname) == top:
                    del self._by_name[wname]
                return
            if top not in self._name_of:
                ref = workloads.ObjectRef(
                    str(obj.get("apiVersion", "")), kind, ns, name, str(_meta(obj).get("uid", ""))
                )
                wname = workloads.workload_name(ref)
                self._name_of[top] = wname
                self._by_name[wname] = top

    def owner_object(self, top: Top) -> dict[str, Any] | None:
        """The cached owner object (the first pod for bare pods), or None when gone."""
        kind, ns, name = top
        if kind in OWNER_KINDS:
            return getattr(self.informers, OWNER_KINDS[kind]).get(ns, name)
        pods = self.pods(top)
        return min(pods, key=lambda p: object_key(p)) if pods else None

    def top_by_name(self, wname: str) -> Top | None:
        with self._lock:
            top = self._by_name.get(wname)
        if top is not None:
            return top
        return self._bare_top(wname)

    def name_of(self, top: Top) -> str | None:
        with self._lock:
            return self._name_of.get(top)

    def _bare_top(self, wname: str) -> Top | None:
        """A bare pod (group) is named by the translation layer from its pods: compute the
        names of the bare tops not yet named (few: most pods have owners)."""
        with self._lock:
            unnamed = [t for t in self._pods_of if t[0] in ("Pod", "PodGroup") and t not in self._name_of]
        for top in unnamed:
            pods = self.pods(top)
            try:
                kw = workloads.workload_from_pods(pods, self.defaults) if pods else None
            except workloads.KubeWorkloadError:
                kw = None
            if kw is None:
                continue
            name = str(kw.manifest.get("metadata", {}).get("name") or workloads.workload_name(kw.ref))
            with self._lock:
                self._name_of[top] = name
                self._by_name[name] = top
        with self._lock:
            return self._by_name.get(wname)

    # -- pods -------------------------------------------------------------------------------
    def top_owner(self, pod: Mapping[str, Any]) -> Top:
        md = _meta(pod)
        ns = str(md.get("namespace") or "")
        owner = controller_owner(pod)
        labels = md.get("labels") or {}
        if owner is None:
            group = workloads.pod_group_key(pod)
            return ("PodGroup", ns, group) if group else ("Pod", ns, str(md.get("name", "")))
        kind, name = owner
        if kind == "ReplicaSet":
            h = str(labels.get("pod-template-hash", ""))
            if h and name.endswith("-" + h):
                return ("Deployment", ns, name[: -len(h) - 1])
            return ("ReplicaSet", ns, name)
        if kind == "Job" and labels.get(JOBSET_LABEL):
            return ("JobSet", ns, str(labels[JOBSET_LABEL]))
        if kind == "Job":
            job = self.informers.jobs.get(ns, name)
            up = controller_owner(job) if job is not None else None
            if up is not None and up[0] == "JobSet":
                return ("JobSet", ns, up[1])
        return (kind, ns, name)

    def _on_pod(self, typ: str, pod: Mapping[str, Any]) -> None:
        key = object_key(pod)
        managed = inventory.is_managed(pod, self.opts)
        with self._lock:
            if not managed:
                node = node_of(pod)
                if node:
                    self.dirty_nodes.add(node)
                return
            old = self._top_of.pop(key, None)
            if old is not None:
                self._pods_of[old].discard(key)
                if not self._pods_of[old]:
                    del self._pods_of[old]
            was = self._device_node.pop(key, None)
            if was is not None:
                self._devices[was].pop(key, None)
            if typ == "DELETED" or node_of(pod) or is_terminal(pod):
                self._assumed.pop(key, None)  # the watch confirms (or ends) the assumed bind
            if typ == "DELETED":
                return
            top = self.top_owner(pod)
            self._top_of[key] = top
            self._pods_of[top].add(key)
            bound = kube_ann.read_bound(pod)
            if bound is not None and node_of(pod) and not is_terminal(pod):
                self._devices[bound.node][key] = (bound.devices, bound.gpu_milli)
                self._device_node[key] = bound.node
        for fn in list(self.listeners):
            fn(typ, pod)

    def pods(self, top: Top) -> list[dict[str, Any]]:
        """The top owner's pods as cached (terminal and deleting ones included)."""
        with self._lock:
            keys = list(self._pods_of.get(top, ()))
        out = []
        for ns, name in keys:
            p = self.informers.pods.get(ns, name)
            if p is not None:
                out.append(p)
        return out

    def device_use(self, node: str, exclude: set[PodKey] | frozenset[PodKey] = frozenset()) -> dict[int, int]:
        """Milli-GPU in use on each device of ``node`` by gpupool's live bound pods (pods that
        are deleting still count: their containers run until they are gone)."""
        use: dict[int, int] = defaultdict(int)
        with self._lock:
            held = list(self._devices.get(node, {}).items())
            held += [(k, (devs, milli)) for k, (n, devs, milli) in self._assumed.items() if n == node]
            for key, (devs, milli) in held:
                if key in exclude:
                    continue
                for d in devs:
                    use[d] += milli
        return use

    def assume(self, pod: Mapping[str, Any], node: str, devices: tuple[int, ...], milli: int) -> None:
        """Hold a bind that succeeded until the watch shows the pod on its node (the
        assumed-placement cache: no other bind may take these devices meanwhile).

        Not when the watch was quicker than the caller: a cached pod already on a node (or
        ended, or gone) is counted from the cache, and an assumption added after it would never
        be cleared, charging a shared device twice (the next pod sharing it never bound). The
        informer updates its cache before it calls ``_on_pod``, which takes this lock too."""
        key = object_key(pod)
        with self._lock:
            cached = self.informers.pods.get(*key)
            if cached is None or node_of(cached) or is_terminal(cached):
                return
            self._assumed[key] = (node, devices, milli)

    def managed_bound(self) -> list[dict[str, Any]]:
        """Every live pod gpupool bound (the restart path's truth)."""
        with self._lock:
            keys = [k for use in self._devices.values() for k in use]
        return [p for k in keys if (p := self.informers.pods.get(*k)) is not None]

    def take_dirty_nodes(self) -> set[str]:
        with self._lock:
            out, self.dirty_nodes = self.dirty_nodes, set()
        return out


__all__ = ["OWNER_KINDS", "Top", "Tracker", "controller_owner", "is_terminal", "node_of"]
