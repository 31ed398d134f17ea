"""Which source key a pod belongs to: its top owner (a Job's JobSet, a ReplicaSet's Deployment)
or its bare pod group. Apart from the source because the status writer asks it too, for every
waiting pod, without a source at hand."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Key = tuple[str, str, str]  # (informer kind, namespace, name or pod group)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


#: controller kind of a pod's owner -> the source's informer name of the top owner
OWNER_KINDS = {
    "Job": "jobs",
    "PyTorchJob": "pytorchjobs",
    "JobSet": "jobsets",
    "Deployment": "deployments",
    "StatefulSet": "statefulsets",
}


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for o in _meta(obj).get("ownerReferences") or []:
        if isinstance(o, Mapping) and o.get("controller"):
            return o
    return None


def owned_by_a_top_kind(obj: Mapping[str, Any]) -> bool:
    """True for an object a managed kind controls (a JobSet's child Job): it is part of its
    owner's workload, never a workload of its own."""
    owner = _controller(obj)
    return owner is not None and str(owner.get("kind") or "") in OWNER_KINDS


def top_owner_key(pod: Mapping[str, Any], jobs: Any, group_of: Callable[[Mapping[str, Any]], str]) -> Key:
    """The source key of the workload a pod belongs to: its top owner (a Job's JobSet, a
    ReplicaSet's Deployment by the pod-template-hash suffix), or its bare pod group."""
    m = _meta(pod)
    ns = str(m.get("namespace") or "")
    owner = _controller(pod)
    if owner is None:
        return ("pods", ns, group_of(pod))
    kind, name = str(owner.get("kind") or ""), str(owner.get("name") or "")
    if kind == "Job" and jobs is not None:
        job = jobs.get(ns, name)
        up = _controller(job) if job is not None else None
        if up is not None and up.get("kind") == "JobSet":
            return ("jobsets", ns, str(up.get("name")))
    if kind == "ReplicaSet":
        suffix = "-" + str((m.get("labels") or {}).get("pod-template-hash") or "")
        return ("deployments", ns, name[: -len(suffix)] if name.endswith(suffix) and suffix != "-" else name)
    return (OWNER_KINDS.get(kind, kind.lower() + "s"), ns, name)
