"""The cluster install files: generated from the sources, committed, and valid offline.

Why compare committed files with the generators: the chart ships the committed files, and the
models (gpupool.manifests) change; a stale CRD would accept what ``gpupool validate`` refuses.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.deploy.cli import crd_files
from gpupool.deploy.crds import all_crds
from gpupool.deploy.validate import builtin_problems, resource_problems, structural_problems

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "gpupool"
K8S_VERSION = "1.31.0"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def test_committed_crds_are_the_generators_output() -> None:
    files = crd_files()
    committed = {p.name for p in (CHART / "crds").glob("*.yaml")}
    assert committed == set(files), "run: gpupool deploy crds --out charts/gpupool/crds"
    for name, text in files.items():
        assert (CHART / "crds" / name).read_text(encoding="utf-8") == text, (
            f"{name} is stale; run: gpupool deploy crds --out charts/gpupool/crds"
        )


@pytest.mark.parametrize("crd", all_crds(), ids=lambda c: c["metadata"]["name"])
def test_crd_schemas_are_structural_and_valid_crds(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert structural_problems(schema) == []
    assert "$ref" not in yaml.safe_dump(crd)
    assert builtin_problems(crd, K8S_VERSION) == []


def test_structural_check_can_fail() -> None:
    assert structural_problems({"type": "object", "properties": {"a": {"$ref": "#/x"}}}) == [
        ".a: $ref is not allowed",
        ".a: no type",
    ]


def test_workload_crd_shows_queue_phase_position_reason_age() -> None:
    (wl,) = [c for c in all_crds() if c["spec"]["names"]["kind"] == "Workload"]
    cols = wl["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in cols] == ["Queue", "Phase", "Position", "Reason", "Age"]
    assert wl["spec"]["scope"] == "Namespaced" and wl["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_every_example_pool_queue_and_workload_matches_the_crds() -> None:
    checked = 0
    for path in sorted((REPO / "examples").rglob("*.yaml")):
        for doc in _docs(path):
            if doc.get("kind") in ("ResourcePool", "Queue", "Workload"):
                assert resource_problems(doc, all_crds()) == [], path
                checked += 1
    assert checked >= 10


def test_quantities_are_int_or_string_and_unknown_fields_are_refused() -> None:
    (queue,) = [
        d for d in _docs(REPO / "examples/cluster/queues.yaml") if d["metadata"]["name"] == "llm-team"
    ]
    ok = copy.deepcopy(queue)
    ok["spec"]["quotas"][0]["guarantee"] = {"nvidia.com/gpu": "40", "cpu": 8}
    assert resource_problems(ok, all_crds()) == []
    bad = copy.deepcopy(queue)
    bad["spec"]["weight"] = 0
    bad["spec"]["quotas"][0]["pool"] = ""
    bad["spec"]["colour"] = "blue"
    problems = resource_problems(bad, all_crds())
    assert any(p.startswith("Queue: spec.weight:") for p in problems), problems
    assert any(p.startswith("Queue: spec.quotas.0.pool:") for p in problems), problems
    assert any("colour" in p for p in problems), problems
