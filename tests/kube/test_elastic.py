"""Elastic inference (推理弹性): min-replicas guaranteed, extras borrow and are the first victims.

Two halves: the translation and the source (a Deployment marked ``gpupool.io/min-replicas``
becomes a non-preemptible base workload and one preemptible workload per extra replica; a
replica-count change submits or cancels extras), and the simulator replay of
``examples/sim/elastic-inference.yaml`` in a small version (30 hours): the afternoon peak borrows
training's idle guarantee and training takes it back the moment it needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.kube.elastic import (
    ELASTIC_INDEX,
    ELASTIC_OF,
    EXTRA_PRIORITY_CLASS,
    base_of,
    elastic_workloads,
)
from gpupool.kube.source import KubeSource, SourcePolicy
from gpupool.kube.workloads import KubeWorkloadError
from gpupool.sim.results import RunResult
from gpupool.sim.runner import run_scenario
from gpupool.sim.scenario import load_scenario
from tests.kube.test_source import Events, Inf, Subm

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sim" / "elastic-inference.yaml"
BASE, EXTRA, TRAINING_GUARANTEE, SERVING_GUARANTEE = "inference-critical", "elastic-extra", 56, 8


# -- the simulator -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    doc = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    doc["spec"]["horizon"] = "30h"
    doc["spec"]["workload"]["generator"]["duration"] = "30h"
    doc["spec"]["workload"]["generator"]["bursts"] = doc["spec"]["workload"]["generator"]["bursts"][:2]
    path = tmp_path_factory.mktemp("sim") / "elastic-small.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    [run] = run_scenario(load_scenario(path), check_invariants=True)
    return run


def _preemptions(r: RunResult) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for e in r.events:
        if e.kind == "preempted":
            out.setdefault(e.subject, []).append(e.time)
    return out


def _in_use(r: RunResult, queue: str, t: float) -> int:
    """GPUs the queue's jobs hold at time t (each admission runs until its preemption or finish)."""
    pre, total = _preemptions(r), 0
    for j in r.jobs:
        if j.spec.queue != queue:
            continue
        for s in j.starts:
            ends = [x for x in pre.get(j.spec.name, []) if x >= s]
            end = min([*ends, j.finish if j.finish is not None else float("inf")])
            if s <= t < end:
                total += j.spec.gpus * j.spec.replicas
    return total


def test_the_peak_borrows_from_training_and_training_takes_its_guarantee_back(small_run: Any) -> None:
    r: RunResult = small_run.result
    assert small_run.metrics["invariant_violations"] == 0
    by_class = {j.spec.name: j.spec.priority_class for j in r.jobs}
    # the peak borrowed: serving held more than its guarantee in the afternoon
    peak = max(_in_use(r, "serving", h * 1800.0) for h in range(20, 34))
    assert peak > SERVING_GUARANTEE + 10, peak
    # training reclaimed: every victim is an extra, every preemptor a training job
    victims = [e for e in r.events if e.kind == "preempted"]
    assert victims, "the training burst in the peak preempted nothing"
    assert {by_class[e.subject] for e in victims} == {EXTRA}
    assert all(e.detail.startswith("ReclaimWithinCohort by tra-") for e in victims), victims[:3]
    # the base replicas: started at once, never preempted, running to the end
    base = [j for j in r.jobs if j.spec.priority_class == BASE]
    assert len(base) == 8 and all(j.first_start == 0.0 and j.preempted == 0 for j in base)
    # training gets its guarantee back: a job that fits in the guarantee starts when it arrives
    for j in r.jobs:
        if j.spec.queue != "training":
            continue
        before = _in_use(r, "training", j.spec.submit - 1e-6)
        if before + j.spec.gpus * j.spec.replicas <= TRAINING_GUARANTEE:
            assert j.first_start == j.spec.submit, (j.spec.name, before)
    # and gives it back: at the night's trough serving holds (almost) only its base
    assert _in_use(r, "serving", 26 * 3600.0) <= SERVING_GUARANTEE + 2


def test_the_report_gives_the_waits_of_both_queues(small_run: Any) -> None:
    per_queue = small_run.metrics["per_queue"]
    assert {"serving", "training"} <= set(per_queue)
    for q in ("serving", "training"):
        assert {"wait_mean_s", "wait_p95_s"} <= set(per_queue[q])
    assert per_queue["training"]["wait_p95_s"] == 0.0  # reclaimed at once, never waited
    assert per_queue["serving"]["preemptions"] == small_run.metrics["preemptions"] > 0


# -- the translation -----------------------------------------------------------------------------
def deployment(replicas: int, min_replicas: object = 2, **ann: str) -> dict[str, Any]:
    annotations = {"gpupool.io/min-replicas": str(min_replicas), **ann} if min_replicas is not None else ann
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "chat",
            "namespace": "serve",
            "uid": "u-chat",
            "labels": {"gpupool.io/queue": "serving"},
            "annotations": annotations,
        },
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {
                    "schedulerName": "gpupool",
                    "containers": [{"name": "s", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                }
            },
        },
    }


def test_min_replicas_splits_into_a_guaranteed_base_and_preemptible_extras() -> None:
    got = elastic_workloads(deployment(5, 2, **{EXTRA_PRIORITY_CLASS: "spot"}))
    assert got is not None and (got.min_replicas, got.replicas) == (2, 5)
    base = got.base.manifest
    assert base["metadata"]["name"] == "serve.deployment.chat"  # the name the backend maps to its pods
    assert base["spec"]["podGroups"][0]["replicas"] == 2 and "gang" not in base["spec"]
    assert base["spec"]["priorityClass"] == "inference-critical" and base["spec"]["type"] == "inference"
    names = [w.manifest["metadata"]["name"] for w in got.extras]
    assert names == [f"serve.deployment.chat-extra-{i}" for i in (2, 3, 4)]
    for i, w in enumerate(got.extras, 2):
        spec, ann = w.manifest["spec"], w.manifest["metadata"]["annotations"]
        assert spec["podGroups"][0]["replicas"] == 1 and spec["priorityClass"] == "spot"
        assert (ann[ELASTIC_OF], ann[ELASTIC_INDEX]) == ("serve.deployment.chat", str(i))
        assert base_of(w.manifest["metadata"]["name"]) == ("serve.deployment.chat", i)
    assert base_of("serve.deployment.chat") is None


def test_below_the_minimum_the_base_is_what_exists_and_there_are_no_extras() -> None:
    got = elastic_workloads(deployment(1, 3))
    assert got is not None and got.extras == ()
    assert got.base.manifest["spec"]["podGroups"][0]["replicas"] == 1
    assert elastic_workloads(deployment(3, None)) is None  # not elastic: the ordinary translation
    assert elastic_workloads(deployment(0, 2)) is None  # scaled to zero: nothing to run


@pytest.mark.parametrize("bad", ["0", "two", "-1"])
def test_a_bad_min_replicas_names_the_field(bad: str) -> None:
    with pytest.raises(KubeWorkloadError) as info:
        elastic_workloads(deployment(3, bad))
    assert info.value.field == "metadata.annotations.gpupool.io/min-replicas"


# -- the source ----------------------------------------------------------------------------------
def _source(elastic: bool = True) -> tuple[KubeSource, Inf, Subm]:
    deps, sub = Inf(), Subm()
    src = KubeSource({"deployments": deps}, sub, Events(), SourcePolicy(elastic=elastic))
    src.attach()
    return src, deps, sub


def _submitted(sub: Subm) -> list[str]:
    return [m["metadata"]["name"] for m in sub.manifests]


def test_scaling_up_submits_extras_and_scaling_down_cancels_them_at_once() -> None:
    src, deps, sub = _source()
    deps.put(deployment(2, 2))
    src.process()
    assert _submitted(sub) == ["serve.deployment.chat"]
    deps.put(deployment(4, 2), "MODIFIED")  # kubectl scale --replicas=4
    src.process()
    assert _submitted(sub)[1:] == [
        "serve.deployment.chat",  # the base again: unchanged
        "serve.deployment.chat-extra-2",
        "serve.deployment.chat-extra-3",
    ]
    deps.put(deployment(4, 2), "MODIFIED")  # a status update: nothing new
    src.process()
    assert len(sub.manifests) == 4 and sub.cancelled == []
    deps.put(deployment(3, 2), "MODIFIED")  # scaled down by one: that extra is cancelled
    src.process()
    assert sub.cancelled == ["serve.deployment.chat-extra-3"]
    deps.delete(deployment(3, 2))  # deleted: the base and the last extra go
    src.process()
    assert sorted(sub.cancelled[1:]) == ["serve.deployment.chat", "serve.deployment.chat-extra-2"]


def test_without_the_elastic_policy_min_replicas_stays_a_gang_minimum() -> None:
    src, deps, sub = _source(elastic=False)
    deps.put(deployment(4, 2))
    src.process()
    [m] = sub.manifests
    assert m["spec"]["podGroups"][0]["replicas"] == 4 and m["spec"]["gang"] == {"minMember": 2}


def test_an_unreadable_elastic_object_gets_one_warning_and_blocks_nothing() -> None:
    src, deps, sub = _source()
    bad = deployment(3, "many")
    bad["metadata"]["name"] = "broken"
    deps.put(bad)
    deps.put(deployment(3, 2))
    src.process()
    assert _submitted(sub) == ["serve.deployment.chat", "serve.deployment.chat-extra-2"]
    assert src.stats["invalid"] == 1


def test_an_extra_whose_name_would_be_too_long_is_refused_naming_the_field() -> None:
    d = deployment(3, 1)
    d["metadata"]["name"] = "x" * 230  # the base's name fits; '<base>-extra-1' does not
    with pytest.raises(KubeWorkloadError) as info:
        elastic_workloads(d)
    assert info.value.field == "metadata.name", info.value
