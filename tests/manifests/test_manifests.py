"""Manifests: quantities, located errors, all-or-nothing loading, interop labels and annotations."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool import quantity as qty
from gpupool.manifests import ManifestError, build, load_bundle, load_files, parse_documents
from gpupool.model import UNLIMITED, TopologyScope

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("fn", "value", "expected"),
    [
        (qty.cpu_milli, "500m", 500),
        (qty.cpu_milli, 2, 2000),
        (qty.cpu_milli, "1.5", 1500),
        (qty.memory_mib, "80Gi", 81920),
        (qty.memory_mib, "1Ti", 1048576),
        (qty.memory_mib, "1G", 954),  # 10^9 bytes rounded up to MiB
        (qty.gpu_milli, 8, 8000),
        (qty.gpu_milli, "500m", 500),
        (qty.gpu_milli, 0.25, 250),
        (qty.mib_value, 20000, 20000),
        (qty.mib_value, "16Gi", 16384),
        (qty.parse_duration, "1d2h", 93600.0),
        (qty.parse_duration, "90m", 5400.0),
        (qty.parse_duration, 30, 30.0),
    ],
)
def test_quantities(fn: object, value: object, expected: object) -> None:
    assert fn(value) == expected  # type: ignore[operator]


@pytest.mark.parametrize("bad", ["abc", "-1", "1Qi", True, None, float("nan")])
def test_bad_quantities_say_what_was_expected(bad: object) -> None:
    with pytest.raises(qty.QuantityError):
        qty.cpu_milli(bad)


def test_gpu_finer_than_milli_is_rejected() -> None:
    with pytest.raises(qty.QuantityError, match="finer than 1/1000"):
        qty.gpu_milli("0.0005")


def test_examples_load() -> None:
    b = load_bundle([EXAMPLES / "cluster", EXAMPLES / "workloads"])
    assert len(b.nodes) == 16
    assert {p.name for p in b.pools} == {"h100-training", "a100-inference", "l40s-experiment"}
    h100 = [n for n in b.nodes if n.gpu_model == "H100-80GB"]
    # node group topology: 8 nodes over 2 racks, NVLink domains of 2 nodes
    assert {n.rack for n in h100} == {"r1", "r2"}
    assert len({n.nvlink_domain for n in h100}) == 4
    assert h100[0].label_map["nvidia.com/gpu.product"] == "H100-80GB"
    assert h100[0].domain(TopologyScope.NODE) == h100[0].name
    eval_ = next(w for w in b.workloads if w.name == "eval-harness")
    assert eval_.queue == "vision-team"  # from the Kueue queue-name label
    q = next(q for q in b.queues if q.name == "vision-team").quota("h100-training")
    assert (
        q is not None
        and q.guarantee == (24000, UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED)
        and q.lending_limit == (8000, UNLIMITED, UNLIMITED, UNLIMITED, UNLIMITED)
    )


BAD = """\
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: team-a}
spec:
  parent: nowhere
  weight: -1
  quotas: [{pool: gpu, guarantee: {nvidia.com/gpu: lots}}]
---
apiVersion: gpupool.io/v1alpha1
kind: Workload
metadata: {name: Bad_Name}
spec: {queue: team-a, podGroups: [{resources: {nvidia.com/gpu: 1}}]}
---
apiVersion: gpupool.io/v1alpha1
kind: Workload
metadata: {name: job}
spec:
  queue: team-a
  priorityClass: vip
  podGroups: [{replicas: 2, resources: {nvidia.com/gpu: 1.5, cpu: 2, foo: 1}}]
  gang: {minMember: 5}
---
apiVersion: gpupool.io/v1alpha1
kind: Workload
metadata: {name: typo}
spec: {queue: team-a, podGroup: []}
---
apiVersion: v1
kind: Pod
metadata: {name: x}
"""


def test_every_error_is_located_and_reported_at_once(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    with pytest.raises(ManifestError) as ei:
        load_files([f])
    errs = ei.value.errors
    text = "\n".join(errs)
    # structure errors, each with file, document and field
    assert f"{f}: document 1 (Queue/team-a): spec.weight" in text
    assert "document 2 (Workload/Bad_Name): metadata.name" in text
    assert "document 4 (Workload/typo): spec.podGroup: Extra inputs are not permitted" in text
    assert "document 4 (Workload/typo): spec.podGroups: Field required" in text
    assert "document 5 (Pod/x): apiVersion" in text and "document 5 (Pod/x): kind" in text


def test_semantic_errors_are_located() -> None:
    text = BAD.split("---\n")[0].replace("  weight: -1\n", "") + "---\n" + BAD.split("---\n")[2]
    docs = parse_documents(text, "f.yaml")
    with pytest.raises(ManifestError) as ei:
        build(docs)
    text = "\n".join(ei.value.errors)
    assert (
        "f.yaml: document 1 (Queue/team-a): spec.quotas[0].guarantee.nvidia.com/gpu: invalid quantity 'lots'"
        in text
    )
    assert "spec.parent: queue 'nowhere' does not exist" in text
    assert "spec.podGroups[0].resources.nvidia.com/gpu: more than one GPU must be a whole number" in text
    assert "spec.podGroups[0].resources.foo: unknown resource" in text
    assert "spec.priorityClass: unknown priority class 'vip'" in text
    assert "spec.gang.minMember: 5 is more than the 2 pods" in text


def test_invalid_yaml_names_line() -> None:
    with pytest.raises(ManifestError, match=r"x.yaml: line 2, column \d+: invalid YAML"):
        parse_documents("kind: Queue\n  bad: [\n", "x.yaml")


def test_a_file_with_errors_is_rejected_whole(tmp_path: Path) -> None:
    good = tmp_path / "a.yaml"
    good.write_text((EXAMPLES / "cluster" / "pools.yaml").read_text())
    bad = tmp_path / "b.yaml"
    bad.write_text(
        "apiVersion: gpupool.io/v1alpha1\nkind: ResourcePool\nmetadata: {name: x}\nspec: {placement: Random}\n"
    )
    with pytest.raises(ManifestError) as ei:
        load_files([tmp_path])
    assert len(ei.value.errors) == 1 and "spec.placement" in ei.value.errors[0]


def test_overlapping_pools_and_child_guarantees_are_rejected() -> None:
    text = (
        (EXAMPLES / "cluster" / "cluster.yaml").read_text()
        + """
---
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: all}
spec: {}
---
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: h100}
spec: {gpuModels: [H100-80GB]}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: org}
spec: {quotas: [{pool: all, guarantee: {nvidia.com/gpu: 4}}]}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: kid}
spec: {parent: org, quotas: [{pool: all, guarantee: {nvidia.com/gpu: 8}, lendingLimit: {nvidia.com/gpu: 9}}]}
"""
    )
    with pytest.raises(ManifestError) as ei:
        build(parse_documents(text, "c.yaml"))
    text_errs = "\n".join(ei.value.errors)
    assert "selected by more than one pool (all, h100)" in text_errs
    assert "children guarantee 8 GPUs, more than this queue's 4" in text_errs
    assert "lendingLimit: must not exceed the guarantee" in text_errs


def test_fractional_forms() -> None:
    text = """
apiVersion: gpupool.io/v1alpha1
kind: Workload
metadata: {name: a, annotations: {gpu-fraction: "0.5", gpu-memory: "10000"}}
spec: {queue: q, podGroups: [{resources: {cpu: 1}}]}
---
apiVersion: gpupool.io/v1alpha1
kind: Workload
metadata: {name: b}
spec: {queue: q, podGroups: [{resources: {nvidia.com/gpucores: 30, nvidia.com/gpumem: 8000}}]}
---
apiVersion: gpupool.io/v1alpha1
kind: Workload
metadata: {name: c}
spec: {queue: q, podGroups: [{resources: {nvidia.com/gpumem: 8000}}]}
"""
    a, b, c = build(parse_documents(text, "w.yaml")).workloads
    assert (a.pod_groups[0].request.gpu_milli, a.pod_groups[0].request.gpu_memory_mib) == (500, 10000)
    assert (b.pod_groups[0].request.gpu_milli, b.pod_groups[0].request.gpu_memory_mib) == (300, 8000)
    # GPU memory alone is a memory-only share (KAI's gpu-memory): the engine makes it a fraction
    assert (c.pod_groups[0].request.gpu_milli, c.pod_groups[0].request.gpu_memory_mib) == (0, 8000)


@pytest.mark.parametrize(("value", "want"), [(16, 16), (0, 0)])
def test_a_pools_reservations_reach_the_model(value: int, want: int) -> None:
    doc = f"apiVersion: gpupool.io/v1alpha1\nkind: ResourcePool\nmetadata: {{name: p}}\nspec: {{reservations: {value}}}\n"
    assert build(parse_documents(doc, "p.yaml")).pools[0].reservations == want


@pytest.mark.parametrize("value", ["-1", "1001", "many"])
def test_bad_reservations_are_refused_naming_the_field(value: str) -> None:
    doc = f"apiVersion: gpupool.io/v1alpha1\nkind: ResourcePool\nmetadata: {{name: p}}\nspec: {{reservations: {value}}}\n"
    with pytest.raises(ManifestError, match=r"ResourcePool/p\): spec\.reservations"):
        build(parse_documents(doc, "p.yaml"))
