"""Tests for the openb variant generator: each kind moves its own share and no other."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.fragbench import FragbenchError, load_pods
from gpupool.fragbench.specmix import FRACTIONAL_SHARE, GPUSPEC10_MIX, spec_mix
from gpupool.fragbench.trace import Node, Pod
from gpupool.fragbench.variants import KINDS, Variant, apply_variant, parse_variant, shares, write_pods

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"

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
    ("cpu-heavy", 0.6),
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


def test_model_pins_follow_the_gpuspec10_mix_and_stay_placeable() -> None:
    base = _pods()
    out = apply_variant(base, NODES, Variant("model-constrained", 1.0), seed=0)
    pinned = [p for p in out if p.gpu_spec]
    assert len(pinned) == sum(1 for p in base if p.num_gpu)
    for p in pinned:  # only to models of this cluster, and to some model with a node that holds it
        assert p.gpu_spec <= {"G2", "T4", "P100"}
        assert any(
            n.model in p.gpu_spec and n.num_gpu >= p.num_gpu and n.cpu_milli >= p.cpu_milli for n in NODES
        )
    # gpuspec10 never pins a fractional pod to G2 alone, and pins to T4 far beyond its GPUs
    assert not any(p.gpu_spec == {"G2"} for p in pinned if p.gpu_milli < 1000)
    t4 = sum(1 for p in pinned if p.gpu_spec == {"T4"})
    assert t4 / len(pinned) > 0.3  # T4 holds 8 of the 58 GPUs; the old supply draw gave ~0.1
    assert any(len(p.gpu_spec) > 1 for p in pinned)  # sets such as "G2|P100|T4|V100M16|V100M32"


def test_pinned_pods_are_fractional_in_the_mix_share() -> None:
    out = apply_variant(_pods(), NODES, Variant("model-constrained", 0.3), seed=2)
    pinned = [p for p in out if p.gpu_spec]
    assert len(pinned) == round(0.3 * 106)
    frac = sum(1 for p in pinned if p.gpu_milli < 1000)
    assert frac == round(len(pinned) * FRACTIONAL_SHARE)  # 270 of gpuspec10's 732 pinned pods


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
    with pytest.raises(FragbenchError, match=r"must be in \[0.1, 10\]"):
        parse_variant("cpu-heavy=0.05")


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


def _pinned_demand_per_gpu(pods: list[Pod], nodes: list[Node]) -> dict[str, float]:
    """Per model: the GPUs its pinned pods ask for (split evenly over a set) over its GPUs."""
    gpus: dict[str, int] = {}
    for n in nodes:
        gpus[n.model] = gpus.get(n.model, 0) + n.num_gpu
    demand = dict.fromkeys(gpus, 0.0)
    for p in pods:
        for m in p.gpu_spec:
            demand[m] += p.num_gpu * p.gpu_milli / 1000 / len(p.gpu_spec)
    return {m: demand[m] / gpus[m] for m in gpus if gpus[m]}


@pytest.mark.skipif(not DATA.is_dir(), reason="shared openb data not present")
def test_model_constrained_reproduces_gpuspec10() -> None:
    """At gpuspec10's share, the generated variant of the default trace has its structure."""
    from gpupool.fragbench import load_nodes

    nodes = load_nodes(DATA / "openb_node_list_gpu_node.csv")
    real = load_pods(DATA / "openb_pod_list_gpuspec10.csv")
    assert spec_mix(real) == {spec: (f, w) for spec, f, w in GPUSPEC10_MIX}  # the table is the file's
    level = shares(real)["model-constrained"]  # 732 of 7,064 GPU pods
    gen = apply_variant(
        load_pods(DATA / "openb_pod_list_default.csv"), nodes, Variant("model-constrained", level)
    )
    for pods in (real, gen):
        assert shares(pods)["model-constrained"] == pytest.approx(0.1036, abs=5e-4)
    pinned = {id(pods): [p for p in pods if p.gpu_spec] for pods in (real, gen)}
    r, g = pinned[id(real)], pinned[id(gen)]
    frac = [sum(p.gpu_milli < 1000 for p in x) / len(x) for x in (r, g)]
    assert frac[1] == pytest.approx(frac[0], abs=0.005)  # 0.369 (0.436 of all GPU pods)
    multi = [sum(len(p.gpu_spec) > 1 for p in x) / len(x) for x in (r, g)]
    assert multi[1] == pytest.approx(multi[0], abs=0.03)  # 0.18 accept several models
    want, got = _pinned_demand_per_gpu(real, nodes), _pinned_demand_per_gpu(gen, nodes)
    for model in ("T4", "P100", "V100M16", "V100M32"):  # ~0.25-0.34 of each small model's GPUs
        assert got[model] == pytest.approx(want[model], abs=0.1), model
    assert got["G2"] < 0.06 and want["G2"] < 0.06  # and under 0.04 of G2's (71% of the GPUs)
