"""What gpupool writes on a pod at bind time (its own keys and HAMi's), and reading it back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.kube import annotations as a
from gpupool.kube.annotations import (
    BoundPlacement,
    binding_annotations,
    hami_device_string,
    node_lock_value,
    read_bound,
)
from gpupool.kube.inventory import Device

UUIDS = [f"GPU-{i:08x}-0fc3-4a1b-9c2d-3e4f5a6b7c8d" for i in range(8)]
DEVICES = [Device(i, UUIDS[i], 81559) for i in range(8)]
NOW = 1_764_590_400.7  # 2025-12-01T12:00:00Z


def container(name: str, gpus: str | None = None, **extra: str) -> dict[str, Any]:
    limits = dict(extra)
    if gpus is not None:
        limits["nvidia.com/gpu"] = gpus
    return {"name": name, "image": "x", "resources": {"limits": limits} if limits else {}}


def pod(
    *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), node: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "gpupool", "containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "w-0", "namespace": "ml", "annotations": {}}, "spec": spec}


def placement(devices: list[int], milli: int = 1000, mem: int = 81559, **over: Any) -> dict[str, Any]:
    p = {
        "group": "worker",
        "index": 2,
        "node": "gpu-node-01",
        "devices": devices,
        "gpuMilli": milli,
        "gpuMemoryMiB": mem,
        "cpuMilli": 8000,
        "memoryMiB": 65536,
        "rdma": 1,
    }
    p.update(over)
    return p


def test_whole_gpus_gpupool_and_hami_keys() -> None:
    ann = binding_annotations(
        "ml/train", placement([0, 1]), DEVICES, pod(container("main", "2")), NOW, decision="cycle-17"
    )
    device = "{},NVIDIA,81559,100:"
    assert ann == {
        a.WORKLOAD: "ml/train",
        a.PODSET: "worker",
        a.POD_INDEX: "2",
        a.NODE: "gpu-node-01",
        a.GPU_INDICES: "0,1",
        a.GPU_UUIDS: f"{UUIDS[0]},{UUIDS[1]}",
        a.GPU_MILLI: "1000",
        a.GPU_MEMORY_MIB: "81559",
        a.DECISION: "cycle-17",
        a.HAMI_TO_ALLOCATE: device.format(UUIDS[0]) + device.format(UUIDS[1]) + ";",
        a.HAMI_ALLOCATED: device.format(UUIDS[0]) + device.format(UUIDS[1]) + ";",
        a.HAMI_NODE: "gpu-node-01",
        a.HAMI_TIME: "1764590400",
        a.HAMI_BIND_PHASE: "allocating",
        a.HAMI_BIND_TIME: "1764590400",
    }


def test_fraction_memory_and_cores() -> None:
    p = pod(container("srv", "1", **{"nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "25"}))
    ann = binding_annotations("ml/serve", placement([3], milli=250, mem=20480), DEVICES, p, NOW)
    assert ann[a.HAMI_TO_ALLOCATE] == f"{UUIDS[3]},NVIDIA,20480,25:;"
    assert (ann[a.GPU_MILLI], ann[a.GPU_MEMORY_MIB], ann[a.GPU_INDICES]) == ("250", "20480", "3")
    assert a.DECISION not in ann


def test_missing_memory_falls_back_to_device_memory() -> None:
    ann = binding_annotations("w", placement([0], mem=0), DEVICES, pod(container("m", "1")), NOW)
    assert ann[a.GPU_MEMORY_MIB] == "81559" and ",81559,100:" in ann[a.HAMI_ALLOCATED]


def test_init_containers_first_and_empty_entries() -> None:
    p = pod(
        container("sidecar"),
        container("main", "2"),
        init=(container("fetch"),),
    )
    s = hami_device_string(p, UUIDS[:2], 81559, 100)
    assert s == f";;{UUIDS[0]},NVIDIA,81559,100:{UUIDS[1]},NVIDIA,81559,100:;"


def test_devices_split_over_gpu_containers_in_order() -> None:
    p = pod(container("a", "1"), container("b", "3"))
    parts = hami_device_string(p, UUIDS[:4], 100, 100).split(";")
    assert parts[0] == f"{UUIDS[0]},NVIDIA,100,100:"
    assert parts[1] == "".join(f"{u},NVIDIA,100,100:" for u in UUIDS[1:4])
    assert parts[2] == ""


def test_shared_device_goes_to_every_gpu_container() -> None:
    p = pod(container("a", "1", **{"nvidia.com/gpumem": "1000"}), container("b", "1"))
    assert (
        hami_device_string(p, UUIDS[:1], 1000, 50)
        == f"{UUIDS[0]},NVIDIA,1000,50:;{UUIDS[0]},NVIDIA,1000,50:;"
    )


def test_kai_style_pod_without_gpu_resources_gets_first_regular_container() -> None:
    p = pod(container("a"), container("b"), init=(container("i"),))
    assert hami_device_string(p, UUIDS[:1], 40000, 50) == f";{UUIDS[0]},NVIDIA,40000,50:;;"


def test_node_without_hami_gets_only_gpupool_keys() -> None:
    bare = [Device(i, "", 81559) for i in range(8)]
    ann = binding_annotations("w", placement([5]), bare, pod(container("m", "1")), NOW)
    assert ann[a.GPU_INDICES] == "5"
    assert not any(k.startswith("hami.io/") for k in ann) and a.GPU_UUIDS not in ann


def test_cpu_only_pod() -> None:
    ann = binding_annotations("w", placement([], milli=0, mem=0), DEVICES, pod(container("m")), NOW)
    assert (ann[a.GPU_INDICES], ann[a.GPU_MILLI], ann[a.GPU_MEMORY_MIB]) == ("", "0", "0")
    assert a.HAMI_TO_ALLOCATE not in ann
    bound = read_bound({"metadata": {"annotations": ann}})
    assert bound is not None and bound.devices == ()


def test_device_not_on_node_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"device 9 is not on node 'gpu-node-01' \(8 devices\)"):
        binding_annotations("w", placement([9]), DEVICES, pod(container("m", "1")), NOW)


def test_round_trip() -> None:
    p = pod(container("main", "2"), node="gpu-node-01")
    p["metadata"]["annotations"] = binding_annotations("ml/train", placement([6, 7]), DEVICES, p, NOW, "c-3")
    assert read_bound(p) == BoundPlacement(
        "ml/train", "worker", 2, "gpu-node-01", (6, 7), 1000, 81559, (UUIDS[6], UUIDS[7]), "c-3"
    )


@given(
    group=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
    index=st.integers(0, 10_000),
    devices=st.lists(st.integers(0, 7), max_size=8, unique=True),
    milli=st.integers(1, 1000),
    mem=st.integers(1, 200_000),
    hami=st.booleans(),
)
def test_round_trip_property(
    group: str, index: int, devices: list[int], milli: int, mem: int, hami: bool
) -> None:
    devs = DEVICES if hami else [Device(i, "", 81559) for i in range(8)]
    pl = placement(
        devices, milli=milli if devices else 0, mem=mem if devices else 0, group=group, index=index
    )
    p = pod(container("m", str(max(len(devices), 1))), node="gpu-node-01")
    p["metadata"]["annotations"] = binding_annotations("ns/w", pl, devs, p, NOW)
    got = read_bound(p)
    assert got is not None
    assert (got.group, got.index, got.node, got.devices) == (group, index, "gpu-node-01", tuple(devices))
    assert (got.gpu_milli, got.gpu_memory_mib) == (pl["gpuMilli"], pl["gpuMemoryMiB"])
    assert got.uuids == (tuple(UUIDS[d] for d in devices) if hami else ())


def test_read_bound_absent_or_malformed_is_none() -> None:
    good = binding_annotations("w", placement([0]), DEVICES, pod(container("m", "1")), NOW)
    assert read_bound({}) is None
    assert read_bound({"metadata": {"annotations": None}}) is None
    assert read_bound({"metadata": {"annotations": {"hami.io/vgpu-node": "x"}}}) is None
    for key, bad in [
        (a.POD_INDEX, "two"),
        (a.GPU_INDICES, "0,,1"),
        (a.GPU_INDICES, "a"),
        (a.GPU_MILLI, "-1"),
        (a.GPU_MEMORY_MIB, "lots"),
        (a.WORKLOAD, ""),
        (a.NODE, 7),
    ]:
        assert read_bound({"metadata": {"annotations": {**good, key: bad}}}) is None, key
    missing = dict(good)
    del missing[a.GPU_MILLI]
    assert read_bound({"metadata": {"annotations": missing}}) is None


def test_read_bound_refuses_node_mismatch() -> None:
    p = pod(container("m", "1"), node="other-node")
    p["metadata"]["annotations"] = binding_annotations("w", placement([0]), DEVICES, p, NOW)
    assert read_bound(p) is None


def test_node_lock_value() -> None:
    assert node_lock_value("ml", "w-0", NOW) == "2025-12-01T12:00:00Z,ml,w-0"
