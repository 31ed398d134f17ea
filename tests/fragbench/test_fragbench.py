"""Tests for the fragmentation benchmark (synthetic traces; one real-data smoke test)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpupool.engine.fgd import GPUPOOL_CAPACITY_WEIGHT, per_gpu_weights
from gpupool.fragbench import (
    FragbenchError,
    PodShape,
    ShapeDistribution,
    format_table,
    load_nodes,
    load_pods,
    node_fragmentation,
    node_fragmentation_batch,
    run_fragmentation,
)
from gpupool.fragbench.sim import Cluster, pick
from gpupool.fragbench.trace import Node, Pod

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"

POD_HEADER = (
    ",".join(
        (
            "name",
            "cpu_milli",
            "memory_mib",
            "num_gpu",
            "gpu_milli",
            "gpu_spec",
            "qos",
            "pod_phase",
            "creation_time",
            "deletion_time",
            "scheduled_time",
        )
    )
    + "\n"
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _cluster(*gpus_per_node: int, model: str = "T4", cpu: int = 64000) -> Cluster:
    return Cluster.from_nodes([Node(f"n{i}", cpu, 262144, g, model) for i, g in enumerate(gpus_per_node)])


def _shapes(milli: int, cluster: Cluster) -> ShapeDistribution:
    return ShapeDistribution((PodShape(1000, 0, 1, milli),), (1.0,))


# --- loading ---------------------------------------------------------------------------------


def test_load_nodes_and_pods(tmp_path: Path) -> None:
    nodes = load_nodes(
        _write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\na,8000,1024,2,T4\nb,4000,512,0,\n")
    )
    assert nodes == [Node("a", 8000, 1024, 2, "T4"), Node("b", 4000, 512, 0, "")]
    pods = load_pods(
        _write(
            tmp_path / "p.csv",
            POD_HEADER + "p0,1000,10,1,500,T4|A10,LS,Running,0,1,0\np1,200,10,0,0,,BE,Running,0,1,0\n",
        )
    )
    assert pods[0].gpu_spec == frozenset({"T4", "A10"})
    assert pods[0].gpu_request == 500 and pods[1].gpu_request == 0
    # multigpu files carry only the first five columns
    mg = load_pods(_write(tmp_path / "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nx,1,1,8,1000\n"))
    assert mg[0].gpu_request == 8000 and mg[0].gpu_spec == frozenset()


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("p1,abc,10,1,500,,LS,Running,0,1,0", "cpu_milli"),
        ("p1,100,10,1,1500,,LS,Running,0,1,0", "gpu_milli"),
        ("p1,100,10,1", "expected 11 fields"),
        ("p1,100,10,2,500,,LS,Running,0,1,0", "whole GPUs"),
    ],
)
def test_malformed_pod_row_names_file_and_line(tmp_path: Path, row: str, needle: str) -> None:
    path = _write(tmp_path / "bad.csv", POD_HEADER + "p0,1000,10,1,500,,LS,Running,0,1,0\n" + row + "\n")
    with pytest.raises(FragbenchError) as err:
        load_pods(path)
    assert f"{path}:3" in str(err.value)
    assert needle in str(err.value)
    assert isinstance(err.value, ValueError)


def test_malformed_node_row_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\na,8000,1024,x,T4\n")
    with pytest.raises(FragbenchError, match=r"n\.csv:2: column 'gpu'"):
        load_nodes(path)


# --- the fragmentation score -----------------------------------------------------------------


def test_node_fragmentation_by_hand() -> None:
    dist = ShapeDistribution((PodShape(1000, 0, 1, 500), PodShape(4000, 0, 0, 0)), (0.75, 0.25))
    # 500-milli shape can use the 1000 GPU but not the 300 one; the CPU-only shape uses no GPU.
    assert node_fragmentation([1000, 300], 8000, 0, "T4", dist) == pytest.approx(0.75 * 300 + 0.25 * 1300)
    # Too little CPU for the GPU shape: all free GPU milli is a fragment for it.
    assert node_fragmentation([1000, 300], 500, 0, "T4", dist) == pytest.approx(1300)
    pinned = ShapeDistribution((PodShape(1000, 0, 1, 500, frozenset({"A10"})),), (1.0,))
    assert node_fragmentation([1000, 300], 8000, 0, "T4", pinned) == pytest.approx(1300)
    assert node_fragmentation([1000, 300], 8000, 0, "A10", pinned) == pytest.approx(300)
    two = ShapeDistribution((PodShape(1000, 0, 2, 1000),), (1.0,))
    assert node_fragmentation([1000, 900], 8000, 0, "T4", two) == pytest.approx(1900)
    assert node_fragmentation([1000, 1000, 100], 8000, 0, "T4", two) == pytest.approx(100)


def test_capacity_aware_measure_by_hand() -> None:
    dist = ShapeDistribution((PodShape(4000, 0, 1, 500),), (1.0,))
    # FGD: one 500-milli pod fits, so nothing is a fragment ...
    assert node_fragmentation([1000, 1000], 4000, 0, "T4", dist) == pytest.approx(0)
    # ... but the CPU only ever admits one such pod: 1500 milli are stranded.
    assert node_fragmentation([1000, 1000], 4000, 0, "T4", dist, measure="capacity") == pytest.approx(1500)
    blended = node_fragmentation([1000, 1000], 4000, 0, "T4", dist, measure="gpupool")
    assert blended == pytest.approx(GPUPOOL_CAPACITY_WEIGHT * 1500)
    assert 0 < blended < 1500
    big = ShapeDistribution((PodShape(1000, 0, 1, 810),), (1.0,))
    # a per-GPU remainder is not a fragment (issue 11): the mix's smaller shapes take it ...
    assert node_fragmentation([1000], 64000, 0, "T4", big, measure="capacity") == pytest.approx(0)
    # ... nor are GPUs left over by repeated multi-GPU pods (7 free hold one 4-GPU pod and 3 more)
    four = ShapeDistribution((PodShape(1000, 0, 4, 1000),), (1.0,))
    assert node_fragmentation([1000] * 7, 64000, 0, "T4", four, measure="capacity") == pytest.approx(0)
    assert node_fragmentation([1000] * 3, 64000, 0, "T4", four, measure="capacity") == pytest.approx(3000)
    # CPU still strands: two 810-milli pods' worth of GPUs, CPU for one
    assert node_fragmentation([1000, 1000], 1000, 0, "T4", big, measure="capacity") == pytest.approx(1190)
    with pytest.raises(ValueError, match="measure"):
        node_fragmentation([1000], 64000, 0, "T4", big, measure="nope")  # type: ignore[arg-type]


def test_batch_matches_single_node() -> None:
    dist = ShapeDistribution((PodShape(2000, 0, 1, 300), PodShape(9000, 0, 1, 1000)), (0.5, 0.5))
    compiled = dist.compile(["T4"])
    free = np.array([[1000, 200], [250, 0], [1000, 1000]], dtype=np.int64)
    cpu = np.array([10000, 10000, 5000], dtype=np.int64)
    got = node_fragmentation_batch(
        free, cpu, np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int64), compiled
    )
    want = [node_fragmentation(list(f), int(c), 0, "T4", dist) for f, c in zip(free, cpu, strict=True)]
    assert got.tolist() == pytest.approx(want)
    assert want == pytest.approx([0.5 * 200 + 0.5 * 200, 250, 0.5 * 0 + 0.5 * 2000])


# --- policies --------------------------------------------------------------------------------


def _free(cluster: Cluster, rows: list[list[int]]) -> np.ndarray:
    out = np.zeros((len(rows), cluster.max_gpus), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def test_bestfit_takes_tightest_and_fgd_avoids_fragment() -> None:
    cl = _cluster(1, 1)
    free = _free(cl, [[600], [1000]])
    pod = Pod("p", 1000, 10, 1, 200)
    cpu, mem = cl.cpu.copy(), cl.mem.copy()
    shapes = _shapes(500, cl).compile(cl.models)
    # BestFit fills the tighter node, leaving 400 milli no 500-milli task can use.
    assert pick("bestfit", cl, free, cpu, mem, pod) == (0, 0)
    # FGD keeps both GPUs usable for the workload's 500-milli tasks.
    assert pick("fgd", cl, free, cpu, mem, pod, shapes) == (1, 0)
    assert pick("gpupool", cl, free, cpu, mem, pod, shapes) == (1, 0)


def test_gpupool_keeps_big_nodes_whole_and_fills_used_gpus() -> None:
    cl = _cluster(8, 2)
    free = _free(cl, [[1000] * 8, [1000, 1000]])
    shapes = ShapeDistribution((PodShape(1000, 0, 1, 1000),), (1.0,)).compile(cl.models)
    pod = Pod("p", 1000, 10, 1, 1000)
    # Same fragmentation growth on both nodes: the paper's FGD takes the first node,
    # gpupool takes the small one and leaves the 8-GPU node for an 8-GPU pod.
    assert pick("fgd", cl, free, cl.cpu, cl.mem, pod, shapes) == (0, -1)
    assert pick("gpupool", cl, free, cl.cpu, cl.mem, pod, shapes) == (1, -1)
    cl2 = _cluster(2)
    shapes2 = ShapeDistribution((PodShape(1000, 0, 1, 100),), (1.0,)).compile(cl2.models)
    free2 = _free(cl2, [[1000, 600]])
    # Every choice leaves usable GPUs for 100-milli pods; gpupool fills the used GPU first.
    assert pick("gpupool", cl2, free2, cl2.cpu, cl2.mem, Pod("p", 1000, 10, 1, 100), shapes2) == (0, 1)


def test_gpu_choice_inside_a_node() -> None:
    cl = _cluster(3)
    free = _free(cl, [[1000, 700, 600]])
    pod = Pod("p", 1000, 10, 1, 500)
    assert pick("bestfit", cl, free, cl.cpu, cl.mem, pod) == (0, 2)
    shapes = _shapes(500, cl).compile(cl.models)
    # 1000 -> 500 keeps a usable GPU; 700 -> 200 or 600 -> 100 would strand milli.
    assert pick("fgd", cl, free, cl.cpu, cl.mem, pod, shapes) == (0, 0)


def test_packing_prefers_shared_gpu_and_filters() -> None:
    cl = _cluster(2, 2)
    free = _free(cl, [[1000, 1000], [1000, 500]])
    pod = Pod("p", 1000, 10, 1, 300)
    assert pick("packing", cl, free, cl.cpu, cl.mem, pod) == (1, 1)
    # A 2-GPU pod only fits the untouched node; nothing fits a 3-GPU pod.
    assert pick("packing", cl, free, cl.cpu, cl.mem, Pod("q", 1000, 10, 2, 1000)) == (0, -1)
    assert pick("random", cl, free, cl.cpu, cl.mem, Pod("q", 1000, 10, 3, 1000)) is None
    # Model pinning and CPU are respected.
    assert pick("bestfit", cl, free, cl.cpu, cl.mem, Pod("r", 1000, 10, 1, 100, frozenset({"A10"}))) is None
    assert pick("bestfit", cl, free, np.array([500, 64000]), cl.mem, pod) == (1, 1)


# --- the experiment --------------------------------------------------------------------------


def _synthetic(tmp_path: Path) -> tuple[Path, Path]:
    nodes = _write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"n{i},32000,131072,4,{'T4' if i % 2 else 'V100M16'}\n" for i in range(12)),
    )
    rows = [
        "a,4000,1024,1,500,",
        "b,2000,1024,1,300,",
        "c,8000,4096,1,1000,",
        "d,16000,4096,2,1000,",
        "e,6000,1024,0,0,",
        "f,1000,1024,1,700,T4",
        "g,1000,1024,1,200,H100",  # unknown model: counted, never placeable
        "h,64000,1024,1,1000,",  # needs more CPU than any node: impossible
    ]
    pods = _write(
        tmp_path / "openb_pod_list_synthetic.csv",
        POD_HEADER + "".join(r + ",LS,Running,0,1,0\n" for r in rows),
    )
    return nodes, pods


def test_run_fragmentation_shape_and_determinism(tmp_path: Path) -> None:
    nodes, pods = _synthetic(tmp_path)
    seen: list[str] = []
    res = run_fragmentation(
        nodes, pods, policies=["random", "bestfit", "fgd", "gpupool"], seeds=3, progress=seen.append
    )
    again = run_fragmentation(nodes, pods, policies=["random", "bestfit", "fgd", "gpupool"], seeds=3)
    assert [r["seeds"] for r in res["results"]] == [r["seeds"] for r in again["results"]]
    assert res["trace"] == "synthetic"
    assert res["skipped_pods"] == {"unknown_gpu_model": 1, "impossible": 2}
    assert len(seen) == 4
    for row in res["results"]:
        assert set(row) >= {"policy", "allocation_ratio_median", "seeds"}
        assert len(row["seeds"]) == 3
        assert 0.0 < row["allocation_ratio_median"] <= 100.0
        assert row["allocation_ratio_median"] == pytest.approx(float(np.median(row["seeds"])))
    # Different seeds draw different samples.
    assert len(set(res["results"][0]["seeds"])) > 1
    table = format_table(res)
    assert table.row_count == 4


def test_run_fragmentation_rejects_unknown_policy(tmp_path: Path) -> None:
    nodes, pods = _synthetic(tmp_path)
    with pytest.raises(FragbenchError, match="unknown policy"):
        run_fragmentation(nodes, pods, policies=["nope"], seeds=1)


@pytest.mark.skipif(not DATA.is_dir(), reason="shared openb data not present")
def test_real_default_trace_matches_paper() -> None:
    res = run_fragmentation(
        DATA / "openb_node_list_gpu_node.csv",
        DATA / "openb_pod_list_default.csv",
        policies=["bestfit", "fgd"],
        seeds=1,
    )
    assert res["gpus"] == 6212 and res["nodes"] == 1213
    got = {r["policy"]: r["allocation_ratio_median"] for r in res["results"]}
    assert abs(got["fgd"] - res["published"]["fgd"]) < 1.0
    assert abs(got["bestfit"] - res["published"]["bestfit"]) < 1.0
    assert got["fgd"] > got["bestfit"]


def test_run_fragmentation_on_a_variant(tmp_path: Path) -> None:
    nodes, pods = _synthetic(tmp_path)
    res = run_fragmentation(nodes, pods, policies=["fgd"], seeds=2, variant="model-constrained=0.5")
    assert res["trace"] == "synthetic+model-constrained=0.5"
    assert res["variant"] == {"kind": "model-constrained", "level": 0.5, "seed": 0}
    before, after = res["shares"]["base"], res["shares"]["run"]
    assert after["model-constrained"] == pytest.approx(0.5, abs=0.1)
    assert before["model-constrained"] < 0.4
    assert after["gpu-share"] == before["gpu-share"]
    again = run_fragmentation(nodes, pods, policies=["fgd"], seeds=2, variant="model-constrained=0.5")
    assert again["results"][0]["seeds"] == res["results"][0]["seeds"]
    with pytest.raises(FragbenchError, match="KIND=LEVEL"):
        run_fragmentation(nodes, pods, policies=["fgd"], seeds=1, variant="pinned=0.5")


# --- weights per usable GPU (issue 11) -------------------------------------------------------

_G2_T4 = [Node("g2", 96000, 262144, 8, "G2"), Node("t4", 104000, 262144, 2, "T4")]


def test_per_gpu_weights_by_hand() -> None:
    free = PodShape(16000, 0, 1, 1000)
    pinned = PodShape(4000, 0, 1, 1000, frozenset({"T4"}))
    big = PodShape(110000, 0, 1, 1000)  # fits no node: left as it is
    cpu_only = PodShape(8000, 0, 0, 0)
    kinds = Cluster.from_nodes(_G2_T4).kinds
    assert [(k.model, k.gpus, k.nodes) for k in kinds] == [("G2", 8, 1), ("T4", 2, 1)]
    dist = ShapeDistribution((free, pinned, big, cpu_only), (0.4, 0.1, 0.1, 0.4))
    got = dict(zip(*astuple_weights(per_gpu_weights(dist, kinds, popularity=1.0)), strict=True))
    # the pinned shape can use 2 of the 10 GPUs: 5 times its weight; then renormalised by 1.4
    assert got[pinned] == pytest.approx(0.5 / 1.4)
    assert got[free] == pytest.approx(0.4 / 1.4) and got[cpu_only] == pytest.approx(0.4 / 1.4)
    assert got[big] == pytest.approx(0.1 / 1.4)
    no_pins = ShapeDistribution((free, cpu_only), (0.5, 0.5))
    same = per_gpu_weights(no_pins, kinds, popularity=1.0)  # fits everywhere: unchanged
    assert dict(zip(*astuple_weights(same), strict=True)) == {free: 0.5, cpu_only: 0.5}


def astuple_weights(dist: ShapeDistribution) -> tuple[tuple[PodShape, ...], tuple[float, ...]]:
    return dist.shapes, dist.weights


def test_popularity_cut_comes_after_the_weighting() -> None:
    """A shape too rare for the pod-count cut stays when it fits few GPUs (the 8-GPU, 120-core
    pods that fit only the G3 nodes, in the multi-GPU variants)."""
    nodes = [Node(f"g{i}", 96000, 262144, 8, "G2") for i in range(19)] + [Node("g3", 128000, 262144, 8, "G3")]
    common = PodShape(8000, 0, 1, 1000)
    rare = PodShape(120000, 0, 8, 1000)  # 3% of the pods, fits 8 of the 160 GPUs
    dist = ShapeDistribution((common, rare), (0.97, 0.03))
    assert ShapeDistribution.from_counts(Counter({common: 97, rare: 3})).shapes == (common,)
    kept = per_gpu_weights(dist, Cluster.from_nodes(nodes).kinds)
    assert kept.shapes == (common, rare)  # 0.03 x 20 = 0.6 against 0.97: 38% of the weight


def test_gpupool_leaves_the_scarce_model_to_the_pods_pinned_there() -> None:
    """The simulator's ``gpupool`` with weights per usable GPU (the bench's, and the engine's)
    sends an unpinned 32-core pod to the G2 node; with the pod-share weights (before issue 11)
    the capacity-aware half sent it to the T4 node, the only one the T4-pinned pods can use."""
    cl = Cluster.from_nodes(_G2_T4)
    free = _free(cl, [[1000] * 8, [1000, 1000]])
    dist = ShapeDistribution(
        (PodShape(16000, 0, 1, 1000), PodShape(4000, 0, 1, 1000, frozenset({"T4"}))), (0.8, 0.2)
    )
    pod = Pod("p", 32000, 10, 1, 1000)
    pool = per_gpu_weights(dist, cl.kinds, popularity=1.0).compile(cl.models)
    assert pick("gpupool", cl, free, cl.cpu, cl.mem, pod, pool) == (0, -1)
    assert pick("gpupool", cl, free, cl.cpu, cl.mem, pod, dist.compile(cl.models)) == (1, -1)
    assert pick("fgd", cl, free, cl.cpu, cl.mem, pod, dist.compile(cl.models)) == (0, -1)
