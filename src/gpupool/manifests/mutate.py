"""What the mutating admission webhook does to an object bound for a gpupool queue.

Why a webhook at all: Kubernetes objects are created by kubectl, operators and CI systems that
know nothing of gpupool. Three changes make them gpupool's: pods name gpupool as their
scheduler (kube-scheduler leaves them alone), owners that can be suspended start suspended
(gpupool unsuspends them when the gang is admitted, as Kueue does), and pods tolerate the taint
that keeps other schedulers off gpupool's GPU nodes. Fractional-GPU requests written for KAI,
HAMi or Volcano are rewritten into gpupool's form, HAMi's container resources (one
``nvidia.com/gpu`` device slot, ``nvidia.com/gpucores``, ``nvidia.com/gpumem``): the one form
the backend's translation reads for a share (``gpupool.kube.translate.resources``; it refuses a
pod that states a share twice) and the one the HAMi device plugin on the node enforces. KAI's
annotations and Volcano's resources are replaced (neither scheduler's device plugin serves
them); HAMi's are kept. gpupool's own ``gpupool.io/gpu-milli`` annotations are written when it
binds the pod, not here.

Everything here is pure: an object in, the changed copy out; :func:`json_patch` turns the
difference into the RFC 6902 patch the API server applies.

Why with the manifests rather than in ``gpupool.deploy``: the webhook's route
(``gpupool.service.routes.webhooks``) and the deploy tools (the queue label of a namespace)
both use it, and a pure translation of objects belongs below both; in ``deploy`` it made the
service import a package above it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpupool import quantity as qty
from gpupool.manifests import HAMI_CORES, HAMI_MEM, KAI_FRACTION, KAI_MEMORY, KUEUE_QUEUE_LABEL

SCHEDULER_NAME = "gpupool"
QUEUE_LABEL = "gpupool.io/queue"
QUEUE_LABELS = (KUEUE_QUEUE_LABEL, QUEUE_LABEL)
TAINT_KEY = "gpupool.io/managed"
TOLERATION = {"key": TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
GPU = "nvidia.com/gpu"
VOLCANO_NUMBER = "volcano.sh/vgpu-number"
VOLCANO_MEMORY = "volcano.sh/vgpu-memory"
VOLCANO_CORES = "volcano.sh/vgpu-cores"
_VOLCANO = (VOLCANO_NUMBER, VOLCANO_MEMORY, VOLCANO_CORES)


class MutationError(ValueError):
    """A request key gpupool cannot read; ``field`` is its path in the object."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True, slots=True)
class Kind:
    """How to reach the pod templates of one kind, and how it is suspended."""

    group: str
    kind: str
    suspend: tuple[str, ...] | None  # path of the suspend flag, None: the kind has none


KINDS = (
    Kind("", "Pod", None),
    Kind("batch", "Job", ("spec", "suspend")),
    Kind("jobset.x-k8s.io", "JobSet", ("spec", "suspend")),
    Kind("kubeflow.org", "PyTorchJob", ("spec", "runPolicy", "suspend")),
)
_BY_KIND = {(k.group, k.kind): k for k in KINDS}


def queue_of(obj: dict[str, Any]) -> str | None:
    """The gpupool queue an object names in its labels (Kueue's label first, as Kueue users write it)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key in QUEUE_LABELS:
        if isinstance(labels.get(key), str) and labels[key]:
            return str(labels[key])
    return None


def pod_templates(kind: Kind, obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, pod template) for every pod an object creates; a Pod is its own template."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind.kind == "Pod":
        yield "", obj
    elif kind.kind == "Job":
        yield from _template("spec.template", spec.get("template"))
    elif kind.kind == "JobSet":
        for i, rj in enumerate(_list(spec.get("replicatedJobs"))):
            job_spec = ((rj.get("template") or {}).get("spec")) or {}
            yield from _template(f"spec.replicatedJobs[{i}].template.spec.template", job_spec.get("template"))
    elif kind.kind == "PyTorchJob":
        replicas = spec.get("pytorchReplicaSpecs") or {}
        for role in sorted(replicas) if isinstance(replicas, dict) else ():
            yield from _template(
                f"spec.pytorchReplicaSpecs.{role}.template", (replicas[role] or {}).get("template")
            )


def _template(path: str, t: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(t, dict):
        t.setdefault("spec", {})
        if isinstance(t["spec"], dict):
            yield path, t


def _list(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def mutate(group: str, kind_name: str, obj: dict[str, Any], queue: str | None = None) -> dict[str, Any]:
    """The object as gpupool needs it (a changed copy); unknown kinds come back unchanged.
    ``queue``: the queue of the object's namespace, written as its ``gpupool.io/queue`` label
    when it names none (the backend reads the queue from the object). Raises MutationError
    naming the field of an unreadable fractional-GPU request."""
    kind = _BY_KIND.get((group, kind_name))
    out = copy.deepcopy(obj)
    if kind is None:
        return out
    if queue and queue_of(out) is None:
        meta = out.setdefault("metadata", {})
        if isinstance(meta, dict):
            labels: dict[str, Any] = meta["labels"] if isinstance(meta.get("labels"), dict) else {}
            meta["labels"] = {**labels, QUEUE_LABEL: queue}
    if kind.suspend is not None:
        _set_path(out, kind.suspend, True)
    for path, template in pod_templates(kind, out):
        _mutate_pod(path, template)
    return out


def _set_path(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = value


def _mutate_pod(path: str, pod: dict[str, Any]) -> None:
    spec = pod["spec"]
    spec["schedulerName"] = SCHEDULER_NAME
    tolerations = spec.get("tolerations") if isinstance(spec.get("tolerations"), list) else []
    if not any(_tolerates(t) for t in tolerations):
        spec["tolerations"] = [*tolerations, dict(TOLERATION)]
    _translate_fractions(path, pod)


def _tolerates(t: Any) -> bool:
    """True when toleration ``t`` already covers gpupool's taint."""
    if not isinstance(t, dict) or t.get("effect") not in (None, "", "NoSchedule"):
        return False
    if t.get("operator") == "Exists":
        return t.get("key") in (None, "", TAINT_KEY)
    return t.get("key") == TAINT_KEY and t.get("value") == "true"


def _translate_fractions(path: str, pod: dict[str, Any]) -> None:
    """Read the KAI, HAMi or Volcano fractional keys; write them as HAMi's container resources."""
    meta = pod.get("metadata", {})
    if not isinstance(meta, dict):
        raise MutationError(f"{path}.metadata" if path else "metadata", "must be an object")
    ann: dict[str, Any] = meta["annotations"] if isinstance(meta.get("annotations"), dict) else {}
    containers = _list(pod["spec"].get("containers"))
    at = f"{path}.metadata.annotations" if path else "metadata.annotations"
    milli, mem = _kai(ann, at)
    target = containers[0] if containers and (milli or mem) else None
    for i, c in enumerate(containers):
        where = f"{path}.spec.containers[{i}].resources" if path else f"spec.containers[{i}].resources"
        m, g = _container_fraction(c, where)
        if (m or g) and target is None:
            target, milli, mem = c, m, g
    if target is None:
        return
    if (
        mem and not milli
    ):  # memory alone: the whole device's compute (HAMi: no core limit), as the backend reads it
        milli = 1000
    _check_share(target, milli, at)
    if any(k in ann for k in (KAI_FRACTION, KAI_MEMORY)):  # moved into the container's resources
        meta["annotations"] = {k: v for k, v in ann.items() if k not in (KAI_FRACTION, KAI_MEMORY)}
    hami = {GPU: 1, HAMI_CORES: milli // 10 or 1, **({HAMI_MEM: mem} if mem else {})}
    res = target.setdefault("resources", {})
    res["limits"] = {**(res.get("limits") or {}), **hami}
    if isinstance(res.get("requests"), dict) and any(k in res["requests"] for k in hami):
        res["requests"] = {**res["requests"], **hami}  # extended resources: requests equal limits


def _check_share(target: dict[str, Any], milli: int, at: str) -> None:
    """The rules the backend applies to a share (gpupool.kube.translate.resources), located in the object."""
    if not 0 < milli <= 1000:
        raise MutationError(at, "the compute share of one GPU must be between 0 and 1 (1 to 100 gpucores)")
    res = target.get("resources") or {}
    limits = (res.get("limits") or {}) if isinstance(res, dict) else None
    if not isinstance(limits, dict):
        raise MutationError(f"{at}: the container's resources", "must be an object with limits as a map")
    try:
        whole = qty.count(limits.get(GPU, 1))
    except qty.QuantityError as exc:
        raise MutationError(f"{at}: limits.{GPU}", str(exc)) from None
    if whole > 1:
        raise MutationError(at, f"a pod takes whole GPUs or a share of one GPU, not both ({GPU}: {whole})")


def _kai(ann: dict[str, Any], at: str) -> tuple[int, int]:
    milli = mem = 0
    for key in (KAI_FRACTION, KAI_MEMORY):
        if key not in ann:
            continue
        try:
            if key == KAI_FRACTION:
                milli = qty.gpu_milli(ann[key])
            else:
                mem = qty.mib_value(ann[key])
        except qty.QuantityError as exc:
            raise MutationError(f"{at}.{key}", str(exc)) from None
    if KAI_FRACTION in ann and not 0 < milli < 1000:
        raise MutationError(f"{at}.{KAI_FRACTION}", "must be a fraction between 0 and 1")
    return milli, mem


def _container_fraction(c: dict[str, Any], where: str) -> tuple[int, int]:
    """(gpu milli, memory MiB) one container asks for with HAMi's or Volcano's keys; removes Volcano's."""
    res: dict[str, Any] = c["resources"] if isinstance(c.get("resources"), dict) else {}
    milli = mem = 0
    for part in ("limits", "requests"):
        values = res.get(part)
        if not isinstance(values, dict):
            continue
        try:
            if HAMI_CORES in values:
                milli = qty.count(values[HAMI_CORES]) * 10
            if HAMI_MEM in values:
                mem = qty.mib_value(values[HAMI_MEM])
            if VOLCANO_CORES in values:
                milli = qty.count(values[VOLCANO_CORES]) * 10
            if VOLCANO_MEMORY in values:
                mem = qty.mib_value(values[VOLCANO_MEMORY])
        except qty.QuantityError as exc:
            raise MutationError(f"{where}.{part}", str(exc)) from None
        if VOLCANO_NUMBER in values:
            values[GPU] = values.pop(VOLCANO_NUMBER)
        for key in (VOLCANO_MEMORY, VOLCANO_CORES):
            values.pop(key, None)
    return milli, mem


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def json_patch(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """RFC 6902 operations turning ``before`` into ``after``: maps key by key, anything else whole."""
    if isinstance(before, dict) and isinstance(after, dict):
        ops: list[dict[str, Any]] = []
        for k in before:
            if k not in after:
                ops.append({"op": "remove", "path": f"{path}/{_escape(k)}"})
        for k, v in after.items():
            if k not in before:
                ops.append({"op": "add", "path": f"{path}/{_escape(k)}", "value": v})
            else:
                ops.extend(json_patch(before[k], v, f"{path}/{_escape(k)}"))
        return ops
    if before == after and type(before) is type(after):
        return []
    return [{"op": "replace", "path": path, "value": after}]
