"""Every accelerator (异构资源, issue 11): NPUs and AMD GPUs beside NVIDIA GPUs, ephemeral
storage and network bandwidth, in the model, the manifests, the engine and on Kubernetes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool import quantity as qty
from gpupool.engine import Admit, decide
from gpupool.engine.invariants import check_state
from gpupool.kube.inventory import node_inventory
from gpupool.kube.translate.resources import KubeWorkloadError, template_resources
from gpupool.manifests import (
    Bundle,
    ManifestError,
    build,
    default_priority_classes,
    load_bundle,
    parse_documents,
)
from gpupool.manifests.convert import admission_from_json, placement_json
from gpupool.model import (
    ACCELERATORS,
    GPU,
    NO_LIMIT,
    QUOTA_RESOURCES,
    UNLIMITED,
    ZERO,
    Admission,
    Node,
    PodGroup,
    PodPlacement,
    PodRequest,
    PoolQuota,
    Queue,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
    devices_only,
    vadd,
    vle,
    vmax,
    vsub,
)

ASCEND = "huawei.com/Ascend910"
AMD = "amd.com/gpu"
NET = "gpupool.io/network-bandwidth"
STO = "ephemeral-storage"


# -- model and quantities -------------------------------------------------------------------
def test_quota_vectors_have_five_dimensions_and_unset_ones_govern_nothing() -> None:
    assert QUOTA_RESOURCES == (GPU, "cpu", "memory", STO, NET)
    a, b = (1, 2, 3, 4, 5), (5, 4, 3, 2, 1)
    assert vadd(a, b) == (6, 6, 6, 6, 6) and vsub(a, b) == (-4, -2, 0, 2, 4)
    assert vmax(a, b) == (5, 4, 3, 4, 5)
    assert vle(a, (1, 2, 3, 4, 5)) and not vle(a, (1, 2, 3, 4, 4))
    assert ZERO == (0,) * 5 and NO_LIMIT == (UNLIMITED,) * 5
    assert devices_only(8000) == (8000, UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED)


def test_workload_and_admission_charge_storage_and_bandwidth() -> None:
    req = PodRequest(gpus=2, cpu_milli=1000, memory_mib=10, storage_mib=100, network_mbps=25000)
    w = Workload("w", "q", (PodGroup("g", 3, req),))
    assert w.quota_vec() == (6000, 3000, 30, 300, 75000)
    pod = PodPlacement("g", 0, "n", (0, 1), 1000, 0, 1000, 10, 0, 100, 25000)
    assert Admission("p", (pod, pod)).quota_vec() == (4000, 2000, 20, 200, 50000)


def test_the_kinds_say_what_they_are_and_whether_they_share() -> None:
    assert ACCELERATORS[GPU].shareable and ACCELERATORS[GPU].noun == "GPU"
    assert ACCELERATORS[ASCEND].noun == "NPU" and not ACCELERATORS[ASCEND].shareable
    assert ACCELERATORS[AMD].vendor == "AMD" and not ACCELERATORS[AMD].shareable


@pytest.mark.parametrize(("value", "mbps"), [(100, 100), ("25000", 25000), ("25k", 25000), ("1.5", 2)])
def test_bandwidth_is_a_count_of_mbit_per_second(value: object, mbps: int) -> None:
    assert qty.bandwidth_mbps(value) == mbps


@pytest.mark.parametrize("bad", [-1, True, "fast", 10**10])
def test_bad_bandwidth_says_why(bad: object) -> None:
    with pytest.raises(qty.QuantityError):
        qty.bandwidth_mbps(bad)


def test_storage_reads_like_memory_and_bandwidth_formats_for_people() -> None:
    assert qty.storage_mib("1Ti") == 1 << 20 and qty.storage_mib(2**20) == 1
    assert qty.format_mbps(25000) == "25Gbit/s" and qty.format_mbps(500) == "500Mbit/s"


# -- manifests ------------------------------------------------------------------------------
CLUSTER = """
apiVersion: gpupool.io/v1alpha1
kind: Cluster
metadata: {name: c}
spec:
  nodeGroups:
    - {name: g, count: 2, gpu: {model: H100-80GB, count: 8, memory: 80Gi}, cpu: 64, memory: 512Gi,
       ephemeralStorage: 1Ti, networkBandwidth: 100000, labels: {pool: mixed}}
    - {name: a, count: 2, gpu: {resource: huawei.com/Ascend910, model: Ascend910B, count: 8, memory: 64Gi},
       cpu: 64, memory: 512Gi, ephemeralStorage: 2Ti, networkBandwidth: 200000, labels: {pool: mixed}}
    - {name: m, count: 1, gpu: {resource: amd.com/gpu, model: MI300X, count: 8, memory: 192Gi},
       cpu: 64, memory: 512Gi, labels: {pool: amd}}
---
{apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: mixed}, spec: {nodeSelector: {pool: mixed}}}
---
{apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: amd}, spec: {accelerators: [amd.com/gpu]}}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: q}
spec:
  quotas:
    - {pool: mixed, guarantee: {nvidia.com/gpu: 64}}
    - {pool: amd, guarantee: {amd.com/gpu: 8}}
"""


def workload(name: str, *groups: dict[str, Any], pool: str | None = None) -> str:
    spec: dict[str, Any] = {"queue": "q", "podGroups": list(groups)}
    if pool:
        spec["pool"] = pool
    return json.dumps(
        {"apiVersion": "gpupool.io/v1alpha1", "kind": "Workload", "metadata": {"name": name}, "spec": spec}
    )


def bundle(*extra: str, cluster: str = CLUSTER) -> Bundle:
    text = cluster + "".join("\n---\n" + e for e in extra)
    return build(parse_documents(text, "t.yaml"), Bundle(priority_classes=list(default_priority_classes())))


def errors(*extra: str, cluster: str = CLUSTER) -> str:
    with pytest.raises(ManifestError) as ei:
        bundle(*extra, cluster=cluster)
    return "\n".join(ei.value.errors)


def test_nodes_declare_their_kind_storage_and_bandwidth() -> None:
    nodes = {n.name: n for n in bundle().nodes}
    a, g, m = nodes["a-001"], nodes["g-001"], nodes["m-001"]
    assert (a.accelerator, a.gpu_model, a.gpu_count, a.gpu_memory_mib) == (ASCEND, "Ascend910B", 8, 65536)
    assert (a.ephemeral_storage_mib, a.network_mbps) == (2 << 20, 200000)
    assert g.accelerator == GPU and g.label_map["nvidia.com/gpu.product"] == "H100-80GB"
    # generated nodes carry the labels the vendors' components write on Kubernetes
    assert a.label_map["accelerator"] == "huawei-Ascend910"
    assert m.label_map["amd.com/gpu.product-name"] == "MI300X" and m.label_map["amd.com/gpu.vram"] == "192G"


def test_an_unknown_kind_or_bad_bandwidth_names_the_field() -> None:
    bad = CLUSTER.replace("resource: amd.com/gpu", "resource: acme.com/tpu").replace(
        "networkBandwidth: 100000", "networkBandwidth: fast"
    )
    text = errors(cluster=bad)
    assert "spec.nodeGroups[2].gpu.resource: unknown accelerator kind" in text
    assert "spec.nodeGroups[0].networkBandwidth: invalid quantity 'fast'" in text


def test_a_pod_asks_for_npus_storage_and_bandwidth() -> None:
    b = bundle(workload("w", {"replicas": 2, "resources": {ASCEND: 4, STO: "100Gi", NET: "25k", "cpu": 8}}))
    r = b.workloads[0].pod_groups[0].request
    assert (r.accelerator, r.gpus, r.storage_mib, r.network_mbps, r.cpu_milli) == (
        ASCEND,
        4,
        102400,
        25000,
        8000,
    )


def test_a_fraction_of_a_kind_that_cannot_be_shared_is_refused_naming_the_field() -> None:
    text = errors(workload("w", {"resources": {ASCEND: "500m"}}))
    assert "spec.podGroups[0].resources.huawei.com/Ascend910: huawei.com/Ascend910 cannot be shared" in text
    text = errors(workload("w", {"resources": {AMD: 0, "nvidia.com/gpucores": 50}}))
    assert "is for nvidia.com/gpu (amd.com/gpu cannot be shared)" in text
    text = errors(workload("w", {"resources": {ASCEND: "1.5"}}))
    assert "more than one NPU must be a whole number" in text


def test_one_pod_asks_for_one_kind_and_unknown_names_are_listed() -> None:
    text = errors(workload("w", {"resources": {ASCEND: 1, GPU: 1}}))
    assert (
        "resources.nvidia.com/gpu: a pod's devices are of one kind; it already asks for huawei.com/Ascend910"
        in text
    )
    text = errors(workload("w", {"resources": {"huawei.com/Ascend920": 1}}))
    assert "unknown resource; use nvidia.com/gpu, amd.com/gpu, huawei.com/Ascend910" in text


def test_quotas_name_the_kind_storage_and_bandwidth() -> None:
    q = bundle().queues[0].quota("amd")
    assert q is not None and q.guarantee == (8000, UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED)
    extra = CLUSTER.replace(
        "{pool: mixed, guarantee: {nvidia.com/gpu: 64}}",
        "{pool: mixed, guarantee: {nvidia.com/gpu: 64, ephemeral-storage: 1Ti, gpupool.io/network-bandwidth: 50000}}",
    )
    q = bundle(cluster=extra).queues[0].quota("mixed")
    assert q is not None and q.guarantee == (64000, UNLIMITED, UNLIMITED, 1 << 20, 50000)
    two = CLUSTER.replace(
        "guarantee: {amd.com/gpu: 8}", "guarantee: {amd.com/gpu: 8, huawei.com/Ascend910: 8}"
    )
    assert "a quota counts one accelerator kind; amd.com/gpu is already set" in errors(cluster=two)


# -- the engine -----------------------------------------------------------------------------
def node(name: str, kind: str = GPU, count: int = 8, sto: int = 0, net: int = 0, **labels: str) -> Node:
    model = {GPU: "H100", ASCEND: "Ascend910B", AMD: "MI300X"}[kind]
    return Node(
        name, model, count, 65536, 64000, 512 << 10, labels=tuple(labels.items()),
        accelerator=kind, ephemeral_storage_mib=sto, network_mbps=net,
    )  # fmt: skip


def snap(
    nodes: list[Node], pending: list[Workload], quota: tuple[int, ...] = (64000,) + (UNLIMITED,) * 4
) -> Snapshot:
    pool = ResourcePool("p")
    q = Queue("q", quotas=(PoolQuota("p", quota),))  # type: ignore[arg-type]
    return Snapshot(tuple(nodes), (pool,), (q,), tuple(default_priority_classes()), tuple(pending))


def wl(name: str, *reqs: PodRequest, replicas: int = 1) -> Workload:
    return Workload(name, "q", tuple(PodGroup(f"g{i}", replicas, r) for i, r in enumerate(reqs)))


def placed(d: Any) -> dict[str, list[str]]:
    return {a.workload: sorted(p.node for p in a.pods) for a in d.admitted}


def test_an_npu_pod_lands_only_on_npu_nodes_and_a_gpu_pod_only_on_gpu_nodes() -> None:
    # the GPU node comes first and is free: without the kind filter the NPU pod would land there
    nodes = [node("gpu-1"), node("npu-1", ASCEND)]
    d = decide(
        snap(nodes, [wl("npu", PodRequest(gpus=8, accelerator=ASCEND)), wl("gpu", PodRequest(gpus=8))])
    )
    assert placed(d) == {"npu": ["npu-1"], "gpu": ["gpu-1"]}


def test_a_kind_the_pool_lacks_is_the_reason() -> None:
    d = decide(snap([node("gpu-1")], [wl("amd", PodRequest(gpus=1, accelerator=AMD))]))
    assert not d.admitted
    assert (
        "pod group g0 asks for amd.com/gpu; pool p has no schedulable nodes of that kind"
        in d.pending[0].reason
    )


def test_the_reason_calls_npus_npus() -> None:
    d = decide(snap([node("npu-1", ASCEND, count=4)], [wl("big", PodRequest(gpus=8, accelerator=ASCEND))]))
    # 4-NPU nodes: it can never run there (engine/feasible.py), and the reason says NPUs
    assert "needs 1 pod(s) of 8 Ascend910B NPUs on one node each" in d.pending[0].reason
    assert "healthy NPUs" in d.pending[0].reason and "GPU" not in d.pending[0].reason


def test_a_workload_on_gpus_and_npus_at_once_places_each_group_on_its_kind() -> None:
    nodes = [node("gpu-1", sto=1 << 20, net=100000), node("npu-1", ASCEND, sto=1 << 20, net=100000)]
    w = wl(
        "mixed",
        PodRequest(gpus=4, accelerator=ASCEND, storage_mib=1000, network_mbps=50000),
        PodRequest(gpus=2, storage_mib=1000, network_mbps=10000),
        PodRequest(cpu_milli=1000),
    )
    d = decide(snap(nodes, [w]))
    a = d.admitted[0]
    by_group = {p.group: p for p in a.pods}
    assert by_group["g0"].node == "npu-1" and by_group["g1"].node == "gpu-1"
    assert (by_group["g0"].storage_mib, by_group["g0"].network_mbps) == (1000, 50000)
    assert d.admitted[0].workload == "mixed"


def test_storage_and_bandwidth_are_filtered_like_rdma() -> None:
    nodes = [node("small", sto=100, net=1000), node("big", sto=10_000, net=100_000)]
    d = decide(
        snap(
            nodes,
            [wl("w", PodRequest(gpus=1, storage_mib=5000)), wl("v", PodRequest(gpus=1, network_mbps=5000))],
        )
    )
    assert placed(d) == {"w": ["big"], "v": ["big"]}
    d = decide(snap(nodes, [wl("x", PodRequest(gpus=1, storage_mib=50_000))]))
    assert not d.admitted and "needs 1 free H100 GPUs on one node" in d.pending[0].reason
    assert "ephemeral-storage 50000Mi" in d.pending[0].reason


def test_storage_and_bandwidth_quotas_are_governed_and_unset_ones_are_not() -> None:
    nodes = [node("n", sto=1 << 20, net=100_000)]
    quota = (64000, UNLIMITED, UNLIMITED, 1000, UNLIMITED)
    two = [wl("a", PodRequest(gpus=1, storage_mib=800)), wl("b", PodRequest(gpus=1, storage_mib=800))]
    d = decide(snap(nodes, two, quota))
    assert [a.workload for a in d.admitted] == ["a"]
    assert "pool p ephemeral-storage capacity 1000Mi, in use 800Mi, requested 800Mi" in d.pending[0].reason
    # bandwidth is not governed by this quota: any amount the node has is admitted
    d = decide(snap(nodes, [wl("c", PodRequest(gpus=1, network_mbps=90_000))], quota))
    assert placed(d) == {"c": ["n"]}


def test_an_npu_quota_counts_npus_and_its_reason_says_npu() -> None:
    nodes = [node("npu-1", ASCEND), node("npu-2", ASCEND)]
    d = decide(snap(nodes, [wl("w", PodRequest(gpus=8, accelerator=ASCEND), replicas=2)], devices_only(8000)))
    assert not d.admitted and "pool p NPU capacity 8" in d.pending[0].reason


def test_the_invariant_checker_catches_a_pod_on_the_wrong_kind_and_overcommitted_storage() -> None:
    n = node("gpu-1", sto=100)
    w = wl("w", PodRequest(gpus=1, accelerator=ASCEND, storage_mib=200))
    pod = PodPlacement("g0", 0, "gpu-1", (0,), 1000, 65536, 0, 0, 0, 200, 0)
    s = Snapshot(
        (n,),
        (ResourcePool("p"),),
        (Queue("q", quotas=(PoolQuota("p", NO_LIMIT),)),),
        running=(Running(w, Admission("p", (pod,))),),
    )
    errs = "\n".join(check_state(s))
    assert "needs huawei.com/Ascend910, gpu-1 has nvidia.com/gpu" in errs
    assert "ephemeral-storage 200/100Mi" in errs


# -- Kubernetes -----------------------------------------------------------------------------
def kube_node(labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1", "labels": labels},
        "status": {
            "allocatable": {"cpu": "190", "memory": "1000Gi", **allocatable},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_an_ascend_node_is_read_from_the_device_plugin() -> None:
    obj = kube_node(
        {"accelerator": "huawei-Ascend910", "node.kubernetes.io/npu.chip.name": "910B3"},
        {ASCEND: "8", STO: "1800Gi", NET: "200000"},
    )
    inv = node_inventory(obj)
    n = inv.node
    assert inv.ready and n.schedulable
    assert (n.accelerator, n.gpu_count, n.gpu_model, n.gpu_memory_mib) == (ASCEND, 8, "Ascend910B3", 65536)
    assert (n.ephemeral_storage_mib, n.network_mbps) == (1800 << 10, 200000)


def test_an_amd_node_is_read_from_the_labeller_and_a_missing_vram_label_is_named() -> None:
    obj = kube_node(
        {"amd.com/gpu.product-name": "AMD Instinct MI300X", "amd.com/gpu.vram": "192G"}, {AMD: "8"}
    )
    n = node_inventory(obj).node
    assert (n.accelerator, n.gpu_count, n.gpu_model, n.gpu_memory_mib) == (
        AMD,
        8,
        "AMD_Instinct_MI300X",
        192 << 10,
    )
    inv = node_inventory(kube_node({}, {AMD: "8"}))
    assert not inv.ready and "label amd.com/gpu.vram: missing" in inv.unschedulable_reason


def test_other_schedulers_pods_take_storage_and_bandwidth_from_the_node() -> None:
    obj = kube_node({"accelerator": "huawei-Ascend910"}, {ASCEND: "8", STO: "100Gi", NET: "1000"})
    other = {
        "metadata": {"name": "cache", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {STO: "40Gi", NET: "300"}}}]},
        "status": {"phase": "Running"},
    }
    n = node_inventory(obj, [other]).node
    assert (n.ephemeral_storage_mib, n.network_mbps) == (60 << 10, 700)


def test_a_pod_template_asking_for_npus_storage_and_bandwidth_translates() -> None:
    res = {"limits": {ASCEND: "2"}, "requests": {"cpu": "4", STO: "50Gi", NET: "10000"}}
    tpl = {"spec": {"containers": [{"name": "c", "resources": res}]}}
    out = template_resources(tpl, "spec.template")
    assert out == {"cpu": "4000m", ASCEND: 2, STO: "51200Mi", NET: 10000}


def test_a_pod_template_asking_for_two_kinds_is_refused() -> None:
    both = {"limits": {ASCEND: "1", GPU: "1"}}
    with pytest.raises(KubeWorkloadError) as ei:
        template_resources({"spec": {"containers": [{"name": "c", "resources": both}]}}, "spec.template")
    assert "one accelerator kind" in str(ei.value)


def test_the_heterogeneous_example_places_each_pod_group_on_its_kind() -> None:
    b = load_bundle([Path(__file__).resolve().parents[1] / "examples" / "heterogeneous"])
    s = Snapshot(
        tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(b.priority_classes), tuple(b.workloads)
    )
    d = decide(s)
    assert sorted(a.workload for a in d.admitted) == ["hx-llm-sft", "hx-npu-pretrain", "hx-vlm"], d.pending
    vlm = next(a for a in d.admitted if a.workload == "hx-vlm")
    nodes = {p.group: p.node for p in vlm.pods}
    assert nodes["trainer"] == "hx-mm-ascend" and nodes["evaluator"] == "hx-mm-mi300"
    assert sum(p.storage_mib for p in vlm.pods) == (1 << 20) + 500 * 1024 + 2 * 200 * 1024


def test_a_stored_admission_keeps_storage_and_bandwidth_across_a_restart() -> None:
    pod = PodPlacement("g", 0, "n", (0,), 1000, 0, 1000, 10, 0, 2048, 25000)
    plain = PodPlacement("h", 0, "n", (1,), 1000, 0, 1000, 10)
    stored = placement_json(Admit("w", "q", "p", (pod, plain), False, ""), 0.0)
    assert "storageMiB" not in stored["pods"][1]  # rows of pods without either stay as they were
    assert admission_from_json(stored).quota_vec() == Admission("p", (pod, plain)).quota_vec()


def test_a_pool_naming_an_unknown_kind_is_refused_at_the_field() -> None:
    bad = CLUSTER.replace("accelerators: [amd.com/gpu]", "accelerators: [amd.com/gpuu]")
    text = errors(cluster=bad)
    assert "(ResourcePool/amd): spec.accelerators: unknown accelerator kind 'amd.com/gpuu'" in text


def test_the_quota_api_shows_storage_and_bandwidth_and_leaves_unset_ones_null(tmp_path: Path) -> None:
    """/v1/quota answers all five dimensions: governed storage and bandwidth show their
    guarantee; a dimension the quota does not set is null (ungoverned), not 0."""
    from tests.test_service_support import running_app

    example = Path(__file__).resolve().parents[1] / "examples" / "heterogeneous"
    with running_app(tmp_path, config_dir=example) as api:
        rows = api.get("/v1/quota")["items"]
    by = {(r["queue"], r["pool"]): r for r in rows}
    governed = [r for r in rows if r["guarantee"] and r["guarantee"]["networkMbps"] is not None]
    assert governed, rows
    g = governed[0]["guarantee"]
    assert g["ephemeralStorageMiB"] > 0 and g["networkMbps"] >= 300_000
    ungoverned = [r for r in by.values() if r["guarantee"] and r["guarantee"]["networkMbps"] is None]
    assert ungoverned, "a quota without bandwidth reads null"
