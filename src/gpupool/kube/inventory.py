"""Cluster nodes as gpupool inventory.

Why a node's CPU and memory are reduced by the pods gpupool does not manage: those pods were
placed by another scheduler (the default one, a DaemonSet controller) and really occupy the
machine; the engine must see only what is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpupool import quantity as qty
from gpupool.kube.accelerators import accelerator_kind, other_devices
from gpupool.kube.translate.hami import RegisterError, parse_register
from gpupool.kube.translate.models import model_name
from gpupool.model import NETWORK, STORAGE, Node, Taint

#: GPU feature discovery labels (NVIDIA gpu-feature-discovery)
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per device
GPU_COUNT = "nvidia.com/gpu.count"
GPU_CLIQUE = "nvidia.com/gpu.clique"  # NVLink domain
HAMI_REGISTER = "hami.io/node-nvidia-register"
#: an administrator's override of the model name derived from the product label
GPU_MODEL_OVERRIDE = "gpupool.io/gpu-model"


@dataclass(frozen=True, slots=True)
class Device:
    """One physical GPU of a node, as HAMi registers it (or index-only when HAMi is absent)."""

    index: int
    uuid: str
    memory_mib: int
    healthy: bool = True
    model: str = ""


@dataclass(frozen=True, slots=True)
class InventoryOptions:
    rack_label: str = "topology.kubernetes.io/zone"
    gpu_resource: str = "nvidia.com/gpu"
    rdma_resource: str = "rdma/hca"
    scheduler_name: str = "gpupool"
    #: the extended resource a node advertises its bandwidth in (Mbit/s), pods request it by
    network_resource: str = NETWORK


@dataclass(frozen=True, slots=True)
class NodeInventory:
    """A node as the engine sees it, its devices, and why it takes no new work ('' when it does)."""

    node: Node
    devices: tuple[Device, ...]
    ready: bool
    unschedulable_reason: str = ""


def node_inventory(
    node_obj: Mapping[str, Any],
    unmanaged_pods: Iterable[Mapping[str, Any]] = (),
    opts: InventoryOptions = InventoryOptions(),
) -> NodeInventory:
    """A v1 Node object (+ the non-terminal pods on it that gpupool does not manage) as inventory.

    Never raises: a value that cannot be read makes the node not ready, with a reason that
    names the label, annotation or field, so one bad node never stops a cycle for everyone.
    Managed or terminal pods among ``unmanaged_pods`` are skipped (their use is gpupool's own)."""
    md = _mapping(node_obj.get("metadata"))
    labels = _strings(md.get("labels"))
    problems: list[str] = []
    allocatable = _mapping(_mapping(node_obj.get("status")).get("allocatable"))
    kind = accelerator_kind(allocatable, opts)
    if kind == opts.gpu_resource:
        devices = _devices(labels, _strings(md.get("annotations")), allocatable, opts, problems)
        model = _model(labels, devices, problems)
    else:
        count, memory, model = other_devices(kind, labels, allocatable, problems)
        devices = tuple(Device(i, "", memory, model=model) for i in range(count))
    cpu, mem, rdma, storage, net = _free(allocatable, unmanaged_pods, opts, problems)
    taints = _taints(node_obj, problems)
    not_ready = _not_ready(node_obj)
    reasons = [not_ready] if not_ready else []
    if _mapping(node_obj.get("spec")).get("unschedulable") is True:
        reasons.append("cordoned")
    if problems:
        reasons.append("unreadable: " + "; ".join(problems))
    rack, clique = labels.get(opts.rack_label, ""), labels.get(GPU_CLIQUE, "")
    node = Node(
        name=str(md.get("name") or ""),
        gpu_model=model,
        gpu_count=len(devices),
        gpu_memory_mib=min((d.memory_mib for d in devices), default=0),
        cpu_milli=cpu,
        memory_mib=mem,
        rdma=rdma,
        labels=_node_labels(labels, rack, clique),
        taints=taints,
        nvlink_domain=clique,
        rack=rack,
        schedulable=not reasons,
        accelerator=kind,
        ephemeral_storage_mib=storage,
        network_mbps=net,
    )
    ready = not not_ready and not problems
    return NodeInventory(node, devices, ready=ready, unschedulable_reason="; ".join(reasons))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _strings(value: object) -> dict[str, str]:
    """A label or annotation map; non-string values (impossible from a real API server) dropped."""
    return {k: v for k, v in _mapping(value).items() if isinstance(k, str) and isinstance(v, str)}


def _not_ready(node_obj: Mapping[str, Any]) -> str:
    """'' when the Ready condition is True, else the reason text (a node with no Ready condition
    has never reported, which the node controller treats as Unknown)."""
    conds = _mapping(node_obj.get("status")).get("conditions")
    for c in conds if isinstance(conds, list) else ():
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            if c.get("status") == "True":
                return ""
            return f"NotReady: {c.get('message') or c.get('reason') or 'Ready is ' + str(c.get('status'))}"
    return "NotReady: the node reports no Ready condition"


def _devices(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    allocatable: Mapping[str, Any],
    opts: InventoryOptions,
    problems: list[str],
) -> tuple[Device, ...]:
    """HAMi's register when present (its length is the device count: HAMi advertises split slots
    as ``nvidia.com/gpu``), else ``nvidia.com/gpu.count`` or allocatable, indices 0..n-1."""
    if HAMI_REGISTER in annotations:
        try:
            return _register(annotations[HAMI_REGISTER])
        except RegisterError as exc:
            problems.append(f"annotation {HAMI_REGISTER}: {exc}")
            return ()
    count = _label_count(labels, allocatable, opts, problems)
    memory = 0
    if count and GPU_MEMORY not in labels:
        problems.append(f"label {GPU_MEMORY}: missing on a node with {count} GPUs")
    elif count:
        memory = _label_int(labels, GPU_MEMORY, problems)
    return tuple(Device(i, "", memory) for i in range(count))


def _register(text: str) -> tuple[Device, ...]:
    rows = parse_register(text, model_name)
    return tuple(Device(index, uuid, mem, healthy, model) for index, uuid, mem, healthy, model in rows)


def _label_count(
    labels: Mapping[str, str], allocatable: Mapping[str, Any], opts: InventoryOptions, problems: list[str]
) -> int:
    if GPU_COUNT in labels:
        return _label_int(labels, GPU_COUNT, problems)
    if opts.gpu_resource not in allocatable:
        return 0
    try:
        return qty.count(allocatable[opts.gpu_resource])
    except qty.QuantityError as exc:
        problems.append(f"status.allocatable.{opts.gpu_resource}: {exc}")
        return 0


def _label_int(labels: Mapping[str, str], key: str, problems: list[str]) -> int:
    text = labels[key].strip()
    if not text.isdigit():
        problems.append(f"label {key}: expected a whole number, got {labels[key]!r}")
        return 0
    return int(text)


def _model(labels: Mapping[str, str], devices: tuple[Device, ...], problems: list[str]) -> str:
    """The admin's ``gpupool.io/gpu-model`` label, else the normalised GFD product, else HAMi's type."""
    if not devices:
        return ""
    if GPU_MODEL_OVERRIDE in labels:
        return labels[GPU_MODEL_OVERRIDE]
    memory = min(d.memory_mib for d in devices)
    model = model_name(labels.get(GPU_PRODUCT, ""), memory) or next((d.model for d in devices if d.model), "")
    if not model:
        problems.append(f"label {GPU_PRODUCT}: missing or names no GPU ({labels.get(GPU_PRODUCT, '')!r})")
    return model


def _free(
    alloc: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    opts: InventoryOptions,
    problems: list[str],
) -> tuple[int, int, int, int, int]:
    """Allocatable CPU, memory, RDMA, ephemeral storage (MiB) and network bandwidth (Mbit/s, an
    extended resource the administrator advertises) minus what the other schedulers' pods
    request (never < 0)."""
    have = [0, 0, 0, 0, 0]
    parsers = (
        ("cpu", qty.cpu_milli),
        ("memory", qty.memory_mib),
        (opts.rdma_resource, qty.count),
        (STORAGE, qty.storage_mib),
        (opts.network_resource, qty.bandwidth_mbps),
    )
    for i, (key, parse) in enumerate(parsers):
        if key not in alloc:
            if key in ("cpu", "memory"):
                problems.append(f"status.allocatable.{key}: missing")
            continue
        try:
            have[i] = parse(alloc[key])
        except qty.QuantityError as exc:
            problems.append(f"status.allocatable.{key}: {exc}")
    for pod in pods:
        if is_managed(pod, opts) or _terminal(pod):
            continue
        try:
            used = [*pod_requests(pod, opts), *_storage_and_net(pod, opts)]
        except PodRequestError as exc:
            pmd = _mapping(pod.get("metadata"))
            problems.append(f"pod {pmd.get('namespace', '')}/{pmd.get('name', '')}: {exc}")
            continue
        have = [h - u for h, u in zip(have, used, strict=True)]
    return max(have[0], 0), max(have[1], 0), max(have[2], 0), max(have[3], 0), max(have[4], 0)


def _storage_and_net(pod: Mapping[str, Any], opts: InventoryOptions) -> tuple[int, int]:
    got = extended_requests(pod, (STORAGE, opts.network_resource))
    sto = got.get(STORAGE, Decimal(0)) / (2**20)
    return int(sto.to_integral_value(rounding="ROUND_CEILING")), qty.bandwidth_mbps(
        int(got.get(opts.network_resource, 0))
    )


def _terminal(pod: Mapping[str, Any]) -> bool:
    return _mapping(pod.get("status")).get("phase") in ("Succeeded", "Failed")


def _node_labels(labels: Mapping[str, str], rack: str, clique: str) -> tuple[tuple[str, str], ...]:
    """The node's labels, plus the topology labels a manifest-built node carries (so pools that
    select on them see both backends alike); the node's own labels win."""
    out = dict(labels)
    if rack:
        out.setdefault("gpupool.io/rack", rack)
    if clique:
        out.setdefault("gpupool.io/nvlink-domain", clique)
    return tuple(sorted(out.items()))


def _taints(node_obj: Mapping[str, Any], problems: list[str]) -> tuple[Taint, ...]:
    raw = _mapping(node_obj.get("spec")).get("taints")
    out: list[Taint] = []
    for i, t in enumerate(raw if isinstance(raw, list) else ()):
        if not isinstance(t, Mapping) or not isinstance(t.get("key"), str):
            problems.append(f"spec.taints[{i}]: expected a taint with a key")
            continue
        out.append(Taint(t["key"], str(t.get("value") or ""), str(t.get("effect") or "NoSchedule")))
    return tuple(out)


def hami_devices(node_obj: Mapping[str, Any]) -> tuple[Device, ...] | None:
    """The devices of HAMi's ``hami.io/node-nvidia-register`` annotation, or None when absent.

    Raises RegisterError (a ValueError naming the entry and field) when it cannot be read;
    ``node_inventory`` turns that into a not-ready node instead."""
    text = _strings(_mapping(node_obj.get("metadata")).get("annotations")).get(HAMI_REGISTER)
    return None if text is None else _register(text)


def is_managed(pod: Mapping[str, Any], opts: InventoryOptions = InventoryOptions()) -> bool:
    """True when gpupool schedules this pod (``spec.schedulerName``)."""
    return _mapping(pod.get("spec")).get("schedulerName") == opts.scheduler_name


class PodRequestError(ValueError):
    """A container request that cannot be parsed: ``field`` is its JSON path in the pod."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def pod_requests(pod: Mapping[str, Any], opts: InventoryOptions = InventoryOptions()) -> tuple[int, int, int]:
    """(cpu milli, memory MiB, rdma) a pod requests, as the kubelet counts it (max of init containers).

    The scheduler's rule (``resourcehelper.PodRequests``): the sum over containers; each init
    container runs alone beside the sidecars started before it (init containers with
    ``restartPolicy: Always``), which keep running and add to the sum; the larger of the two
    wins; pod-level ``spec.resources`` replaces that per key; ``spec.overhead`` is added. A key
    missing from ``requests`` falls back to ``limits`` (the API server's default). Raises
    PodRequestError naming the field."""
    total = _pod_totals(pod, ("cpu", "memory", opts.rdma_resource))
    cpu = int((total[0] * 1000).to_integral_value(rounding="ROUND_CEILING"))
    mem = int((total[1] / (2**20)).to_integral_value(rounding="ROUND_CEILING"))
    return cpu, mem, int(total[2].to_integral_value(rounding="ROUND_CEILING"))


def extended_requests(pod: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Decimal]:
    """What a pod requests of each of ``keys`` (ephemeral storage in bytes, accelerators,
    bandwidth), totalled as ``pod_requests`` totals CPU; keys it does not ask for are left out.
    Raises PodRequestError naming the field."""
    return {k: v for k, v in zip(keys, _pod_totals(pod, keys), strict=True) if v}


def _pod_totals(pod: Mapping[str, Any], keys: tuple[str, ...]) -> list[Decimal]:
    spec = _mapping(pod.get("spec"))
    total = [Decimal(0)] * len(keys)
    for i, c in enumerate(_list(spec.get("containers"))):
        total = _add(total, _container(c, keys, f"spec.containers[{i}]"))
    sidecars = [Decimal(0)] * len(keys)
    init_peak = [Decimal(0)] * len(keys)
    for i, c in enumerate(_list(spec.get("initContainers"))):
        req = _container(c, keys, f"spec.initContainers[{i}]")
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            total, sidecars = _add(total, req), _add(sidecars, req)
            init_peak = [max(a, b) for a, b in zip(init_peak, sidecars, strict=True)]
        else:
            init_peak = [max(a, b) for a, b in zip(init_peak, _add(req, sidecars), strict=True)]
    total = [max(a, b) for a, b in zip(total, init_peak, strict=True)]
    pod_level = _mapping(_mapping(spec.get("resources")).get("requests"))
    if pod_level:  # pod-level resources (Kubernetes 1.32+) replace the containers' sum per key
        level = _quantities(pod_level, keys, "spec.resources.requests")
        total = [lv if k in pod_level else t for k, lv, t in zip(keys, level, total, strict=True)]
    return _add(total, _quantities(_mapping(spec.get("overhead")), keys, "spec.overhead"))


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _add(a: list[Decimal], b: list[Decimal]) -> list[Decimal]:
    return [x + y for x, y in zip(a, b, strict=True)]


def _container(c: object, keys: tuple[str, ...], where: str) -> list[Decimal]:
    res = _mapping(_mapping(c).get("resources"))
    merged = {**_mapping(res.get("limits")), **_mapping(res.get("requests"))}
    return _quantities(merged, keys, f"{where}.resources.requests")


def _quantities(values: Mapping[str, Any], keys: tuple[str, ...], where: str) -> list[Decimal]:
    out = [Decimal(0)] * len(keys)
    for i, k in enumerate(keys):
        if k in values:
            try:
                d = qty.parse_quantity(values[k])
            except qty.QuantityError as exc:
                raise PodRequestError(f"{where}.{k}", str(exc)) from None
            if d < 0:
                raise PodRequestError(f"{where}.{k}", "must not be negative")
            out[i] = d
    return out
