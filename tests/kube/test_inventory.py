"""Nodes as inventory: GFD labels, HAMi's register, what other schedulers' pods use, readiness."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpupool.kube.inventory import (
    InventoryOptions,
    PodRequestError,
    hami_devices,
    is_managed,
    node_inventory,
    pod_requests,
)
from gpupool.kube.translate.hami import RegisterError
from gpupool.kube.translate.models import model_name
from gpupool.model import ResourcePool, Taint

UUIDS = [f"GPU-{i:08x}-5c87-89ac-b1a6-7b53aa24b0ec" for i in range(8)]


def register(n: int = 8, healthy: tuple[bool, ...] = ()) -> str:
    return json.dumps(
        [
            {
                "id": UUIDS[i],
                "index": i,
                "count": 10,
                "devmem": 81559,
                "devcore": 100,
                "type": "NVIDIA-NVIDIA H100 80GB HBM3",
                "numa": i // 4,
                "mode": "hami-core",
                "health": healthy[i] if i < len(healthy) else True,
            }
            for i in range(n)
        ]
    )


def h100_node(**over: Any) -> dict[str, Any]:
    """A GFD-labelled 8×H100 node with HAMi's device plugin (which advertises 10 slots per GPU)."""
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-node-01",
            "labels": {
                "kubernetes.io/hostname": "gpu-node-01",
                "topology.kubernetes.io/zone": "rack-a",
                "gpupool.io/environment": "training",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.clique": "7f3c1a2e-0b4d-4c5e-9f1a-2b3c4d5e6f70.1",
            },
            "annotations": {"hami.io/node-nvidia-register": register()},
        },
        "spec": {"taints": [{"key": "gpupool.io/managed", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "190", "memory": "2113412Mi", "nvidia.com/gpu": "80", "rdma/hca": "8"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            ],
        },
    }
    node.update(over)
    return node


def pod(
    cpu: str = "1", memory: str = "1Gi", scheduler: str = "default-scheduler", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "kube-system"},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
            **spec,
        },
        "status": {"phase": "Running"},
    }


def test_gfd_node_with_hami_register() -> None:
    inv = node_inventory(h100_node())
    n = inv.node
    assert inv.ready and inv.unschedulable_reason == "" and n.schedulable
    assert (n.name, n.gpu_model, n.gpu_count, n.gpu_memory_mib) == ("gpu-node-01", "H100-80GB", 8, 81559)
    assert (n.cpu_milli, n.memory_mib, n.rdma) == (190_000, 2113412, 8)
    assert n.rack == "rack-a" and n.nvlink_domain.endswith(".1")
    assert n.taints == (Taint("gpupool.io/managed", "true", "NoSchedule"),)
    assert n.label_map["gpupool.io/environment"] == "training"
    assert n.label_map["gpupool.io/rack"] == "rack-a"
    assert [d.uuid for d in inv.devices] == UUIDS and [d.index for d in inv.devices] == list(range(8))
    assert all(d.memory_mib == 81559 and d.healthy and d.model == "H100-80GB" for d in inv.devices)


def test_pools_select_the_translated_node() -> None:
    n = node_inventory(h100_node()).node
    assert ResourcePool("t", (("gpupool.io/environment", "training"),), ("H100-80GB",)).selects(n)
    assert not ResourcePool("a", gpu_models=("A100-40GB",)).selects(n)


def test_hami_slots_are_not_devices() -> None:
    """HAMi advertises 10 slots per GPU as nvidia.com/gpu: the register's length is the count."""
    node = h100_node()
    del node["metadata"]["labels"]["nvidia.com/gpu.count"]
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = register(4)
    assert node_inventory(node).node.gpu_count == 4


def test_without_hami_indices_and_label_memory() -> None:
    node = h100_node()
    node["metadata"]["annotations"] = {}
    inv = node_inventory(node)
    assert inv.ready and inv.node.gpu_count == 8
    assert [(d.index, d.uuid, d.memory_mib) for d in inv.devices] == [(i, "", 81559) for i in range(8)]


def test_count_from_allocatable_when_no_count_label() -> None:
    node = h100_node()
    node["metadata"]["annotations"] = {}
    del node["metadata"]["labels"]["nvidia.com/gpu.count"]
    node["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    assert node_inventory(node).node.gpu_count == 4


def test_older_colon_register() -> None:
    node = h100_node()
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = (
        f"{UUIDS[0]},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:{UUIDS[1]},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,false:"
    )
    devs = hami_devices(node)
    assert devs is not None
    assert [(d.index, d.uuid, d.memory_mib, d.healthy, d.model) for d in devs] == [
        (0, UUIDS[0], 32768, True, "V100-32GB"),
        (1, UUIDS[1], 32768, False, "V100-32GB"),
    ]


def test_unhealthy_device_is_reported() -> None:
    node = h100_node()
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = register(8, (True, False))
    inv = node_inventory(node)
    assert [d.index for d in inv.devices if not d.healthy] == [1]


def test_hami_devices_absent_is_none() -> None:
    node = h100_node()
    node["metadata"]["annotations"] = {}
    assert hami_devices(node) is None


def test_cordoned() -> None:
    inv = node_inventory(h100_node(spec={"unschedulable": True}))
    assert inv.ready and not inv.node.schedulable and inv.unschedulable_reason == "cordoned"


@pytest.mark.parametrize("status", ["False", "Unknown"])
def test_not_ready(status: str) -> None:
    node = h100_node()
    node["status"]["conditions"][1] = {
        "type": "Ready",
        "status": status,
        "message": "Kubelet stopped posting node status.",
    }
    inv = node_inventory(node)
    assert not inv.ready and not inv.node.schedulable
    assert inv.unschedulable_reason == "NotReady: Kubelet stopped posting node status."


def test_no_ready_condition_is_not_ready() -> None:
    node = h100_node()
    node["status"]["conditions"] = []
    assert not node_inventory(node).ready


def test_unmanaged_pods_reduce_cpu_memory_rdma() -> None:
    daemon = pod("2", "4Gi")
    daemon["spec"]["containers"][0]["resources"]["requests"]["rdma/hca"] = "1"
    mine = pod("50", "100Gi", scheduler="gpupool")
    done = pod("50", "100Gi")
    done["status"]["phase"] = "Succeeded"
    n = node_inventory(h100_node(), [daemon, mine, done]).node
    assert (n.cpu_milli, n.memory_mib, n.rdma) == (188_000, 2113412 - 4096, 7)


def test_overcommitted_node_is_zero_not_negative() -> None:
    n = node_inventory(h100_node(), [pod("500", "1Ti")]).node
    assert n.cpu_milli == 0 and n.memory_mib > 0


def test_cpu_only_node() -> None:
    node = {
        "metadata": {"name": "cpu-1", "labels": {}},
        "status": {
            "allocatable": {"cpu": "16", "memory": "64Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    inv = node_inventory(node)
    assert inv.ready and inv.node.gpu_count == 0 and inv.node.gpu_model == "" and inv.devices == ()


def test_model_override_label() -> None:
    node = h100_node()
    node["metadata"]["labels"]["gpupool.io/gpu-model"] = "H100-SXM-80GB"
    assert node_inventory(node).node.gpu_model == "H100-SXM-80GB"


def test_rack_label_is_configurable() -> None:
    node = h100_node()
    node["metadata"]["labels"]["example.com/rack"] = "r7"
    assert node_inventory(node, opts=InventoryOptions(rack_label="example.com/rack")).node.rack == "r7"


MALFORMED = [
    (
        "metadata.annotations.hami.io/node-nvidia-register",
        "[{not json",
        "annotation hami.io/node-nvidia-register",
    ),
    ("metadata.annotations.hami.io/node-nvidia-register", '[{"index": 0, "devmem": 1}]', "id"),
    ("metadata.annotations.hami.io/node-nvidia-register", '{"a": 1}', "JSON list"),
    ("metadata.annotations.hami.io/node-nvidia-register", '[{"id": "G", "devmem": "lots"}]', "devmem"),
    ("metadata.annotations.hami.io/node-nvidia-register", "G,10,abc:", "7 comma-separated"),
    ("metadata.labels.nvidia.com/gpu.count", "eight", "label nvidia.com/gpu.count"),
    ("metadata.labels.nvidia.com/gpu.memory", "80G", "label nvidia.com/gpu.memory"),
    ("metadata.labels.nvidia.com/gpu.product", "NVIDIA", "label nvidia.com/gpu.product"),
    ("status.allocatable.cpu", "lots", "status.allocatable.cpu"),
    ("status.allocatable.memory", "-1Gi", "status.allocatable.memory"),
    ("spec.taints", [{"value": "x"}], "spec.taints[0]"),
]


def _set(obj: dict[str, Any], path: str, value: Any) -> None:
    head, *rest = path.split(".", 2)
    if head in ("metadata", "status", "spec") and rest:
        sub, key = rest[0], rest[1] if len(rest) > 1 else None
        if key is None:
            obj[head][sub] = value
        else:
            obj[head].setdefault(sub, {})[key] = value
    else:
        obj[head][rest[0]] = value


@pytest.mark.parametrize(("path", "value", "named"), MALFORMED)
def test_malformed_node_is_not_ready_and_named(path: str, value: Any, named: str) -> None:
    node = h100_node()
    if "gpu.count" in path or "gpu.memory" in path:
        node["metadata"]["annotations"] = {}
    if "gpu.product" in path:
        node["metadata"]["annotations"] = {}
    _set(node, path, value)
    inv = node_inventory(node)
    assert not inv.ready and not inv.node.schedulable
    assert inv.unschedulable_reason.startswith("unreadable: ") and named in inv.unschedulable_reason


def test_missing_memory_label_without_hami() -> None:
    node = h100_node()
    node["metadata"]["annotations"] = {}
    del node["metadata"]["labels"]["nvidia.com/gpu.memory"]
    inv = node_inventory(node)
    assert not inv.ready and "nvidia.com/gpu.memory: missing" in inv.unschedulable_reason


@pytest.mark.parametrize(
    "garbage",
    [{}, {"metadata": None}, {"metadata": {"labels": "x"}, "status": []}, {"spec": {"taints": "x"}}],
)
def test_garbage_never_raises(garbage: dict[str, Any]) -> None:
    inv = node_inventory(garbage)
    assert not inv.ready


def test_malformed_unmanaged_pod_names_the_pod() -> None:
    inv = node_inventory(h100_node(), [pod(cpu="much")])
    assert (
        not inv.ready
        and "pod kube-system/p: spec.containers[0].resources.requests.cpu" in inv.unschedulable_reason
    )


def test_hami_devices_raises_named_error() -> None:
    node = h100_node()
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[1, 2]"
    with pytest.raises(RegisterError, match="JSON list"):
        hami_devices(node)


def test_duplicate_register_index() -> None:
    node = h100_node()
    rows = json.loads(register(2))
    rows[1]["index"] = 0
    node["metadata"]["annotations"]["hami.io/node-nvidia-register"] = json.dumps(rows)
    assert "same index" in node_inventory(node).unschedulable_reason


# -- pod requests as the kubelet counts them ----------------------------------------------------
def test_pod_requests_sum_of_containers() -> None:
    p = pod("500m", "512Mi")
    p["spec"]["containers"].append({"name": "b", "resources": {"requests": {"cpu": "1.5", "memory": "1Gi"}}})
    assert pod_requests(p) == (2000, 1536, 0)


def test_pod_requests_init_container_max() -> None:
    p = pod(
        "1", "1Gi", initContainers=[{"name": "i", "resources": {"requests": {"cpu": "4", "memory": "512Mi"}}}]
    )
    assert pod_requests(p) == (4000, 1024, 0)


def test_pod_requests_sidecars_add() -> None:
    sidecar = {
        "name": "s",
        "restartPolicy": "Always",
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
    }
    init = {"name": "i", "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}
    p = pod("1", "1Gi", initContainers=[sidecar, init])
    # running: containers 1 + sidecar 1 = 2 CPU; the init after the sidecar: 3 + 1 = 4 CPU
    assert pod_requests(p) == (4000, 2048, 0)
    # a sidecar keeps running beside the containers: 4 + 2 = 6 CPU, more than any init step
    big = {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "2"}}}
    small = {"name": "i", "resources": {"requests": {"cpu": "1"}}}
    assert pod_requests(pod("4", "1Gi", initContainers=[big, small])) == (6000, 1024, 0)


def test_pod_requests_limits_default_and_overhead() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2", "memory": "2Gi"}}
    p["spec"]["overhead"] = {"cpu": "250m", "memory": "120Mi"}
    assert pod_requests(p) == (2250, 2168, 0)


def test_pod_level_resources_replace_the_sum() -> None:
    p = pod("1", "1Gi")
    p["spec"]["resources"] = {"requests": {"cpu": "4"}}
    assert pod_requests(p) == (4000, 1024, 0)


def test_memory_rounds_up_once() -> None:
    p = pod("1m", "1")
    p["spec"]["containers"].append({"name": "b", "resources": {"requests": {"memory": "1"}}})
    assert pod_requests(p) == (1, 1, 0)


def test_pod_requests_error_names_field() -> None:
    p = pod(initContainers=[{"name": "i", "resources": {"requests": {"memory": "x"}}}])
    with pytest.raises(PodRequestError, match=r"spec.initContainers\[0\].resources.requests.memory"):
        pod_requests(p)


def test_is_managed() -> None:
    assert is_managed(pod(scheduler="gpupool"))
    assert not is_managed(pod())
    assert is_managed(pod(scheduler="mine"), InventoryOptions(scheduler_name="mine"))
    assert not is_managed({})


# -- model names --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("product", "memory", "model"),
    [
        ("NVIDIA-H100-80GB-HBM3", 81559, "H100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA-A100-PCIE-40GB", 40960, "A100-40GB"),
        ("NVIDIA-L40S", 46068, "L40S-48GB"),
        ("Tesla-T4", 15360, "T4-16GB"),
        ("NVIDIA-H100-NVL", 95830, "H100-94GB"),
        ("NVIDIA-H200", 143771, "H200-141GB"),
        ("NVIDIA-A100-SXM4-80GB-SHARED", 81920, "A100-80GB"),
        ("NVIDIA-NVIDIA H100 80GB HBM3", 0, "H100-80GB"),
        ("NVIDIA-GeForce-RTX-4090", 24564, "RTX-4090-24GB"),
        ("", 81559, ""),
        ("NVIDIA", 0, ""),
    ],
)
def test_model_names(product: str, memory: int, model: str) -> None:
    assert model_name(product, memory) == model


@pytest.mark.parametrize("name", ["H100-80GB", "A100-40GB", "L40S-48GB", "P100-16GB", "RTX-4090-24GB"])
def test_model_names_are_idempotent(name: str) -> None:
    """A node labelled with a gpupool model name (the fake server's nodes) keeps it."""
    assert model_name(name) == name


def test_inventory_does_not_mutate_input() -> None:
    node = h100_node()
    before = copy.deepcopy(node)
    node_inventory(node, [pod()])
    assert node == before
