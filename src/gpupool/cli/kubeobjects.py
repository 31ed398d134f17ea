"""Kubernetes objects in a manifest set (a ``batch/v1`` Job with Kueue's queue-name label, a
PyTorchJob, a JobSet...) turned into gpupool Workloads, so ``gpupool submit -f job.yaml`` works
on every backend.

Why the Kubernetes backend's own conversion (:func:`gpupool.kube.workloads.workload_from_object`):
the same Job must become the same Workload whether the cluster's watch sees it or a user
submits the file; two translations would drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.manifests import API_VERSION

#: the namespace kubectl assumes for an object that names none
DEFAULT_NAMESPACE = "default"


def is_kube_object(raw: object) -> bool:
    """A document of another API than gpupool's that the Kubernetes backend can schedule."""
    if not isinstance(raw, Mapping) or raw.get("apiVersion") == API_VERSION:
        return False
    from gpupool.kube.translate.kinds import KINDS

    api = str(raw.get("apiVersion") or "")
    group = api.split("/", 1)[0] if "/" in api else ""
    return (group, str(raw.get("kind") or "")) in KINDS


def to_workload(raw: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The Workload manifest of a Kubernetes object, or the problem that keeps it from being one."""
    from gpupool.kube.workloads import KubeWorkloadError, workload_from_object

    md = dict(raw.get("metadata") or {}) if isinstance(raw.get("metadata"), Mapping) else {}
    md.setdefault("namespace", DEFAULT_NAMESPACE)
    try:
        kw = workload_from_object({**raw, "metadata": md})
    except KubeWorkloadError as exc:
        return None, f"{exc.field}: {exc.problem}"
    if kw is None:
        return None, (
            "metadata.labels: a Kubernetes object is submitted through its Kueue queue "
            "(label kueue.x-k8s.io/queue-name) and must ask for at least one pod"
        )
    return kw.manifest, None
