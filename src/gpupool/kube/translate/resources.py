"""Pod templates as gpupool pod-group resources, in the forms a gpupool manifest accepts.

Why re-emit rather than copy: a pod spec counts resources per container (plus init containers,
sidecars and overhead) and spreads GPU requests over three vocabularies (``nvidia.com/gpu``
slots, HAMi's ``nvidia.com/gpumem``/``nvidia.com/gpucores``, KAI's ``gpu-fraction``/``gpu-memory``
annotations); a gpupool pod group holds one per-pod request. The translation totals the pod as
the kubelet does and writes each GPU request in the one form the manifest reads for it:

- whole GPUs: ``nvidia.com/gpu: N`` (the sum over containers, the larger of that and any init
  container's);
- a share of one GPU (HAMi ``nvidia.com/gpucores`` and/or ``nvidia.com/gpumem`` beside
  ``nvidia.com/gpu: 1``, or KAI's annotations): ``nvidia.com/gpu: <milli>m`` (or
  ``nvidia.com/gpucores: 100``) plus ``nvidia.com/gpumem: <MiB>``. A HAMi memory limit with
  no compute share gets the whole device's compute (HAMi: no core limit), so gpupool never
  counts a pod as using less than it may;
- KAI's ``gpu-memory`` alone (no ``gpu-fraction``): ``nvidia.com/gpumem: <MiB>`` alone, a
  memory-only share the engine counts as that memory's fraction of a device
  (``engine/memory_share.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool import quantity as qty
from gpupool.kube.inventory import InventoryOptions, PodRequestError, extended_requests, pod_requests
from gpupool.model import ACCELERATORS, NETWORK, STORAGE

GPU = "nvidia.com/gpu"
HAMI_MEM = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_MEM_PERCENT = "nvidia.com/gpumem-percentage"
KAI_FRACTION = "gpu-fraction"
KAI_MEMORY = "gpu-memory"
KAI_DEVICES = "gpu-fraction-num-devices"
EFFECTS = ("NoSchedule", "NoExecute", "PreferNoSchedule")

#: a container's GPU ask: ("whole", milli, 0) or ("share", milli, memory MiB)
Ask = tuple[str, int, int]


class KubeWorkloadError(ValueError):
    """An object gpupool should schedule but cannot read: ``field`` is its JSON path."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def items(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def join(path: str, rest: str) -> str:
    """A JSON path below ``path`` ('' for the object itself, as for a bare pod)."""
    return f"{path}.{rest}" if path else rest


def template_resources(
    template: Mapping[str, Any], path: str, rdma_resource: str = "rdma/hca"
) -> dict[str, Any]:
    """The per-pod resources of a pod template (``path`` is the template's JSON path)."""
    spec = mapping(template.get("spec"))
    try:
        cpu, mem, rdma = pod_requests({"spec": spec}, InventoryOptions(rdma_resource=rdma_resource))
    except PodRequestError as exc:
        raise KubeWorkloadError(join(path, exc.field), exc.problem) from None
    out: dict[str, Any] = {}
    if cpu:
        out["cpu"] = f"{cpu}m"
    if mem:
        out["memory"] = f"{mem}Mi"
    if rdma:
        out["rdma"] = rdma
    out.update(_gpu(spec, mapping(mapping(template.get("metadata")).get("annotations")), path))
    out.update(_other_resources(spec, path))
    if len([k for k in out if k in ACCELERATORS]) > 1:
        raise KubeWorkloadError(join(path, "spec.containers"), "a pod's devices are of one accelerator kind")
    return out


#: what a pod may ask for besides CPU, memory, RDMA and NVIDIA GPUs, in the manifest's names
_OTHERS = (STORAGE, NETWORK, *(k for k in ACCELERATORS if k != GPU))


def _other_resources(spec: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Ephemeral storage (as MiB), network bandwidth (Mbit/s) and Ascend or AMD devices (whole
    ones: those device plugins share none), totalled as the kubelet totals a pod."""
    try:
        got = extended_requests({"spec": spec}, _OTHERS)
    except PodRequestError as exc:
        raise KubeWorkloadError(join(path, exc.field), exc.problem) from None
    out: dict[str, Any] = {}
    for key, value in got.items():
        if key == STORAGE:
            out[key] = f"{qty.storage_mib(int(value))}Mi"
        elif value != value.to_integral_value():
            raise KubeWorkloadError(join(path, f"spec.containers.resources.requests.{key}"), "must be whole")
        else:
            out[key] = int(value)
    return out


def _gpu(spec: Mapping[str, Any], annotations: Mapping[str, Any], path: str) -> dict[str, Any]:
    whole = init_whole = 0
    shares: list[tuple[str, int, int]] = []
    first = ""
    for key in ("containers", "initContainers"):
        for i, c in enumerate(items(spec.get(key))):
            where = join(path, f"spec.{key}[{i}].resources.requests")
            ask = _container_ask(mapping(mapping(c).get("resources")), where)
            if ask is None:
                continue
            first = first or where
            if ask[0] == "share":
                shares.append((where, ask[1], ask[2]))
            elif key == "containers":
                whole += ask[1]
            else:
                init_whole = max(init_whole, ask[1])
    whole = max(whole, init_whole)
    kai = _kai_share(annotations, join(path, "metadata.annotations"))
    if kai is not None:
        if whole or shares:  # located at the KAI key the user wrote
            key = KAI_FRACTION if KAI_FRACTION in annotations else KAI_MEMORY
            raise KubeWorkloadError(join(path, f"metadata.annotations.{key}"), _BOTH)
        shares.append(("", *kai))
    if len(shares) > 1:
        raise KubeWorkloadError(shares[1][0], "only one container of a pod may share a GPU")
    if shares and whole:
        raise KubeWorkloadError(shares[0][0], _BOTH)
    if shares:
        return _share_form(shares[0][1], shares[0][2])
    if not whole:
        return {}
    if whole % 1000 == 0:
        return {GPU: whole // 1000}
    if whole < 1000:
        return {GPU: f"{whole}m"}
    raise KubeWorkloadError(
        f"{first}.{GPU}", "more than one GPU must be a whole number; a fraction must be below 1"
    )


_BOTH = "a pod takes whole GPUs or a share of one GPU, not both"


def _share_form(milli: int, memory: int) -> dict[str, Any]:
    """A share in the manifest's form; ``milli`` 0 is KAI's memory-only share, written as
    ``nvidia.com/gpumem`` alone (the engine turns it into a fraction of a device it fits)."""
    if not milli:
        return {HAMI_MEM: memory}
    out: dict[str, Any] = {GPU: f"{milli}m"} if milli < 1000 else {HAMI_CORES: 100}
    if memory:
        out[HAMI_MEM] = memory
    return out


def _container_ask(res: Mapping[str, Any], where: str) -> Ask | None:
    """What one container asks of GPUs; requests win over limits (extended resources are
    usually written as limits only, which the API server copies into requests)."""
    r = {**mapping(res.get("limits")), **mapping(res.get("requests"))}
    if HAMI_MEM_PERCENT in r:
        raise KubeWorkloadError(
            f"{where}.{HAMI_MEM_PERCENT}", f"not supported; give {HAMI_MEM} in MiB instead"
        )
    if not any(k in r for k in (GPU, HAMI_MEM, HAMI_CORES)):
        return None
    milli = _parse(qty.gpu_milli, r, GPU, where) if GPU in r else 0
    if HAMI_MEM not in r and HAMI_CORES not in r:
        return ("whole", milli, 0) if milli else None
    if milli > 1000:
        raise KubeWorkloadError(
            f"{where}.{GPU}", "a share of more than one GPU per container is not supported"
        )
    memory = _parse(qty.mib_value, r, HAMI_MEM, where) if HAMI_MEM in r else 0
    cores = _parse(qty.count, r, HAMI_CORES, where) if HAMI_CORES in r else 100
    if not 0 < cores <= 100:
        raise KubeWorkloadError(f"{where}.{HAMI_CORES}", "must be a percentage of one GPU between 1 and 100")
    return ("share", cores * 10, memory)


def _parse(parse: Any, values: Mapping[str, Any], key: str, where: str) -> int:
    try:
        n = int(parse(values[key]))
    except qty.QuantityError as exc:
        raise KubeWorkloadError(f"{where}.{key}", str(exc)) from None
    return n


def _kai_share(ann: Mapping[str, Any], where: str) -> tuple[int, int] | None:
    """KAI's fraction annotations as (milli, memory MiB), or None when absent; ``gpu-memory``
    alone is a memory-only share (milli 0)."""
    if KAI_FRACTION not in ann and KAI_MEMORY not in ann:
        return None
    if KAI_DEVICES in ann and str(ann[KAI_DEVICES]).strip() not in ("", "1"):
        raise KubeWorkloadError(f"{where}.{KAI_DEVICES}", "a share of more than one GPU is not supported")
    milli = 0
    if KAI_FRACTION in ann:
        milli = _parse(qty.gpu_milli, ann, KAI_FRACTION, where)
        if not 0 < milli < 1000:
            raise KubeWorkloadError(f"{where}.{KAI_FRACTION}", "must be a fraction between 0 and 1")
    memory = _parse(qty.mib_value, ann, KAI_MEMORY, where) if KAI_MEMORY in ann else 0
    if KAI_MEMORY in ann and memory <= 0:
        raise KubeWorkloadError(f"{where}.{KAI_MEMORY}", "must be a positive amount of GPU memory (MiB)")
    return milli, memory


def tolerations(spec: Mapping[str, Any], path: str) -> list[dict[str, Any]]:
    """A pod spec's tolerations in the manifest's form (an empty key with ``Exists`` tolerates
    every taint: gpupool spells that key ``*``); ``tolerationSeconds`` has no meaning here."""
    out: list[dict[str, Any]] = []
    for i, t in enumerate(items(spec.get("tolerations"))):
        where = join(path, f"spec.tolerations[{i}]")
        t = mapping(t)
        op = t.get("operator") or "Equal"
        key = t.get("key") or ""
        if op not in ("Equal", "Exists") or not isinstance(key, str):
            raise KubeWorkloadError(f"{where}.operator", "must be Equal or Exists, with a string key")
        if not key and op != "Exists":
            raise KubeWorkloadError(f"{where}.key", "an empty key needs operator Exists")
        tol: dict[str, Any] = {"key": key or "*", "operator": op}
        if op == "Equal":
            tol["value"] = str(t.get("value") or "")
        effect = t.get("effect") or None
        if effect is not None:
            if effect not in EFFECTS:
                raise KubeWorkloadError(f"{where}.effect", f"must be one of {', '.join(EFFECTS)}")
            tol["effect"] = effect
        out.append(tol)
    return out


def node_selector(spec: Mapping[str, Any], path: str) -> dict[str, str]:
    raw = spec.get("nodeSelector")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise KubeWorkloadError(join(path, "spec.nodeSelector"), "must map label keys to string values")
    return dict(raw)
