"""Task types that mean something (issue 11): a workload's ``type`` sets defaults (priority
class, preemptibility, retries, preferred pools, wait limit) that its queue or the workload
itself can override, resolved workload > queue ``typeDefaults`` > Cluster ``taskTypes`` >
packaged defaults, each value with where it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.cli.client.workloads import type_lines
from gpupool.engine import Engine, decide
from gpupool.manifests import Bundle, ManifestError, build, default_priority_classes, parse_documents
from gpupool.manifests.convert import workload_model
from gpupool.manifests.documents import load_files
from gpupool.manifests.task_types import FIELDS, packaged_task_types
from gpupool.model import Snapshot, WorkloadType
from gpupool.service import task_types
from gpupool.service.config import EXAMPLES
from gpupool.service.failures.policy import FaultState, policy_for
from tests.test_service_support import in_process_controller, submit_to

CLUSTER = """
apiVersion: gpupool.io/v1alpha1
kind: Cluster
metadata: {name: c}
spec:
  TASKTYPES
  nodeGroups:
    - {name: t, count: 1, gpu: {model: H100, count: 8, memory: 80Gi}, cpu: 64, memory: 512Gi, labels: {env: train}}
    - {name: s, count: 1, gpu: {model: A100, count: 8, memory: 40Gi}, cpu: 64, memory: 512Gi, labels: {env: serve}}
    - {name: x, count: 1, gpu: {model: L40S, count: 4, memory: 48Gi}, cpu: 64, memory: 512Gi, labels: {env: exp}}
---
{apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: training}, spec: {nodeSelector: {env: train}}}
---
{apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: inference}, spec: {nodeSelector: {env: serve}, preemptible: false}}
---
{apiVersion: gpupool.io/v1alpha1, kind: ResourcePool, metadata: {name: experiment}, spec: {nodeSelector: {env: exp}}}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: org}
spec:
  quotas:
    - {pool: training, guarantee: {nvidia.com/gpu: 8}}
    - {pool: inference, guarantee: {nvidia.com/gpu: 8}}
    - {pool: experiment, guarantee: {nvidia.com/gpu: 4}}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: team}
spec:
  parent: org
  TYPEDEFAULTS
  quotas:
    - {pool: training, guarantee: {nvidia.com/gpu: 8}}
    - {pool: inference, guarantee: {nvidia.com/gpu: 8}}
    - {pool: experiment, guarantee: {nvidia.com/gpu: 4}}
"""


def _workload(name: str, spec: str) -> str:
    return (
        f"---\n{{apiVersion: gpupool.io/v1alpha1, kind: Workload, metadata: {{name: {name}}}, "
        f"spec: {{queue: team, podGroups: [{{resources: {{nvidia.com/gpu: 1}}}}], {spec}}}}}\n"
    )


def _bundle(*workloads: str, cluster: str = "", queue: str = "") -> Bundle:
    text = CLUSTER.replace("TASKTYPES", cluster).replace("TYPEDEFAULTS", queue) + "".join(workloads)
    return build(parse_documents(text, "t.yaml"), Bundle(priority_classes=list(default_priority_classes())))


def _resolved(b: Bundle, name: str) -> dict[str, Any]:
    doc = next(d for d in b.documents if d.name == name)
    got = task_types.explained(doc.raw, b)
    assert got is not None
    return got


def test_every_type_has_packaged_defaults_that_validate() -> None:
    packaged = packaged_task_types()
    assert set(packaged) == {t.value for t in WorkloadType}
    assert packaged["inference"].preferredPools == ["inference"]
    assert packaged["evaluation"].preemptible is True


def test_inference_defaults_to_its_class_and_pools_and_evaluation_to_preemptible_pools() -> None:
    b = _bundle(_workload("serve", "type: inference"), _workload("ev", "type: evaluation"))
    w = {x.name: x for x in b.workloads}
    assert (w["serve"].priority_class, w["serve"].priority, w["serve"].preemptible) == (
        "inference-critical",
        1000,
        False,
    )
    assert w["serve"].preferred_pools == ("inference",) and w["serve"].max_wait_s == 300.0
    assert (w["ev"].priority_class, w["ev"].preemptible) == ("evaluation", True)
    assert w["ev"].preferred_pools == ("experiment", "training")
    snap = Snapshot(tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(b.priority_classes))
    eng = Engine(snap)
    # the queue lists training, inference, experiment: each type's pools go first
    assert eng.candidate_pools(w["serve"]) == ["inference", "training", "experiment"]
    assert eng.candidate_pools(w["ev"]) == ["experiment", "training", "inference"]
    d = decide(
        Snapshot(snap.nodes, snap.pools, snap.queues, snap.priority_classes, pending=tuple(w.values()))
    )
    assert {a.workload: a.pool for a in d.admitted} == {"serve": "inference", "ev": "experiment"}


def test_packaged_preferences_find_the_shipped_example_pools_by_environment() -> None:
    """The packaged ``preferredPools`` ([inference], [experiment, training]) matched no pool of
    the shipped example (h100-training, a100-inference, l40s-experiment), so they did nothing
    there; a preference names a pool by its name or its ``environment``."""
    docs = load_files([EXAMPLES / "cluster"])
    b = build(docs, Bundle(priority_classes=list(default_priority_classes())))
    snap = Snapshot(tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(b.priority_classes))
    ev = workload_model(
        {
            "apiVersion": "gpupool.io/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": "ev"},
            "spec": {
                "queue": "llm-research",
                "type": "evaluation",
                "podGroups": [{"resources": {"nvidia.com/gpu": 1}}],
            },
        },
        b.priority_classes,
        0.0,
        types=b.task_types,
    )
    # llm-research lists h100-training then l40s-experiment; evaluation prefers experiment first
    assert Engine(snap).candidate_pools(ev) == ["l40s-experiment", "h100-training"]


def test_workload_beats_queue_beats_cluster_beats_packaged() -> None:
    b = _bundle(
        _workload("plain", "type: inference"),
        _workload("own", "type: inference, maxWait: 30s, preferredPools: [training], maxRetries: 9"),
        _workload("other", "type: training"),
        cluster="taskTypes: {inference: {maxWait: 20m, maxRetries: 7}, training: {maxWait: 1h}}",
        queue="typeDefaults: {inference: {maxWait: 1m, priorityClass: training}}",
    )
    plain = _resolved(b, "plain")
    assert plain["maxWait"] == {"value": 60.0, "from": "queue team"}
    assert plain["priorityClass"] == {"value": "training", "from": "queue team"}
    assert plain["maxRetries"] == {"value": 7, "from": "cluster"}
    assert plain["preferredPools"] == {"value": ["inference"], "from": "packaged"}
    own = _resolved(b, "own")
    assert own["maxWait"] == {"value": 30.0, "from": "workload"}
    assert own["preferredPools"] == {"value": ["training"], "from": "workload"}
    assert own["maxRetries"] == {"value": 9, "from": "workload"}
    assert _resolved(b, "other")["maxWait"] == {"value": 3600.0, "from": "cluster"}
    w = {x.name: x for x in b.workloads}
    assert (w["plain"].priority, w["plain"].max_wait_s) == (500, 60.0)
    assert set(plain) == set(FIELDS)


def test_a_non_preemptible_class_stays_so_and_a_workload_may_opt_out() -> None:
    b = _bundle(
        _workload("a", "type: evaluation, priorityClass: inference-critical"),
        _workload("b", "type: training, preemptible: false"),
    )
    w = {x.name: x for x in b.workloads}
    assert not w["a"].preemptible  # the class says never preempted: the type cannot undo it
    assert not w["b"].preemptible and w["b"].priority == 500


def test_the_retry_limit_follows_the_type_resolution() -> None:
    b = _bundle(_workload("r", "type: training"), queue="typeDefaults: {training: {maxRetries: 6}}")
    doc = next(d for d in b.documents if d.name == "r")
    assert task_types.max_retries(doc.raw, b) == 6
    assert policy_for(doc.raw, FaultState(), task_types.max_retries(doc.raw, b)).max_retries == 6
    assert policy_for(doc.raw, FaultState()).max_retries == 3  # the type's own default


@pytest.mark.parametrize(
    ("cluster", "queue", "wl", "field"),
    [
        ("taskTypes: {serving: {maxWait: 1m}}", "", "", "spec.taskTypes.serving"),
        ("taskTypes: {inference: {maxWait: soon}}", "", "", "spec.taskTypes.inference.maxWait"),
        ("taskTypes: {inference: {maxWait: 0}}", "", "", "spec.taskTypes.inference.maxWait"),
        (
            "",
            "typeDefaults: {training: {priorityClass: gold}}",
            "",
            "spec.typeDefaults.training.priorityClass",
        ),
        (
            "",
            "typeDefaults: {training: {preferredPools: [nope]}}",
            "",
            "spec.typeDefaults.training.preferredPools[0]",
        ),
        ("", "typeDefaults: {training: {maxRetries: -1}}", "", "spec.typeDefaults.training.maxRetries"),
        ("", "", "maxWait: later", "spec.maxWait"),
    ],
)
def test_bad_task_type_settings_are_located_errors(cluster: str, queue: str, wl: str, field: str) -> None:
    with pytest.raises(ManifestError) as exc:
        _bundle(_workload("w", "type: training" + (", " + wl if wl else "")), cluster=cluster, queue=queue)
    assert field in str(exc.value), str(exc.value)


def test_explain_lines_show_values_with_their_source_and_partial_counts() -> None:
    ex = {
        "admittedPods": 2,
        "requestedPods": 3,
        "typeDefaults": {
            "maxWait": {"value": 300.0, "from": "packaged"},
            "preferredPools": {"value": ["inference"], "from": "queue team"},
            "maxRetries": {"value": None, "from": "none"},
        },
    }
    assert type_lines(ex) == [
        "  admitted with 2 of 3 pods (gang minimum)",
        "  maxWait: 300.0 (from packaged)",
        "  preferredPools: inference (from queue team)",
    ]
    manifest = {"spec": {"podGroups": [{"replicas": 3}]}}
    assert task_types.pod_counts(manifest, {"pods": [{}, {}]}) == {"admittedPods": 2, "requestedPods": 3}
    assert task_types.pod_counts(manifest, None) == {}


def test_explain_shows_type_defaults_and_a_partial_gang_s_count(tmp_path: Path) -> None:
    """Through the controller: a gang of 10 x 8 GPUs with minMember 2 runs with the 6 pods its
    quota holds (48 GPUs: the 64 of the pool less the 16 vision-team does not lend), and
    explain says so, with what its type set and from where."""
    store, ctl, _ = in_process_controller(f"sqlite:///{tmp_path}/t.db", tmp_path)
    try:
        ctl.recover()
        groups = [{"replicas": 10, "resources": {"nvidia.com/gpu": 8, "cpu": 2, "memory": "8Gi"}}]
        spec = {"type": "evaluation", "gang": {"minMember": 2}, "podGroups": groups}
        submit_to(store, ctl, "g", queue="llm-research", duration="10h", **spec)
        ctl.cycle()
        rec = store.get_workload("g")
        assert rec.phase in ("Admitted", "Running"), rec.reason
        ex = ctl.explain(rec)
        assert (ex["admittedPods"], ex["requestedPods"]) == (6, 10)
        assert rec.placement is not None and len(rec.placement["pods"]) == 6  # the stored record
        said = [f"{e.reason} {e.message}" for e in store.list_events("g")]  # `gpupool describe`
        assert any("with 6 of 10 pods" in t for t in said), said
        assert ex["typeDefaults"]["maxWait"] == {"value": 8 * 3600.0, "from": "packaged"}
        assert ex["typeDefaults"]["priorityClass"] == {"value": "experiment", "from": "workload"}
    finally:
        store.close()
