"""Task profile and the suggested design: fitted on one part of a trace, replayed on the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.cost.profile import hourly_demand, split
from gpupool.sim.sources import JobSpec

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT / "examples" / "sim" / "philly.yaml"
PHILLY_DATA = ROOT.parent / "shared" / "data" / "philly" / "philly.csv"
runner = CliRunner()

ONE_POOL = """
apiVersion: gpupool.io/v1alpha1
kind: Scenario
metadata: {name: one-pool}
spec:
  seed: 3
  policies: [gpupool]
  cluster:
    documents:
      - {apiVersion: gpupool.io/v1alpha1, kind: Cluster, metadata: {name: small}, spec: {nodeGroups: [
          {name: a, count: 4, gpu: {model: A100-80GB, count: 8, memory: 80Gi}, cpu: 64, memory: 512Gi}]}}
      - {apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: shared}, spec: {}}
      - {apiVersion: gpupool.io/v1alpha1, kind: Queue, metadata: {name: org},
         spec: {quotas: [{pool: shared, guarantee: {nvidia.com/gpu: 32}}]}}
      - {apiVersion: gpupool.io/v1alpha1, kind: Queue, metadata: {name: team-a},
         spec: {parent: org, quotas: [{pool: shared, guarantee: {nvidia.com/gpu: 16}}]}}
      - {apiVersion: gpupool.io/v1alpha1, kind: Queue, metadata: {name: team-b},
         spec: {parent: org, quotas: [{pool: shared, guarantee: {nvidia.com/gpu: 16}}]}}
  workload:
    generator:
      duration: 2d
      types:
        - {type: training, ratePerHour: 2, queues: [team-a], sizes: {"8": 1, "4": 1}, meanDuration: 4h}
        - {type: inference, ratePerHour: 3, queues: [team-b], sizes: {"1": 1}, meanDuration: 2h}
"""


def rows(rep: dict[str, object], name: str) -> list[dict[str, object]]:
    t = next(t for t in rep["tables"] if t["name"] == name)  # type: ignore[attr-defined]
    return [dict(zip(t["columns"], r, strict=True)) for r in t["rows"]]


def queues(path: Path) -> dict[str, dict[str, object]]:
    return {
        d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Queue"
    }


def guarantee(spec: dict[str, object]) -> int:
    return int(spec["quotas"][0]["guarantee"]["nvidia.com/gpu"])  # type: ignore[index]


def test_profile_suggests_a_design_that_validates_and_replays(tmp_path: Path) -> None:
    sc = tmp_path / "one-pool.yaml"
    sc.write_text(ONE_POOL)
    res = runner.invoke(app, ["profile", str(sc), "--out-dir", str(tmp_path), "--replay", "-o", "json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["summary"]["fittedOn"] + rep["summary"]["heldOut"] == rep["summary"]["jobs"]
    replay = {r["design"]: r for r in rows(rep, "replay")}
    assert set(replay) == {"baseline", "suggested"} and replay["suggested"]["completion_rate"] > 0.9
    advice = {r["type"]: r["nonPreemptible"] for r in rows(rep, "preemption")}
    assert advice == {"inference": True, "training": False}
    suggested = tmp_path / "suggested.yaml"
    assert runner.invoke(app, ["validate", "-f", str(suggested)]).exit_code == 0
    qs = queues(suggested)
    assert qs["team-a"]["parent"] == qs["team-b"]["parent"] == "org"
    assert guarantee(qs["team-a"]) + guarantee(qs["team-b"]) <= 32


def test_bad_input_is_named(tmp_path: Path) -> None:
    sc = tmp_path / "one-pool.yaml"
    sc.write_text(ONE_POOL)
    bad = runner.invoke(app, ["profile", str(sc), "--fit-share", "0.99"])
    assert bad.exit_code == 2 and "--fit-share" in bad.output
    poc = runner.invoke(app, ["profile", str(ROOT / "examples" / "sim" / "poc.yaml")])
    assert poc.exit_code == 2 and "one pool" in poc.output


def test_split_and_demand_by_hand() -> None:
    jobs = [
        JobSpec("a", "q", 0.0, 7200.0, gpus=2),
        JobSpec("b", "q", 1800.0, 1800.0, gpus=4),
        JobSpec("c", "r", 10_000.0, 60.0),
    ]
    fit, rest, cut = split(jobs, 0.5)
    assert [j.name for j in fit] == ["a", "b"] and [(j.name, j.submit) for j in rest] == [("c", 5000.0)]
    assert cut == 5000.0
    d = hourly_demand(fit)["q"]
    assert list(d[:2]) == [4.0, 2.0]  # hour 0: 2 GPUs + 4 GPUs for half of it; hour 1: 2 GPUs


@pytest.mark.skipif(not PHILLY_DATA.exists(), reason="the Philly trace is not in ../shared/data")
def test_philly_profile_validates(tmp_path: Path) -> None:
    res = runner.invoke(app, ["profile", str(PHILLY), "--out-dir", str(tmp_path), "-o", "json"])
    assert res.exit_code == 0, res.output
    qs = queues(tmp_path / "suggested.yaml")
    leaves = {n: s for n, s in qs.items() if s.get("parent")}
    assert len(leaves) == 15 and sum(guarantee(s) for s in leaves.values()) <= 384
    assert runner.invoke(app, ["validate", "-f", str(tmp_path / "suggested.yaml")]).exit_code == 0
