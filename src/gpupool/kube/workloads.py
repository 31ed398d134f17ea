"""Kubernetes objects as gpupool Workloads (Kueue's admission surface, KAI's top-owner grouping).

Why a gpupool manifest and not a model object: the manifest goes through the same validation,
authorization and admission policy as a submission over the API (``service.usecases.submit
.prepare``), so a Job created with kubectl meets exactly the rules a ``gpupool submit`` meets.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool import quantity as qty
from gpupool.kube.annotations import NODE as BOUND_NODE
from gpupool.kube.translate.kinds import MIN_REPLICAS, Group, kind_of
from gpupool.kube.translate.resources import (
    KubeWorkloadError,
    items,
    join,
    mapping,
    node_selector,
    template_resources,
    tolerations,
)
from gpupool.kube.translate.slots import slot_of
from gpupool.manifests import API_VERSION, NAME_PATTERN, validate_document
from gpupool.model import TopologyMode, TopologyScope, WorkloadType

__all__ = [
    "MIN_REPLICAS",
    "QUEUE_LABELS",
    "KubeWorkload",
    "KubeWorkloadError",
    "ObjectRef",
    "PodSlot",
    "WorkloadDefaults",
    "owner_chain_key",
    "pod_group_key",
    "pod_slot",
    "workload_from_object",
    "workload_from_pods",
    "workload_name",
]

QUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "gpupool.io/queue")
PRIORITY_CLASS = "gpupool.io/priority-class"
TYPE = "gpupool.io/type"
DURATION = "gpupool.io/duration"
POOL = "gpupool.io/pool"
TOPOLOGY = "gpupool.io/topology"
#: the object's own retry limit (``spec.maxRetries`` of its workload)
MAX_RETRIES = "gpupool.io/max-retries"
TOPOLOGY_MODE = "gpupool.io/topology-mode"
#: the object a workload stands for, written on its manifest so the runtime can map back
SOURCE = "gpupool.io/source"
SOURCE_UID = "gpupool.io/source-uid"
SOURCE_API_VERSION = "gpupool.io/source-api-version"


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
    #: per pod group, the pods one child Job runs at once (JobSet: a slot is job index x this
    #: + completion index); absent groups run one pod per index
    parallelism: Mapping[str, int] = field(default_factory=dict)
    #: bare pods: the slot of each pod given, by pod name (their kind assigns none)
    slots: Mapping[str, PodSlot] = field(default_factory=dict)
    #: where the owner's suspend flag is (a PyTorchJob keeps it under ``runPolicy``); () if none
    suspend_field: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadDefaults:
    """Per-namespace defaults: the queue of a namespace that names none (namespace quota)."""

    namespace_queues: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = "gpupool"


# -- names ----------------------------------------------------------------------------------
_NAME_RE = re.compile(NAME_PATTERN)
_BAD = re.compile(r"[^a-z0-9.-]+")
#: a namespace is a DNS label and a kind a word: neither holds the dot that separates the parts
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KIND_RE = re.compile(r"^[a-z0-9]+$")
MAX_NAME = 253


def workload_name(ref: ObjectRef) -> str:
    """A deterministic gpupool workload name (DNS subdomain, at most 253) for a top owner.

    ``<namespace>.<kind>.<name>``: a namespace holds no dot and a kind neither, so distinct
    valid refs give distinct names. A part that is not already lowercase DNS text, or a result
    too long, is cut and suffixed with a hash of the exact ref (so it stays distinct)."""
    parts = (ref.namespace, ref.kind.lower(), ref.name)
    plain = ".".join(parts)
    if _LABEL_RE.match(parts[0]) and _KIND_RE.match(parts[1]) and _NAME_RE.match(plain):
        return plain
    digest = hashlib.sha256("\x00".join((ref.namespace, ref.kind, ref.name)).encode()).hexdigest()[:10]
    cleaned = ".".join(_BAD.sub("-", p.lower()).strip("-.") or "x" for p in parts)
    head = cleaned[: MAX_NAME - len(digest) - 1].rstrip("-.")
    return f"{head}-{digest}" if head else digest


# -- objects -----------------------------------------------------------------------------------
def workload_from_object(
    obj: Mapping[str, Any], defaults: WorkloadDefaults = WorkloadDefaults()
) -> KubeWorkload | None:
    """A top-owner object (Job, PyTorchJob, JobSet, Deployment, StatefulSet) as a workload;
    None when gpupool does not manage it (no queue label and no namespace default), when the
    kind is none of these, or when it asks for no pods now (a Deployment scaled to zero).
    Raises KubeWorkloadError for a managed object it cannot read."""
    kind = kind_of(obj)
    if kind is None:
        return None
    md = mapping(obj.get("metadata"))
    queue = _queue(md, defaults)
    if queue is None:
        return None
    ref = _ref(obj)
    groups = kind.groups(kind.spec(obj))
    groups = [g for g in groups if g.replicas > 0]
    if not groups:
        return None
    total = sum(g.replicas for g in groups)
    gang = kind.gang(obj, total)
    manifest = _manifest(ref, md, queue, groups, gang, kind.type)
    parallelism = {g.name: g.parallelism for g in groups if g.parallelism != 1}
    return KubeWorkload(ref, manifest, bool(kind.suspend), total, parallelism, suspend_field=kind.suspend)


def _ref(obj: Mapping[str, Any]) -> ObjectRef:
    md = mapping(obj.get("metadata"))
    name, ns = md.get("name"), md.get("namespace")
    if not isinstance(name, str) or not name:
        raise KubeWorkloadError("metadata.name", "required")
    if not isinstance(ns, str) or not ns:
        raise KubeWorkloadError("metadata.namespace", "required")
    return ObjectRef(
        str(obj.get("apiVersion") or ""), str(obj.get("kind") or ""), ns, name, str(md.get("uid") or "")
    )


def _queue(md: Mapping[str, Any], defaults: WorkloadDefaults) -> str | None:
    labels = mapping(md.get("labels"))
    for key in QUEUE_LABELS:
        value = labels.get(key)
        if isinstance(value, str) and value:
            return value
    return defaults.namespace_queues.get(str(md.get("namespace") or ""))


# -- the manifest ------------------------------------------------------------------------------
def _manifest(
    ref: ObjectRef,
    md: Mapping[str, Any],
    queue: str,
    groups: Sequence[Group],
    gang: int | None,
    default_type: WorkloadType,
) -> dict[str, Any]:
    """The gpupool Workload manifest; checked with the API's own validator before it leaves."""
    spec: dict[str, Any] = {
        "queue": queue,
        "type": _type(md, default_type),
        "podGroups": [
            {"name": g.name, "replicas": g.replicas, "resources": template_resources(g.template, g.path)}
            for g in groups
        ],
    }
    _placement_terms(spec, groups)
    prio = _marker(md, PRIORITY_CLASS) or _template_priority(groups)
    if prio:
        spec["priorityClass"] = prio
    if gang is not None:
        spec["gang"] = {"minMember": gang}
    spec.update(_options(md))
    annotations = {SOURCE: f"{ref.kind}/{ref.namespace}/{ref.name}", SOURCE_API_VERSION: ref.api_version}
    if ref.uid:
        annotations[SOURCE_UID] = ref.uid
    manifest = {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {"name": workload_name(ref), "namespace": ref.namespace, "annotations": annotations},
        "spec": spec,
    }
    _check(manifest)
    return manifest


def _marker(md: Mapping[str, Any], key: str) -> str:
    """A gpupool setting from the object's labels, else its annotations ('' when neither)."""
    for part in ("labels", "annotations"):
        value = mapping(md.get(part)).get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _type(md: Mapping[str, Any], default: WorkloadType) -> str:
    value = _marker(md, TYPE)
    if not value:
        return default.value
    if value not in {t.value for t in WorkloadType}:
        where = "labels" if TYPE in mapping(md.get("labels")) else "annotations"
        raise KubeWorkloadError(
            f"metadata.{where}.{TYPE}", f"must be one of {', '.join(t.value for t in WorkloadType)}"
        )
    return value


def _template_priority(groups: Sequence[Group]) -> str:
    for g in groups:
        value = mapping(g.template.get("spec")).get("priorityClassName")
        if isinstance(value, str) and value:
            return value
    return ""


def _placement_terms(spec: dict[str, Any], groups: Sequence[Group]) -> None:
    """Tolerations every group has (a pod is only placed where it tolerates the taints) and the
    node selectors of all groups (the kubelet refuses a pod whose selector its node misses)."""
    tols: list[dict[str, Any]] | None = None
    selector: dict[str, str] = {}
    for g in groups:
        tspec = mapping(g.template.get("spec"))
        mine = tolerations(tspec, g.path)
        tols = mine if tols is None else [t for t in tols if t in mine]
        for k, v in node_selector(tspec, g.path).items():
            if selector.setdefault(k, v) != v:
                raise KubeWorkloadError(
                    join(g.path, f"spec.nodeSelector.{k}"), "pod groups select different values"
                )
    if tols:
        spec["tolerations"] = tols
    if selector:
        spec["nodeSelector"] = selector


def _options(md: Mapping[str, Any]) -> dict[str, Any]:
    """Duration, pool and topology from the object's gpupool annotations (or labels)."""
    out: dict[str, Any] = {}
    ann = f"metadata.annotations.{DURATION}"
    if duration := _marker(md, DURATION):
        try:
            qty.parse_duration(duration)
        except qty.QuantityError as exc:
            raise KubeWorkloadError(ann, str(exc)) from None
        out["duration"] = duration
    if pool := _marker(md, POOL):
        out["pool"] = pool
    if retries := _marker(md, MAX_RETRIES):
        if not retries.isdigit() or int(retries) > 1000:
            raise KubeWorkloadError(
                f"metadata.annotations.{MAX_RETRIES}", "must be a whole number from 0 to 1000"
            )
        out["maxRetries"] = int(retries)
    if scope := _marker(md, TOPOLOGY):
        if scope not in {s.value for s in TopologyScope}:
            raise KubeWorkloadError(f"metadata.annotations.{TOPOLOGY}", "must be node, nvlink or rack")
        mode = _marker(md, TOPOLOGY_MODE) or TopologyMode.REQUIRED.value
        if mode not in {m.value for m in TopologyMode}:
            raise KubeWorkloadError(f"metadata.annotations.{TOPOLOGY_MODE}", "must be Required or Preferred")
        out["topology"] = {"scope": scope, "mode": mode}
    return out


def _check(manifest: dict[str, Any]) -> None:
    errors: list[str] = []
    if validate_document(manifest, "translated", errors) is None:
        field, _, problem = errors[0].partition(": ")[2].partition(": ")
        raise KubeWorkloadError(field or "metadata", problem or errors[0])


# -- bare pods ---------------------------------------------------------------------------------
#: gang markers of bare pods, in the order they are read (gpupool's, coscheduling, Volcano,
#: Kueue, KAI); each as a label, then as an annotation
GROUP_MARKERS = (
    "gpupool.io/workload",
    "scheduling.x-k8s.io/pod-group",
    "scheduling.k8s.io/group-name",
    "kueue.x-k8s.io/pod-group-name",
    "pod-group-name",
)
GROUP_TOTALS = ("kueue.x-k8s.io/pod-group-total-count", "gpupool.io/group-size")


def pod_group_key(pod: Mapping[str, Any]) -> str | None:
    """The gang a bare pod belongs to, from the markers in their documented order, or None.

    gpupool's own ``gpupool.io/workload`` annotation on a pod gpupool has bound (it also carries
    ``gpupool.io/node``) is the binding record, not a gang marker, and is passed over."""
    md = mapping(pod.get("metadata"))
    labels, ann = mapping(md.get("labels")), mapping(md.get("annotations"))
    bound = BOUND_NODE in ann
    for key in GROUP_MARKERS:
        for part, values in (("labels", labels), ("annotations", ann)):
            if bound and part == "annotations" and key == GROUP_MARKERS[0]:
                continue
            value = values.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def owner_chain_key(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of the pod's controller owner, or None for a bare pod."""
    md = mapping(pod.get("metadata"))
    for ref in items(md.get("ownerReferences")):
        ref = mapping(ref)
        kind, name = ref.get("kind"), ref.get("name")
        if ref.get("controller") is True and isinstance(kind, str) and isinstance(name, str):
            return kind, str(md.get("namespace") or ""), name
    return None


def workload_from_pods(
    pods: Sequence[Mapping[str, Any]], defaults: WorkloadDefaults = WorkloadDefaults()
) -> KubeWorkload | None:
    """Bare pods of one group (a single pod, or a pod group by its gang marker) as a workload.

    Pods of identical resources, tolerations and node selector form one pod group (``main``, or
    ``role-0``, ``role-1``... in the order of the pod names); the group's size is its declared
    total when given (pods not yet created are counted in the first group), else the pods given.
    None when no pod is scheduled by gpupool, or when none names a queue and the namespace has
    no default."""
    mine = sorted((p for p in pods if _scheduler(p) == defaults.scheduler_name), key=_pod_name)
    if not mine:
        return None
    queue = next((q for p in mine if (q := _queue(mapping(p.get("metadata")), defaults))), None)
    if queue is None:
        return None
    ref = _pods_ref(mine)
    groups, slots = _pod_roles(mine, _group_total(mine, len(mine)))
    md = mapping(mine[0].get("metadata"))
    manifest = _manifest(ref, md, queue, groups, None, WorkloadType.BATCH)
    return KubeWorkload(ref, manifest, False, sum(g.replicas for g in groups), slots=slots)


def _scheduler(pod: Mapping[str, Any]) -> object:
    return mapping(pod.get("spec")).get("schedulerName")


def _pod_name(pod: Mapping[str, Any]) -> str:
    return str(mapping(pod.get("metadata")).get("name") or "")


def _pods_ref(pods: Sequence[Mapping[str, Any]]) -> ObjectRef:
    """The single pod itself, or the group (``PodGroup``, named by its marker)."""
    first = _ref({**pods[0], "apiVersion": "v1", "kind": "Pod"})
    if any(str(mapping(p.get("metadata")).get("namespace") or "") != first.namespace for p in pods):
        raise KubeWorkloadError("metadata.namespace", "the pods of one group must share a namespace")
    key = pod_group_key(pods[0])
    marker = f"metadata.labels.{GROUP_MARKERS[0]}"
    if key is None:
        if len(pods) > 1:
            raise KubeWorkloadError(marker, "several pods given without a group marker")
        return first
    if any(pod_group_key(p) != key for p in pods):
        raise KubeWorkloadError(marker, "the pods given name different groups")
    return ObjectRef("v1", "PodGroup", first.namespace, key)


def _group_total(pods: Sequence[Mapping[str, Any]], given: int) -> int:
    """The group's declared size (never below the pods that exist), else the pods given."""
    for p in pods:
        md = mapping(p.get("metadata"))
        for part in ("annotations", "labels"):
            for key in GROUP_TOTALS:
                value = mapping(md.get(part)).get(key)
                if value is None:
                    continue
                if not (isinstance(value, str) and value.strip().isdigit() and int(value) > 0):
                    raise KubeWorkloadError(
                        f"metadata.{part}.{key}", f"expected a positive whole number, got {value!r}"
                    )
                return max(int(value), given)
    return given


def _pod_roles(pods: Sequence[Mapping[str, Any]], total: int) -> tuple[list[Group], dict[str, PodSlot]]:
    """Pods with the same resources and placement terms as one group; each pod's slot in it."""
    shapes: dict[str, list[Mapping[str, Any]]] = {}
    for p in pods:
        spec = mapping(p.get("spec"))
        try:
            shape = repr(
                (template_resources(p, ""), tolerations(spec, ""), sorted(node_selector(spec, "").items()))
            )
        except KubeWorkloadError as exc:
            raise KubeWorkloadError(exc.field, f"{exc.problem} (pod {_pod_name(p)})") from None
        shapes.setdefault(shape, []).append(p)
    members = list(shapes.values())
    names = ["main"] if len(members) == 1 else [f"role-{i}" for i in range(len(members))]
    groups = [Group(n, len(ps), ps[0], "") for n, ps in zip(names, members, strict=True)]
    if total > len(pods):
        groups[0] = Group(groups[0].name, groups[0].replicas + total - len(pods), groups[0].template, "")
    slots = {
        _pod_name(p): PodSlot(n, i) for n, ps in zip(names, members, strict=True) for i, p in enumerate(ps)
    }
    return groups, slots


# -- slots -------------------------------------------------------------------------------------
def pod_slot(pod: Mapping[str, Any], kw: KubeWorkload) -> PodSlot | None:
    """The placement slot a pod fills when its kind says (completion index, replica index);
    None when the kind assigns none, or the index falls outside the group (an Indexed Job
    with more completions than parallelism): the runtime then assigns slots in a stable order."""
    name = _pod_name(pod)
    if name in kw.slots:
        return kw.slots[name]
    md = mapping(pod.get("metadata"))
    marks = {**mapping(md.get("annotations")), **mapping(md.get("labels"))}
    got = slot_of(kw.ref.kind, marks, name, kw.parallelism)
    if got is None:
        return None
    slot = PodSlot(*got)
    sizes = {str(g.get("name")): int(g.get("replicas", 1)) for g in kw.manifest["spec"]["podGroups"]}
    return slot if 0 <= slot.index < sizes.get(slot.group, 0) else None
