"""Node builders: GPU feature discovery labels, allocatable GPUs, HAMi's register, NVLink
cliques and racks, nodes from a Cluster manifest, Ready flips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake.nodes import gpu_nodes, nodes_from_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_gpu_nodes_carry_gfd_labels_allocatable_and_hami_register() -> None:
    nodes = gpu_nodes(20, gpus=8, nvlink_domain_size=4, nodes_per_rack=16, labels={"team": "a"})
    n = nodes[5]
    labels = n["metadata"]["labels"]
    assert n["metadata"]["name"] == "gpu-node-0005" and labels["team"] == "a"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.memory"] == "81559" and labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.clique"] == "gpu-node-clique-1"
    assert labels["topology.kubernetes.io/zone"] == "gpu-node-rack-0"
    assert nodes[16]["metadata"]["labels"]["topology.kubernetes.io/zone"] == "gpu-node-rack-1"
    assert n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert [c["type"] for c in n["status"]["conditions"]] == ["Ready"]
    reg = json.loads(n["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    assert [d["index"] for d in reg] == list(range(8))
    assert all(d["id"].startswith("GPU-") and d["devmem"] == 81559 and d["count"] == 10 for d in reg)
    assert reg[0]["type"] == "NVIDIA-NVIDIA H100 80GB HBM3" and reg[0]["mode"] == "hami-core"
    assert (
        len(
            {
                d["id"]
                for n2 in nodes
                for d in json.loads(n2["metadata"]["annotations"]["hami.io/node-nvidia-register"])
            }
        )
        == 160
    )
    assert gpu_nodes(1, hami=False)[0]["metadata"]["annotations"] == {}


def test_uuids_are_stable_across_runs() -> None:
    a = gpu_nodes(1)[0]["metadata"]["annotations"]["hami.io/node-nvidia-register"]
    assert a == gpu_nodes(1)[0]["metadata"]["annotations"]["hami.io/node-nvidia-register"]


def test_nodes_from_the_example_cluster_manifest() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "cluster" / "cluster.yaml").read_text()))
    nodes = nodes_from_cluster(docs)
    assert len(nodes) == 16
    h100 = [n for n in nodes if n["metadata"]["name"].startswith("h100-")]
    assert len(h100) == 8 and h100[0]["metadata"]["labels"]["gpupool.io/sla-tier"] == "gold"
    assert {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in h100} == {
        "h100-rack-0",
        "h100-rack-1",
    }
    assert len({n["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in h100}) == 4
    l40s = [n for n in nodes if n["metadata"]["name"].startswith("l40s-")]
    assert l40s[0]["status"]["allocatable"]["nvidia.com/gpu"] == "4"


def test_bad_cluster_manifest_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"nodeGroups\[0\]\.name"):
        nodes_from_cluster([{"kind": "Cluster", "spec": {"nodeGroups": [{"count": 1}]}}])
    with pytest.raises(ValueError, match="count"):
        gpu_nodes(-1)


def test_set_node_ready_flips_the_condition(fake_server: FakeApiServer) -> None:
    name = fake_server.add_gpu_nodes(1)[0]
    rv = fake_server.get("nodes", "", name)["metadata"]["resourceVersion"]
    node = fake_server.set_node_ready(name, False)
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "KubeletNotReady"
    assert int(node["metadata"]["resourceVersion"]) > int(rv)
    ready = next(
        c for c in fake_server.set_node_ready(name, True)["status"]["conditions"] if c["type"] == "Ready"
    )
    assert ready["status"] == "True"
