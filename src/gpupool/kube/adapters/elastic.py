"""Elastic inference (推理弹性): a serving Deployment or StatefulSet as a base and its extras.

A Deployment (or StatefulSet) marked ``gpupool.io/min-replicas: N`` with ``replicas: R``
becomes N + (R - N) workloads:

* the **base**: one workload of N replicas in a non-preemptible priority class (the object's
  own class when it names one, else ``inference-critical``), placed whole, within the serving
  queue's guarantee: it is never preempted;
* one **extra** per replica above N (``<base>-extra-<i>``, i = N..R-1), a one-replica workload in
  a preemptible low class (``gpupool.io/extra-priority-class``, else ``evaluation``): an extra
  borrows idle quota and, being a borrower of the lowest priority, is the first victim when a
  training queue reclaims its guarantee (``engine.preemption.ordering.candidate_order``).

Why one workload per extra and not one elastic workload whose count changes: the engine admits
and preempts whole workloads (a gang is all or nothing, and a workload is immutable once
submitted), so per-replica workloads give each extra its own admission, its own eviction and its
own release — scaling down cancels exactly the extras that went, and their quota is free at the
next cycle — without a resize verb in the engine, the store or the API. The cost is one
workload row per extra replica, which at serving scale (tens of replicas) is nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from gpupool import quantity as qty
from gpupool.kube import annotations as kube_ann
from gpupool.kube.translate.kinds import MIN_REPLICAS
from gpupool.kube.translate.resources import KubeWorkloadError, mapping
from gpupool.kube.translate.slots import STATEFULSET_INDEX
from gpupool.kube.workloads import KubeWorkload, WorkloadDefaults, workload_from_object
from gpupool.manifests import validate_document

#: the priority class of the extras (a preemptible one: the extras must be the first victims)
EXTRA_PRIORITY_CLASS = "gpupool.io/extra-priority-class"
#: on an extra's manifest: the base workload it extends, and its replica index
ELASTIC_OF = "gpupool.io/elastic-of"
ELASTIC_INDEX = "gpupool.io/elastic-index"
DEFAULT_BASE_CLASS = "inference-critical"
DEFAULT_EXTRA_CLASS = "evaluation"
EXTRA_SEP = "-extra-"
ELASTIC_KINDS = frozenset({("apps", "Deployment"), ("apps", "StatefulSet")})
#: the owner kinds whose pods a base and its extras share (the backend's top-owner kinds)
SERVING_KINDS = frozenset(kind for _, kind in ELASTIC_KINDS)
PodKey = tuple[str, str]
P = TypeVar("P", bound=Mapping[str, Any])


@dataclass(frozen=True, slots=True)
class ElasticSet:
    """An elastic object translated: its base and one extra per replica above the minimum."""

    base: KubeWorkload
    extras: tuple[KubeWorkload, ...]
    min_replicas: int
    replicas: int


def _marker(md: Mapping[str, Any], key: str) -> tuple[str, str] | None:
    """(where, value) of a gpupool setting, from the annotations, else the labels."""
    for part in ("annotations", "labels"):
        value = mapping(md.get(part)).get(key)
        if value is not None:
            return f"metadata.{part}.{key}", str(value)
    return None


def min_replicas(obj: Mapping[str, Any]) -> int | None:
    """The object's ``gpupool.io/min-replicas`` (None: not elastic). Raises KubeWorkloadError
    naming the field for a value that is not a whole number of at least 1."""
    api = str(obj.get("apiVersion") or "").split("/", 1)[0]
    if (api, str(obj.get("kind") or "")) not in ELASTIC_KINDS:
        return None
    got = _marker(mapping(obj.get("metadata")), MIN_REPLICAS)
    if got is None:
        return None
    where, value = got
    try:
        n = qty.count(value)
    except qty.QuantityError as exc:
        raise KubeWorkloadError(where, str(exc)) from None
    if n < 1:
        raise KubeWorkloadError(where, f"must be at least 1, got {value!r}")
    return n


def extra_name(base: str, index: int) -> str:
    """The workload name of the extra replica ``index`` of base workload ``base``."""
    return f"{base}{EXTRA_SEP}{index}"


def base_of(name: str) -> tuple[str, int] | None:
    """(base workload, replica index) of an extra's name; None for any other name."""
    head, sep, tail = name.rpartition(EXTRA_SEP)
    return (head, int(tail)) if sep and head and tail.isdigit() else None


def is_elastic_owner(obj: Mapping[str, Any] | None) -> bool:
    """Whether a cached owner is marked ``gpupool.io/min-replicas`` (a bad value counts: the
    source refused it, and nothing of it runs)."""
    if obj is None:
        return False
    try:
        return min_replicas(obj) is not None
    except KubeWorkloadError:
        return False


def _pod_key(pod: Mapping[str, Any]) -> PodKey:
    md = mapping(pod.get("metadata"))
    return str(md.get("namespace") or ""), str(md.get("name") or "")


def _ordinal(pod: Mapping[str, Any]) -> int | None:
    md = mapping(pod.get("metadata"))
    value = mapping(md.get("labels")).get(STATEFULSET_INDEX)
    if not isinstance(value, str) or not value.isdigit():
        tail = str(md.get("name") or "").rpartition("-")[2]
        return int(tail) if tail.isdigit() else None
    return int(value)


def replica_pods(pods: Iterable[P], run: str, kind: str, slots: int, claims: Mapping[PodKey, str]) -> list[P]:
    """The pods of an elastic owner that run ``run`` (its base or one extra) may count as its
    own: those bound to it, and unbound ones no other run of the owner is binding (``claims``:
    pod -> the run whose bind of it is in flight or not yet in the cache).

    Why: the base and every extra bind pods of the same ReplicaSet (or StatefulSet), so without
    this two runs would pick the same pod, and each would take the other's bound pods for its own
    (their ``gpupool.io/decision`` may even be equal: admitted in one cycle). A StatefulSet's
    ordinals stay with their replicas: the base binds ordinals below its ``slots``, extra i
    binds ordinal i, so scaling down (which removes the highest ordinals) takes the extras."""
    extra = base_of(run)
    out = []
    for p in pods:
        owner = mapping(mapping(p.get("metadata")).get("annotations")).get(kube_ann.WORKLOAD)
        if owner:
            if owner == run:
                out.append(p)
            continue
        if claims.get(_pod_key(p), run) != run:
            continue
        n = _ordinal(p) if kind == "StatefulSet" else None
        if n is not None and (n != extra[1] if extra is not None else n >= slots):
            continue
        out.append(p)
    return out


def _replicas(obj: Mapping[str, Any]) -> int:
    value = mapping(obj.get("spec")).get("replicas", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 1


def elastic_workloads(
    obj: Mapping[str, Any], defaults: WorkloadDefaults = WorkloadDefaults()
) -> ElasticSet | None:
    """The base and extras of an elastic object; None when it is not elastic, not managed by
    gpupool, or scaled to zero. Raises KubeWorkloadError for an unreadable object."""
    n = min_replicas(obj)
    if n is None:
        return None
    plain = copy.deepcopy(dict(obj))
    for part in ("annotations", "labels"):
        marks = plain["metadata"].get(part)
        if isinstance(marks, dict):  # the base's shape is read without the gang minimum
            marks.pop(MIN_REPLICAS, None)
    kw = workload_from_object(plain, defaults)
    if kw is None:
        return None
    replicas = _replicas(obj)
    name = str(kw.manifest["metadata"]["name"])
    base = _shaped(kw, name, min(n, replicas), _base_class(kw), preemptible=False)
    md = mapping(obj.get("metadata"))
    extra_class = (_marker(md, EXTRA_PRIORITY_CLASS) or ("", DEFAULT_EXTRA_CLASS))[1]
    extras = tuple(_extra(kw, base, i, extra_class) for i in range(n, replicas))
    return ElasticSet(base, extras, n, replicas)


def _base_class(kw: KubeWorkload) -> str:
    return str(kw.manifest["spec"].get("priorityClass") or DEFAULT_BASE_CLASS)


def _shaped(
    kw: KubeWorkload, name: str, replicas: int, priority_class: str, *, preemptible: bool
) -> KubeWorkload:
    """A copy of ``kw`` with another name, replica count and class (no gang: placed whole).

    ``preemptible`` is written on the workload itself: its task type (``inference``) defaults to
    non-preemptible (docs/engine.md, "Task types"), which would make the extras non-preemptible
    work that may not borrow; the workload's own field wins over the type's default."""
    manifest = copy.deepcopy(kw.manifest)
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    spec["podGroups"][0]["replicas"] = replicas
    spec["priorityClass"] = priority_class
    spec["preemptible"] = preemptible
    spec.pop("gang", None)
    errors: list[str] = []
    if validate_document(manifest, "translated", errors) is None:  # e.g. a name grown too long
        field, _, problem = errors[0].partition(": ")[2].partition(": ")
        raise KubeWorkloadError(field or "metadata.name", problem or errors[0])
    return replace(kw, manifest=manifest, pod_count=replicas)


def _extra(kw: KubeWorkload, base: KubeWorkload, index: int, priority_class: str) -> KubeWorkload:
    base_name = str(base.manifest["metadata"]["name"])
    out = _shaped(kw, extra_name(base_name, index), 1, priority_class, preemptible=True)
    out.manifest["metadata"]["annotations"].update({ELASTIC_OF: base_name, ELASTIC_INDEX: str(index)})
    return out


__all__ = [
    "DEFAULT_BASE_CLASS",
    "DEFAULT_EXTRA_CLASS",
    "ELASTIC_INDEX",
    "ELASTIC_OF",
    "EXTRA_PRIORITY_CLASS",
    "SERVING_KINDS",
    "ElasticSet",
    "base_of",
    "elastic_workloads",
    "extra_name",
    "is_elastic_owner",
    "min_replicas",
    "replica_pods",
]
