"""What gpupool writes on a pod when it binds it: its own keys and HAMi's, in HAMi's format.

Why both: gpupool's keys are the canonical record (read back after a restart to rebuild what is
bound where); HAMi's keys make HAMi's device plugin and in-container limiter enforce the exact
devices and the GPU memory limit on real nodes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpupool.kube.inventory import Device

WORKLOAD = "gpupool.io/workload"
PODSET = "gpupool.io/podset"
POD_INDEX = "gpupool.io/pod-index"
NODE = "gpupool.io/node"
GPU_INDICES = "gpupool.io/gpu-indices"
GPU_UUIDS = "gpupool.io/gpu-uuids"
GPU_MILLI = "gpupool.io/gpu-milli"
GPU_MEMORY_MIB = "gpupool.io/gpu-memory-mib"
DECISION = "gpupool.io/decision"
HAMI_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_NODE = "hami.io/vgpu-node"
HAMI_TIME = "hami.io/vgpu-time"
HAMI_BIND_PHASE = "hami.io/bind-phase"
HAMI_BIND_TIME = "hami.io/bind-time"
HAMI_NODE_LOCK = "hami.io/mutex.lock"


@dataclass(frozen=True, slots=True)
class BoundPlacement:
    """A bound pod's placement read back from its annotations (the restart path)."""

    workload: str
    group: str
    index: int
    node: str
    devices: tuple[int, ...]
    gpu_milli: int
    gpu_memory_mib: int
    uuids: tuple[str, ...] = ()
    decision: str = ""


def binding_annotations(
    workload: str,
    pod_placement: Mapping[str, Any],
    devices: Sequence[Device],
    pod: Mapping[str, Any],
    now: float,
    decision: str = "",
) -> dict[str, str]:
    """The annotations of a pod's Binding. ``pod_placement`` is one entry of a stored placement's
    ``pods`` list (group, index, node, devices, gpuMilli, gpuMemoryMiB, ...); ``devices`` the
    node's devices (index -> UUID); ``pod`` the pod object (its containers decide HAMi's layout).

    Engine device ``i`` is ``devices[i]`` (``node_inventory`` lists them by index, and the node's
    GPU count is their number). HAMi's keys are written only when every chosen device has a UUID
    (the node runs HAMi's device plugin); without one HAMi could not enforce anything.
    Raises ValueError when the placement names a device the node does not have."""
    node = str(pod_placement["node"])
    indices = [int(d) for d in pod_placement.get("devices", ())]
    for i in indices:
        if not 0 <= i < len(devices):
            raise ValueError(f"placement device {i} is not on node {node!r} ({len(devices)} devices)")
    chosen = [devices[i] for i in indices]
    milli = int(pod_placement.get("gpuMilli", 1000)) if indices else 0
    memory = int(pod_placement.get("gpuMemoryMiB", 0) or 0)
    if indices and memory <= 0:  # the engine always sets it; an older stored placement may not
        memory = min(d.memory_mib for d in chosen)
    out = {
        WORKLOAD: workload,
        PODSET: str(pod_placement["group"]),
        POD_INDEX: str(int(pod_placement["index"])),
        NODE: node,
        GPU_INDICES: ",".join(str(i) for i in indices),
        GPU_MILLI: str(milli),
        GPU_MEMORY_MIB: str(memory),
    }
    uuids = [d.uuid for d in chosen]
    if uuids and all(uuids):
        out[GPU_UUIDS] = ",".join(uuids)
        out.update(_hami_keys(pod, uuids, memory, max(milli // 10, 1), node, now))
    if decision:
        out[DECISION] = decision
    return out


def _hami_keys(
    pod: Mapping[str, Any], uuids: list[str], memory: int, cores: int, node: str, now: float
) -> dict[str, str]:
    devices = hami_device_string(pod, uuids, memory, cores)
    stamp = str(int(now))
    return {
        HAMI_TO_ALLOCATE: devices,
        HAMI_ALLOCATED: devices,
        HAMI_NODE: node,
        HAMI_TIME: stamp,
        # the device plugin ends the handshake (allocating -> success) only for a pod whose
        # containers ask it for a device; for any other (KAI's gpu-fraction alone) nothing would
        # ever end it, so the bind ends it here and takes no node lock (``plugin_allocates``)
        HAMI_BIND_PHASE: "allocating" if plugin_allocates(pod) else "success",
        HAMI_BIND_TIME: stamp,
    }


def plugin_allocates(pod: Mapping[str, Any]) -> bool:
    """True when HAMi's device plugin will ``Allocate`` for this pod (some container names a
    GPU resource): only then does it release the node lock and finish the bind handshake."""
    raw = pod.get("spec")
    spec: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    return any(_gpu_count(c) for key in ("initContainers", "containers") for c in _list(spec.get(key)))


#: the container resources that make HAMi's device plugin allocate devices to a container
_GPU_KEYS = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage")


def hami_device_string(pod: Mapping[str, Any], uuids: Sequence[str], memory_mib: int, cores: int) -> str:
    """HAMi's per-container device list: ``UUID,NVIDIA,<memMiB>,<cores>:`` per device, ``;`` per
    container, init containers first, containers without GPUs an empty entry.

    Which container gets which device: containers that ask for GPUs take, in order, as many of
    the devices as their ``nvidia.com/gpu`` count (HAMi rejects a container whose device count
    differs); a shared device (one device, below a whole GPU's cores) goes to every GPU container;
    devices left over go to the last GPU container; a pod whose containers name no GPU resource
    (KAI-style annotations) has them on its first regular container."""
    raw = pod.get("spec")
    spec: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    containers = [c for key in ("initContainers", "containers") for c in _list(spec.get(key))]
    counts = [_gpu_count(c) for c in containers]
    if not any(counts) and uuids:
        first = len(_list(spec.get("initContainers")))
        counts = [1 if i == first else 0 for i in range(len(containers))] or [1]
    per = _split(list(uuids), counts, shared=len(uuids) == 1 and cores < 100)
    return "".join("".join(f"{u},NVIDIA,{memory_mib},{cores}:" for u in devs) + ";" for devs in per)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _gpu_count(container: object) -> int:
    """How many devices a container asks HAMi for (0 when it names no GPU resource)."""
    res = container.get("resources") if isinstance(container, Mapping) else None
    res = res if isinstance(res, Mapping) else {}
    merged: dict[str, Any] = {}
    for part in ("limits", "requests"):
        if isinstance(res.get(part), Mapping):
            merged.update(res[part])
    if not any(k in merged for k in _GPU_KEYS):
        return 0
    text = str(merged.get("nvidia.com/gpu", "1")).strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1


def _split(uuids: list[str], counts: list[int], shared: bool) -> list[list[str]]:
    if shared:
        return [list(uuids) if n else [] for n in counts]
    out: list[list[str]] = []
    rest = list(uuids)
    for n in counts:
        out.append(rest[:n])
        rest = rest[n:]
    last = max((i for i, n in enumerate(counts) if n), default=None)
    if rest and last is not None:
        out[last].extend(rest)
    return out


_INDICES = re.compile(r"^(\d+(,\d+)*)?$")


def read_bound(pod: Mapping[str, Any]) -> BoundPlacement | None:
    """The placement a bound pod carries, or None when gpupool did not bind it.

    None also for a pod whose keys are malformed, or whose ``spec.nodeName`` disagrees with
    ``gpupool.io/node`` (a Binding sets both at once, so a mismatch means another writer);
    never raises, because the restart path reads every pod of the cluster."""
    md = pod.get("metadata")
    ann = md.get("annotations") if isinstance(md, Mapping) else None
    if not isinstance(ann, Mapping):
        return None
    try:
        keys = [ann[k] for k in (WORKLOAD, PODSET, POD_INDEX, NODE, GPU_INDICES, GPU_MILLI, GPU_MEMORY_MIB)]
    except KeyError:
        return None
    if not all(isinstance(v, str) for v in keys):
        return None
    workload, group, index, node, indices, milli, memory = keys
    if not (workload and group and node and index.isdigit() and milli.isdigit() and memory.isdigit()):
        return None
    if not _INDICES.match(indices):
        return None
    spec = pod.get("spec")
    bound_to = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if bound_to and bound_to != node:
        return None
    uuids = ann.get(GPU_UUIDS)
    return BoundPlacement(
        workload,
        group,
        int(index),
        node,
        tuple(int(i) for i in indices.split(",")) if indices else (),
        int(milli),
        int(memory),
        tuple(uuids.split(",")) if isinstance(uuids, str) and uuids else (),
        str(ann.get(DECISION, "")),
    )


def node_lock_value(namespace: str, pod: str, now: float) -> str:
    """HAMi's node lock: ``<RFC3339>,<ns>,<pod>`` (seconds, UTC, as Go's ``time.RFC3339`` writes it)."""
    stamp = datetime.fromtimestamp(int(now), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp},{namespace},{pod}"
