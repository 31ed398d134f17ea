"""Cluster nodes as gpupool inventory.

Why a node's CPU and memory are reduced by the pods gpupool does not manage: those pods were
placed by another scheduler (the default one, a DaemonSet controller) and really occupy the
machine; the engine must see only what is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.model import Node

#: GPU feature discovery labels (NVIDIA gpu-feature-discovery)
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB per device
GPU_COUNT = "nvidia.com/gpu.count"
GPU_CLIQUE = "nvidia.com/gpu.clique"  # NVLink domain
HAMI_REGISTER = "hami.io/node-nvidia-register"


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
    """A v1 Node object (+ the non-terminal pods on it that gpupool does not manage) as inventory."""
    raise NotImplementedError


def hami_devices(node_obj: Mapping[str, Any]) -> tuple[Device, ...] | None:
    """The devices of HAMi's ``hami.io/node-nvidia-register`` annotation, or None when absent."""
    raise NotImplementedError


def is_managed(pod: Mapping[str, Any], opts: InventoryOptions = InventoryOptions()) -> bool:
    """True when gpupool schedules this pod (``spec.schedulerName``)."""
    raise NotImplementedError


def pod_requests(pod: Mapping[str, Any], opts: InventoryOptions = InventoryOptions()) -> tuple[int, int, int]:
    """(cpu milli, memory MiB, rdma) a pod requests, as the kubelet counts it (max of init containers)."""
    raise NotImplementedError
