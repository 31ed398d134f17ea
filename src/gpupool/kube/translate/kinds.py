"""How each workload kind lays out its pods: the pod groups, their templates and the gang minimum.

Why one small reader per kind (as Kueue's ``PodSets`` and KAI's pod-grouper plugins): every
kind nests its pod templates differently (a Job one template, a PyTorchJob one per replica
type, a JobSet one per replicated Job, each run by ``replicas`` child Jobs) and says in its own
field how many pods must start together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool import quantity as qty
from gpupool.kube.translate import partial
from gpupool.kube.translate.resources import KubeWorkloadError, mapping
from gpupool.model import WorkloadType

MIN_REPLICAS = "gpupool.io/min-replicas"


@dataclass(frozen=True, slots=True)
class Group:
    """One pod group read from an object: its name, pod count and pod template."""

    name: str
    replicas: int
    template: Mapping[str, Any]
    path: str
    parallelism: int = 1


@dataclass(frozen=True, slots=True)
class Kind:
    groups: Callable[[Mapping[str, Any]], list[Group]]
    #: gang minimum from the object and its total pod count (None: all pods)
    gang: Callable[[Mapping[str, Any], int], int | None]
    type: WorkloadType
    #: the path of the owner's suspend flag; () for kinds without one
    suspend: tuple[str, ...]
    #: the spec its pod groups are read from (a Job run reduced: the counts its owner asked for)
    spec: Callable[[Mapping[str, Any]], Mapping[str, Any]] = lambda obj: mapping(obj.get("spec"))


def _count(spec: Mapping[str, Any], key: str, path: str, default: int) -> int:
    value = spec.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KubeWorkloadError(f"{path}{key}", f"expected a whole number of pods, got {value!r}")
    return value


def _job_pods(spec: Mapping[str, Any], path: str) -> int:
    """The pods a Job runs at once: ``parallelism`` (default 1), never more than ``completions``."""
    parallelism = _count(spec, "parallelism", path, 1)
    completions = spec.get("completions")
    if completions is None:
        return parallelism
    return min(parallelism, _count(spec, "completions", path, 1))


def _job_groups(spec: Mapping[str, Any]) -> list[Group]:
    return [Group("main", _job_pods(spec, "spec."), mapping(spec.get("template")), "spec.template")]


def _replica_groups(spec: Mapping[str, Any]) -> list[Group]:
    """Deployment and StatefulSet: ``replicas`` (default 1) pods of one template."""
    return [
        Group("main", _count(spec, "replicas", "spec.", 1), mapping(spec.get("template")), "spec.template")
    ]


#: PyTorchJob replica types: the master first (rank 0), then the others by name
def _pytorch_groups(spec: Mapping[str, Any]) -> list[Group]:
    specs = spec.get("pytorchReplicaSpecs")
    if not isinstance(specs, Mapping) or not specs:
        raise KubeWorkloadError("spec.pytorchReplicaSpecs", "required: the Master and Worker replica specs")
    out = []
    for rtype in sorted(specs, key=lambda t: (str(t).lower() != "master", str(t).lower())):
        path = f"spec.pytorchReplicaSpecs.{rtype}"
        rs = specs[rtype]
        if not isinstance(rs, Mapping):
            raise KubeWorkloadError(path, "expected a replica spec")
        out.append(
            Group(
                str(rtype).lower(),
                _count(rs, "replicas", f"{path}.", 1),
                mapping(rs.get("template")),
                f"{path}.template",
            )
        )
    return out


def _jobset_groups(spec: Mapping[str, Any]) -> list[Group]:
    """One group per replicatedJob: ``replicas`` child Jobs of ``parallelism`` pods each."""
    rjobs = spec.get("replicatedJobs")
    if not isinstance(rjobs, list) or not rjobs:
        raise KubeWorkloadError("spec.replicatedJobs", "required: at least one replicated job")
    out = []
    for i, rj in enumerate(rjobs):
        path = f"spec.replicatedJobs[{i}]"
        rj = mapping(rj)
        name = rj.get("name")
        if not isinstance(name, str) or not name:
            raise KubeWorkloadError(f"{path}.name", "required")
        jspec = mapping(mapping(rj.get("template")).get("spec"))
        per_job = _job_pods(jspec, f"{path}.template.spec.")
        jobs = _count(rj, "replicas", f"{path}.", 1)
        out.append(
            Group(
                name,
                jobs * per_job,
                mapping(jspec.get("template")),
                f"{path}.template.spec.template",
                per_job,
            )
        )
    return out


def _all(obj: Mapping[str, Any], total: int) -> int | None:
    return None


def _pytorch_gang(obj: Mapping[str, Any], total: int) -> int | None:
    policy = mapping(mapping(mapping(obj.get("spec")).get("runPolicy")).get("schedulingPolicy"))
    if policy.get("minAvailable") is None:
        return None
    n = _count(policy, "minAvailable", "spec.runPolicy.schedulingPolicy.", 0)
    return _gang_bound(n, total, "spec.runPolicy.schedulingPolicy.minAvailable")


def _job_gang(obj: Mapping[str, Any], total: int) -> int | None:
    """Kueue's partial admission: ``kueue.x-k8s.io/job-min-parallelism`` (or
    ``gpupool.io/min-member``) admits the Job with at least that many pods, if its completions
    can follow a reduced parallelism (``partial``); without it, all pods together."""
    got = partial.min_parallelism(obj)
    if got is None:
        return None
    n = _gang_bound(got[0], total, got[1])
    if n is not None:
        partial.check_reducible(partial.requested_spec(obj), got[1])
    return n


def _deployment_gang(obj: Mapping[str, Any], total: int) -> int | None:
    """Replicas are elastic: ``gpupool.io/min-replicas`` admits the workload with at least that
    many; without it all replicas are placed together (pods an admission leaves out would wait
    for an admission that never comes)."""
    value = mapping(mapping(obj.get("metadata")).get("annotations")).get(MIN_REPLICAS)
    if value is None:
        return None
    where = f"metadata.annotations.{MIN_REPLICAS}"
    try:
        n = qty.count(value)
    except qty.QuantityError as exc:
        raise KubeWorkloadError(where, str(exc)) from None
    return _gang_bound(n, total, where)


def _gang_bound(n: int, total: int, where: str) -> int | None:
    if n < 1 or n > total:
        raise KubeWorkloadError(where, f"must be between 1 and the {total} pods of the workload")
    return None if n == total else n


_SPEC_SUSPEND = ("spec", "suspend")
_RUN_POLICY_SUSPEND = ("spec", "runPolicy", "suspend")

KINDS: dict[tuple[str, str], Kind] = {
    ("batch", "Job"): Kind(
        _job_groups, _job_gang, WorkloadType.TRAINING, _SPEC_SUSPEND, partial.requested_spec
    ),
    ("kubeflow.org", "PyTorchJob"): Kind(
        _pytorch_groups, _pytorch_gang, WorkloadType.TRAINING, _RUN_POLICY_SUSPEND
    ),
    ("jobset.x-k8s.io", "JobSet"): Kind(_jobset_groups, _all, WorkloadType.TRAINING, _SPEC_SUSPEND),
    ("apps", "Deployment"): Kind(_replica_groups, _deployment_gang, WorkloadType.INFERENCE, ()),
    ("apps", "StatefulSet"): Kind(_replica_groups, _all, WorkloadType.INFERENCE, ()),
}


def kind_of(obj: Mapping[str, Any]) -> Kind | None:
    """The layout of an object's kind (by API group and kind), or None for a kind gpupool
    does not manage."""
    version = str(obj.get("apiVersion") or "")
    group = version.split("/", 1)[0] if "/" in version else ""
    return KINDS.get((group, str(obj.get("kind") or "")))
