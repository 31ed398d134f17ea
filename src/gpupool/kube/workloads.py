"""Kubernetes objects as gpupool Workloads (Kueue's admission surface, KAI's top-owner grouping).

Why a gpupool manifest and not a model object: the manifest goes through the same validation,
authorization and admission policy as a submission over the API (``service.routes.workloads
.prepare``), so a Job created with kubectl meets exactly the rules a ``gpupool submit`` meets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

QUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "gpupool.io/queue")


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The top owner a workload stands for."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True, slots=True)
class PodSlot:
    """Which placement pod (group, index) a pod fills."""

    group: str
    index: int


@dataclass(frozen=True, slots=True)
class KubeWorkload:
    """A top owner translated: the gpupool manifest, and how to act on the owner."""

    ref: ObjectRef
    #: a gpupool ``Workload`` manifest (apiVersion gpupool.io/v1alpha1) that ``prepare`` accepts;
    #: ``metadata.name`` is ``workload_name(ref)``; ``metadata.annotations`` keep the object's key
    manifest: dict[str, Any]
    #: the owner has ``spec.suspend`` (Job, JobSet, PyTorchJob): unsuspend to admit, re-suspend to preempt
    suspendable: bool
    #: pods are expected to exist before binding (all kinds: the gang binds once its pods exist)
    pod_count: int


class KubeWorkloadError(ValueError):
    """An object gpupool should schedule but cannot read: ``field`` is its JSON path."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True, slots=True)
class WorkloadDefaults:
    """Per-namespace defaults: the queue of a namespace that names none (namespace quota)."""

    namespace_queues: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = "gpupool"


def workload_name(ref: ObjectRef) -> str:
    """A deterministic gpupool workload name (DNS subdomain, at most 253) for a top owner."""
    raise NotImplementedError


def workload_from_object(
    obj: Mapping[str, Any], defaults: WorkloadDefaults = WorkloadDefaults()
) -> KubeWorkload | None:
    """A top-owner object (Job, PyTorchJob, JobSet, Deployment, StatefulSet) as a workload;
    None when gpupool does not manage it (no queue label and no namespace default).
    Raises KubeWorkloadError for a managed object it cannot read."""
    raise NotImplementedError


def workload_from_pods(
    pods: Sequence[Mapping[str, Any]], defaults: WorkloadDefaults = WorkloadDefaults()
) -> KubeWorkload | None:
    """Bare pods of one group (a single pod, or a pod group by its gang marker) as a workload."""
    raise NotImplementedError


def owner_chain_key(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of the pod's controller owner, or None for a bare pod."""
    raise NotImplementedError


def pod_group_key(pod: Mapping[str, Any]) -> str | None:
    """The gang a bare pod belongs to, from the markers in their documented order, or None."""
    raise NotImplementedError


def pod_slot(pod: Mapping[str, Any], kw: KubeWorkload) -> PodSlot | None:
    """The placement slot a pod fills when its kind says (completion index, replica index)."""
    raise NotImplementedError
