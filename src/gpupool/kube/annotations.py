"""What gpupool writes on a pod when it binds it: its own keys and HAMi's, in HAMi's format.

Why both: gpupool's keys are the canonical record (read back after a restart to rebuild what is
bound where); HAMi's keys make HAMi's device plugin and in-container limiter enforce the exact
devices and the GPU memory limit on real nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    node's devices (index -> UUID); ``pod`` the pod object (its containers decide HAMi's layout)."""
    raise NotImplementedError


def hami_device_string(pod: Mapping[str, Any], uuids: Sequence[str], memory_mib: int, cores: int) -> str:
    """HAMi's per-container device list: ``UUID,NVIDIA,<memMiB>,<cores>:`` per device, ``;`` per
    container, init containers first, containers without GPUs an empty entry."""
    raise NotImplementedError


def read_bound(pod: Mapping[str, Any]) -> BoundPlacement | None:
    """The placement a bound pod carries, or None when gpupool did not bind it."""
    raise NotImplementedError


def node_lock_value(namespace: str, pod: str, now: float) -> str:
    """HAMi's node lock: ``<RFC3339>,<ns>,<pod>``."""
    raise NotImplementedError
