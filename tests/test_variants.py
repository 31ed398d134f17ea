"""Tests for the openb variant generator: each kind moves its own share and no other."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.fragbench import FragbenchError, load_pods
from gpupool.fragbench.trace import Node, Pod
from gpupool.fragbench.variants import KINDS, Variant, apply_variant, parse_variant, shares, write_pods

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "openb"

NODES = [
    *(Node(f"g{i}", 96000, 786432, 8, "G2") for i in range(6)),
    *(Node(f"t{i}", 104000, 393216, 2, "T4") for i in range(4)),
    Node("p0", 16000, 131072, 2, "P100"),
]


def _pods() -> list[Pod]:
    """A small trace with every kind of pod: whole, fractional, multi-GPU, CPU-only."""
    out: list[Pod] = []
    for i in range(60):
        out.append(Pod(f"w{i}", 4000 + 100 * (i % 7), 8192, 1, 1000))
    for i in range(40):
        out.append(Pod(f"f{i}", 2000, 4096, 1, (250, 500, 800)[i % 3]))
    for i in range(6):
        out.append(Pod(f"m{i}", 16000, 32768, (2, 4, 8)[i % 3], 1000))
    for i in range(20):
        out.append(Pod(f"c{i}", 3000 + 500 * (i % 4), 2048, 0, 0))
    return out


def _cpu_only(pods: list[Pod]) -> int:
    return sum(p.cpu_milli for p in pods if p.num_gpu == 0)


LEVELS = [
    ("model-constrained", 0.2),
    ("model-constrained", 0.5),
    ("gpu-share", 0.6),
    ("gpu-share", 1.0),
    ("multi-gpu", 0.3),
    ("multi-gpu", 0.5),
    ("cpu-heavy", 1.5),
    ("cpu-heavy", 2.5),
]


@pytest.mark.parametrize(("kind", "level"), LEVELS)
def test_variant_hits_its_share_and_leaves_the_others(kind: str, level: float) -> None:
    base = _pods()
    before = shares(base, _cpu_only(base))
    out = apply_variant(base, NODES, Variant(kind, level), seed=3)
    after = shares(out, _cpu_only(base))
    # tolerance: one pod (or one multi-GPU pod's devices / one CPU-only pod's CPU) of granularity
    tolerance = {"model-constrained": 0.01, "gpu-share": 0.01, "multi-gpu": 0.05, "cpu-heavy": 0.1}
    assert after[kind] == pytest.approx(level, abs=tolerance[kind])
    for other in KINDS:
        if other != kind:
            assert after[other] == pytest.approx(before[other], abs=1e-12), other
    assert base == _pods()  # the input list is never changed in place


def test_variants_are_deterministic_given_a_seed() -> None:
    base = _pods()
    for kind, level in LEVELS:
        v = Variant(kind, level)
        assert apply_variant(base, NODES, v, seed=5) == apply_variant(base, NODES, v, seed=5)
    v = Variant("model-constrained", 0.5)
    assert apply_variant(base, NODES, v, seed=1) != apply_variant(base, NODES, v, seed=2)


def test_model_pins_follow_supply_and_stay_placeable() -> None:
    base = _pods()
    out = apply_variant(base, NODES, Variant("model-constrained", 1.0), seed=0)
    pinned = [p for p in out if p.gpu_spec]
    assert len(pinned) == sum(1 for p in base if p.num_gpu)
    assert all(len(p.gpu_spec) == 1 for p in pinned)
    # an 8-GPU pod can only be pinned where 8-GPU nodes are; a pod wanting 16 cores never to T4
    # is fine, but never to a model without a node that holds it
    for p in pinned:
        (model,) = p.gpu_spec
        assert any(n.model == model and n.num_gpu >= p.num_gpu and n.cpu_milli >= p.cpu_milli for n in NODES)
    g2 = sum(1 for p in pinned if p.gpu_spec == {"G2"})
    assert g2 > len(pinned) / 2  # G2 holds 48 of the 58 GPUs


def test_gpu_share_takes_milli_from_the_trace() -> None:
    base = _pods()
    out = apply_variant(base, NODES, Variant("gpu-share", 1.0), seed=0)
    assert {p.gpu_milli for p in out if p.num_gpu == 1} == {250, 500, 800}
    assert [p.num_gpu for p in out] == [p.num_gpu for p in base]


def test_parse_variant_and_its_errors() -> None:
    assert parse_variant("model-constrained=0.3") == Variant("model-constrained", 0.3)
    assert parse_variant("cpu-heavy=250%") == Variant("cpu-heavy", 2.5)
    assert parse_variant("gpu-share=80%").label == "gpu-share=0.8"
    with pytest.raises(FragbenchError, match="KIND=LEVEL"):
        parse_variant("nonsense=0.3")
    with pytest.raises(FragbenchError, match="not a number"):
        parse_variant("gpu-share=lots")
    with pytest.raises(FragbenchError, match=r"must be in \[1, 10\]"):
        parse_variant("cpu-heavy=0.5")


def test_a_share_already_above_the_level_is_refused() -> None:
    base = _pods()  # 40 of 100 one-GPU pods are fractional
    with pytest.raises(FragbenchError, match=r"already 0\.400"):
        apply_variant(base, NODES, Variant("gpu-share", 0.3))


def test_written_variant_reads_back(tmp_path: Path) -> None:
    out = apply_variant(_pods(), NODES, Variant("model-constrained", 0.5), seed=0)
    write_pods(tmp_path / "v.csv", out)
    assert load_pods(tmp_path / "v.csv") == out


@pytest.mark.skipif(not DATA.is_dir(), reason="shared openb data not present")
def test_real_default_trace_variants() -> None:
    from gpupool.fragbench import load_nodes

    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    base = load_pods(DATA / "openb_pod_list_default.csv")
    before = shares(base, _cpu_only(base))
    assert before["model-constrained"] == 0.0
    assert before["gpu-share"] == pytest.approx(0.44, abs=0.01)
    for kind, level in (("model-constrained", 0.3), ("multi-gpu", 0.4), ("cpu-heavy", 2.0)):
        after = shares(apply_variant(base, nodes, Variant(kind, level), seed=0), _cpu_only(base))
        assert after[kind] == pytest.approx(level, abs=0.005)
        assert all(after[o] == pytest.approx(before[o]) for o in KINDS if o != kind)
