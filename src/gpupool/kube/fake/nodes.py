"""Node objects as GPU nodes look on a real cluster: GPU feature discovery labels, allocatable
``nvidia.com/gpu``, a Ready condition and HAMi's device register annotation.

Why HAMi's JSON register format (not the colon-separated one its protocol doc still shows): it is
what HAMi's device plugin writes today (``pkg/device/devices.go`` ``DeviceInfo``).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from gpupool.kube.kubelet_status import node_ready_condition
from gpupool.manifests import ClusterSpec, Document, ManifestErrors, Metadata, NodeGroupSpec, build_nodes

HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_SPLIT = 10


def gpu_uuid(node: str, index: int) -> str:
    """A stable GPU-<uuid> for a node's device (same name and index -> same id on every run)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/gpu{index}"))


def hami_register(node: str, gpus: int, product: str, memory_mib: int) -> str:
    """HAMi's register JSON. ``type`` is ``NVIDIA-`` + NVML's device name, which is the GFD
    product label with spaces (``NVIDIA-NVIDIA H100 80GB HBM3``)."""
    devs = [
        {
            "id": gpu_uuid(node, i),
            "index": i,
            "count": HAMI_SPLIT,
            "devmem": memory_mib,
            "devcore": 100,
            "type": "NVIDIA-" + product.replace("-", " "),
            "numa": 0 if i < max(1, gpus // 2) else 1,
            "mode": "hami-core",
            "health": True,
        }
        for i in range(gpus)
    ]
    return json.dumps(devs, separators=(",", ":"))


def _node_info(name: str) -> dict[str, str]:
    """Every field of NodeSystemInfo: typed clients (lightkube's msgspec models) require them all."""
    ident = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
    return {
        "architecture": "amd64",
        "bootID": ident,
        "containerRuntimeVersion": "containerd://1.7.0-fake",
        "kernelVersion": "6.1.0-fake",
        "kubeProxyVersion": "v1.32.0-fake",
        "kubeletVersion": "v1.32.0-fake",
        "machineID": ident.replace("-", ""),
        "operatingSystem": "linux",
        "osImage": "gpupool fake node",
        "systemUUID": ident,
    }


def ready_condition(ready: bool) -> dict[str, Any]:
    return node_ready_condition(ready, "fake: node set NotReady")


def gpu_node(
    name: str,
    gpus: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    memory_mib: int = 81559,
    cpu: str = "192",
    memory: str = "2Ti",
    labels: Mapping[str, str] | None = None,
    hami: bool = True,
    clique: str = "",
    zone: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """One GPU Node object."""
    lab = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(gpus),
    }
    if clique:
        lab["nvidia.com/gpu.clique"] = clique
    if zone:
        lab[zone[0]] = zone[1]
    lab.update(labels or {})
    ann = {HAMI_REGISTER: hami_register(name, gpus, product, memory_mib)} if hami and gpus else {}
    res = {
        "cpu": cpu,
        "memory": memory,
        "pods": "110",
        "nvidia.com/gpu": str(gpus),
        "ephemeral-storage": "1Ti",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab, "annotations": ann},
        "spec": {},
        "status": {
            "capacity": dict(res),
            "allocatable": dict(res),
            "conditions": [ready_condition(True)],
            "nodeInfo": _node_info(name),
            "addresses": [{"type": "Hostname", "address": name}],
        },
    }


def gpu_nodes(
    count: int,
    prefix: str = "gpu-node",
    gpus: int = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    memory_mib: int = 81559,
    cpu: str = "192",
    memory: str = "2Ti",
    labels: Mapping[str, str] | None = None,
    hami: bool = True,
    nvlink_domain_size: int = 8,
    rack_label: str = "topology.kubernetes.io/zone",
    nodes_per_rack: int = 16,
) -> list[dict[str, Any]]:
    """``count`` nodes ``<prefix>-0000``...; cliques group ``nvlink_domain_size`` nodes, racks ``nodes_per_rack``."""
    if count < 0 or gpus < 0:
        raise ValueError("add_gpu_nodes: count and gpus must be >= 0")
    width = max(4, len(str(count - 1)))
    out = []
    for i in range(count):
        clique = f"{prefix}-clique-{i // max(1, nvlink_domain_size)}" if nvlink_domain_size else ""
        zone = (rack_label, f"{prefix}-rack-{i // max(1, nodes_per_rack)}") if rack_label else None
        out.append(
            gpu_node(
                f"{prefix}-{i:0{width}d}", gpus, product, memory_mib, cpu, memory, labels, hami, clique, zone
            )
        )
    return out


def _product(model: str) -> str:
    return "NVIDIA-" + re.sub(r"[^A-Za-z0-9-]", "-", model)


#: the model name gpupool reads before the product label (gpupool.kube.inventory honours it)
GPU_MODEL = "gpupool.io/gpu-model"


def nodes_from_cluster(
    docs: Iterable[Mapping[str, Any]], rack_label: str = "topology.kubernetes.io/zone"
) -> list[dict[str, Any]]:
    """Nodes of gpupool ``Cluster`` manifests (``spec.nodeGroups``), their labels carried over.

    Why the names, labels and NVLink domains come from gpupool's own node builder
    (``gpupool.manifests.build_nodes``): the same configuration must describe the same nodes
    on both backends (node ``n-001`` in rack ``r1``, labelled as its manifest says, so a pool's
    selector and a workload's ``gpupool.io/rack`` match alike); the fake adds only what a real
    cluster has besides (GFD labels, HAMi's register, the zone label ``<group>-rack-<k>``)."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") != "Cluster":
            continue
        for gi, group in enumerate((doc.get("spec") or {}).get("nodeGroups") or []):
            if not group.get("name"):
                raise ValueError(f"Cluster: spec.nodeGroups[{gi}].name is required")
            out += _group_nodes(group, gi, rack_label)
    return out


def _group_nodes(group: Mapping[str, Any], gi: int, rack_label: str) -> list[dict[str, Any]]:
    where = f"Cluster: spec.nodeGroups[{gi}]"
    try:
        spec = ClusterSpec(nodeGroups=[NodeGroupSpec.model_validate(dict(group))])
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}.{field}: {first['msg']}") from None
    errors = ManifestErrors()
    doc = Document("Cluster", "fake", Metadata(name="fake"), spec, {}, where)
    built = build_nodes(doc, errors)
    if errors.items:
        raise ValueError(errors.items[0])
    per_rack = max(1, -(-len(built) // spec.nodeGroups[0].topology.racks))
    return [
        gpu_node(
            n.name,
            n.gpu_count,
            _product(n.gpu_model),
            n.gpu_memory_mib,
            str(group.get("cpu", "64")),
            str(group.get("memory", "256Gi")),
            {**dict(n.labels), GPU_MODEL: n.gpu_model},
            clique=n.nvlink_domain,
            zone=(rack_label, f"{group['name']}-rack-{i // per_rack}") if rack_label else None,
        )
        for i, n in enumerate(built)
    ]
