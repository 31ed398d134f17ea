"""Elastic inference (推理弹性): min-replicas guaranteed, extras borrow and are the first victims.

Two halves: the translation and the source (a Deployment marked ``gpupool.io/min-replicas``
becomes a non-preemptible base workload and one preemptible workload per extra replica; a
replica-count change submits or cancels extras), and the simulator replay of
``examples/sim/elastic-inference.yaml`` in a small version (30 hours): the afternoon peak borrows
training's idle guarantee and training takes it back the moment it needs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from gpupool.kube.adapters.elastic import (
    ELASTIC_INDEX,
    ELASTIC_OF,
    EXTRA_PRIORITY_CLASS,
    base_of,
    elastic_workloads,
    replica_pods,
)
from gpupool.kube.adapters.source import KubeSource, SourcePolicy
from gpupool.kube.workloads import KubeWorkloadError
from gpupool.sim.results import RunResult
from gpupool.sim.runner import run_scenario
from gpupool.sim.scenario import load_scenario
from tests.kube.conftest import KubeTarget
from tests.kube.test_kubectl_e2e import bound, kubectl, pods, violations, wait
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
    assert base["spec"]["preemptible"] is False
    names = [w.manifest["metadata"]["name"] for w in got.extras]
    assert names == [f"serve.deployment.chat-extra-{i}" for i in (2, 3, 4)]
    for i, w in enumerate(got.extras, 2):
        spec, ann = w.manifest["spec"], w.manifest["metadata"]["annotations"]
        assert spec["podGroups"][0]["replicas"] == 1 and spec["priorityClass"] == "spot"
        assert spec["preemptible"] is True  # not the inference type's default (non-preemptible)
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


# -- end to end: kubectl, the cluster and ``gpupool serve --backend kubernetes`` -------------------
# On the fake and on the real API server (``kube_api``: the node's kubelet is the fake's or the
# node agent's; the objects and the leader Lease in the test's namespace, issue 24). One 8-GPU node; queue org (8 GPUs) over serving (guarantee 2) and training (guarantee 6,
# reclaims). The service: min-replicas 2 of a one-GPU Deployment, so its base is serving's whole
# guarantee and every extra borrows training's idle GPUs.
E2E_QUEUES = """
apiVersion: gpupool.io/v1alpha1
kind: ResourcePool
metadata: {name: gpu}
spec: {}
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: org}
spec:
  quotas: [{pool: gpu, guarantee: {nvidia.com/gpu: 8}}]
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: serving}
spec:
  parent: org
  quotas: [{pool: gpu, guarantee: {nvidia.com/gpu: 2}}]
---
apiVersion: gpupool.io/v1alpha1
kind: Queue
metadata: {name: training}
spec:
  parent: org
  preemption: {reclaimWithinCohort: Any}
  quotas: [{pool: gpu, guarantee: {nvidia.com/gpu: 6}}]
"""
CHAT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: chat
  namespace: %(ns)s
  labels: {gpupool.io/queue: serving}
  annotations: {gpupool.io/min-replicas: "2"}
spec:
  replicas: %(replicas)d
  selector: {matchLabels: {app: chat}}
  template:
    metadata:
      labels: {app: chat}
      annotations: {fake.gpupool.io/run-seconds: "100000"}
    spec:
      schedulerName: gpupool
      containers:
        - {name: server, image: vllm, resources: {limits: {nvidia.com/gpu: 1}}}
"""


def chat(ns: str, replicas: int) -> str:
    return CHAT % {"ns": ns, "replicas": replicas}


def base_name(ns: str) -> str:
    """The base workload's name: ``<ns>.deployment.chat``."""
    return f"{ns}.deployment.chat"


def training_job(name: str, gpus: int, ns: str) -> str:
    return f"""
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  namespace: {ns}
  labels: {{kueue.x-k8s.io/queue-name: training}}
spec:
  suspend: true
  template:
    metadata: {{annotations: {{fake.gpupool.io/run-seconds: "100000"}}}}
    spec:
      schedulerName: gpupool
      restartPolicy: Never
      containers:
        - {{name: main, image: trainer, resources: {{limits: {{nvidia.com/gpu: {gpus}}}}}}}
"""


@contextlib.contextmanager
def elastic_service(srv: KubeTarget, state: Path, config: Path) -> Iterator[Any]:
    """``gpupool serve --backend kubernetes`` in-process with the elastic split on (the leader
    Lease in the target's namespace)."""
    from gpupool.kube.wiring import kube_app, kube_options
    from gpupool.service.config import ServiceConfig

    cfg = ServiceConfig(
        state_dir=state, config_dir=config, backend="kubernetes", tick_s=0.05, min_interval_s=0.0
    )
    opts = kube_options(Path(srv.kubeconfig), None, [], False, srv.namespace, elastic=True)
    assert opts.policy.elastic
    app = kube_app(cfg, opts)
    with TestClient(app, raise_server_exceptions=False):
        yield app


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "config"
    config.mkdir()
    (config / "queues.yaml").write_text(E2E_QUEUES, encoding="utf-8")
    return config


def _chat_pods(srv: KubeTarget) -> dict[str, dict[str, Any]]:
    """The Deployment's live pods by name (not being deleted)."""
    got = pods(srv, "app=chat", srv.namespace)
    return {p["metadata"]["name"]: p for p in got if not p["metadata"].get("deletionTimestamp")}


def _holders(srv: KubeTarget) -> dict[str, str] | None:
    """Bound live pod -> the workload it was bound for (None while a live pod is unbound)."""
    live = _chat_pods(srv)
    if any(not p["spec"].get("nodeName") for p in live.values()):
        return None
    return {n: p["metadata"]["annotations"]["gpupool.io/workload"] for n, p in live.items()}


def _no_device_twice(srv: KubeTarget) -> None:
    seen: dict[tuple[str, str], str] = {}
    for p in pods(srv, ns=srv.namespace):
        ann = p["metadata"].get("annotations") or {}
        if not p["spec"].get("nodeName") or p["metadata"].get("deletionTimestamp"):
            continue
        for i in str(ann.get("gpupool.io/gpu-indices", "")).split(","):
            key = (p["spec"]["nodeName"], i)
            assert key not in seen, f"device {key} bound to {seen[key]} and {p['metadata']['name']}"
            seen[key] = p["metadata"]["name"]


def scale(srv: KubeTarget, replicas: int) -> None:
    """``kubectl scale`` in effect (a merge patch of spec.replicas: the fake server's ``/scale``
    subresource does not answer with an ``autoscaling/v1`` Scale, which kubectl scale needs)."""
    patch = f'{{"spec":{{"replicas":{replicas}}}}}'
    kubectl(srv, "patch", "deployment", "chat", "-n", srv.namespace, "--type", "merge", "-p", patch)


def _phase(app: Any, name: str) -> str:
    return str(app.state.svc.store.get_workload(name).phase)


def _scaled_to(srv: KubeTarget, replicas: int, extras: int) -> Callable[[], dict[str, str] | None]:
    """Waits for ``replicas`` bound pods, ``replicas - extras`` of them the base's."""
    base = base_name(srv.namespace)

    def check() -> dict[str, str] | None:
        got = _holders(srv)
        if got is None or len(got) != replicas:
            return None
        return got if sum(1 for w in got.values() if w == base) == replicas - extras else None

    return check


def test_elastic_deployment_end_to_end(kube_api: KubeTarget, tmp_path: Path) -> None:
    srv, ns = kube_api, kube_api.namespace
    chat_wl = base_name(ns)
    srv.add_kubelet_nodes(1, gpus=8)
    with elastic_service(srv, tmp_path / "state", _config(tmp_path)) as app:
        disrupted: dict[str, str] = {}  # pod -> its workload, for pods marked DisruptionTarget

        def on_pod(_typ: str, p: dict[str, Any]) -> None:
            conds = (p.get("status") or {}).get("conditions") or ()
            if any(c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in conds):
                disrupted[p["metadata"]["name"]] = p["metadata"]["annotations"].get("gpupool.io/workload", "")

        app.state.kube.informers.pods.add_listener(on_pod)
        # 1. min-replicas 2, replicas 2: the base alone, bound
        kubectl(srv, "apply", "-f", "-", stdin=chat(ns, 2))
        base = wait(_scaled_to(srv, 2, 0), 120, "the base's 2 replicas bound")
        assert _phase(app, chat_wl) == "Running"
        # 2. scaled to 5: three extras, each its own workload, bound on the idle (borrowed) GPUs
        scale(srv, 5)
        five = wait(_scaled_to(srv, 5, 3), 120, "the 3 extras bound")
        extras = {f"{chat_wl}-extra-{i}" for i in (2, 3, 4)}
        assert sorted(w for w in five.values() if w != chat_wl) == sorted(extras)
        assert {n: w for n, w in five.items() if w == chat_wl} == base  # the base's pods untouched
        for name in extras:
            rec = app.state.svc.store.get_workload(name)
            assert rec.phase == "Running" and rec.placement["borrowing"] is True, (name, rec.placement)
        _no_device_twice(srv)
        # 3. training reclaims its guarantee: 4 GPUs, 3 free, so one extra is evicted; not the base
        kubectl(srv, "apply", "-f", "-", stdin=training_job("train", 4, ns))
        wait(lambda: bound(srv, "job-name=train", 1, ns=ns), 120, "the training Job bound")
        assert set(disrupted.values()) <= extras and len(disrupted) == 1, disrupted
        [victim] = disrupted.values()
        assert _phase(app, victim) in ("Pending", "Preempted")
        still = _holders(srv) or {
            n: p["metadata"]["annotations"].get("gpupool.io/workload", "")
            for n, p in _chat_pods(srv).items()
            if p["spec"].get("nodeName")
        }
        assert {n: w for n, w in still.items() if w == chat_wl} == base  # base never disrupted
        assert _phase(app, chat_wl) == "Running"
        _no_device_twice(srv)
        # 4. scaled back to 2: every extra cancelled, its GPUs free at once for training
        scale(srv, 2)
        wait(lambda: all(_phase(app, n) == "Cancelled" for n in extras), 60, "the extras cancelled")
        kubectl(srv, "apply", "-f", "-", stdin=training_job("more", 2, ns))
        wait(lambda: bound(srv, "job-name=more", 1, ns=ns), 120, "the freed GPUs given to training")
        wait(_scaled_to(srv, 2, 0), 120, "the base's 2 replicas, bound")  # a replica replaced is rebound
        assert _phase(app, chat_wl) == "Running" and len(disrupted) >= 1
        assert set(disrupted.values()) <= extras  # no pod of the base was ever disrupted
        # 5. a base replica deleted under it: the ReplicaSet's replacement is bound into its slot
        gone = sorted(_holders(srv) or {})[0]
        kubectl(srv, "delete", "pod", gone, "-n", ns, "--wait=false")
        again = wait(lambda: (h := _scaled_to(srv, 2, 0)()) and gone not in h and h, 120, "a replacement")
        assert set(again.values()) == {chat_wl}
        _no_device_twice(srv)
        assert violations(srv) == []


def test_a_restart_with_extras_bound_binds_nothing_twice(kube_api: KubeTarget, tmp_path: Path) -> None:
    srv, ns = kube_api, kube_api.namespace
    chat_wl = base_name(ns)
    srv.add_kubelet_nodes(1, gpus=8)
    config, state = _config(tmp_path), tmp_path / "state"
    with elastic_service(srv, state, config):
        kubectl(srv, "apply", "-f", "-", stdin=chat(ns, 4))
        before = wait(_scaled_to(srv, 4, 2), 120, "the base and 2 extras bound")
    binds = srv.fake.stats.binds if srv.fake is not None else 0
    with elastic_service(srv, state, config) as app:
        rt = app.state.kube
        want = {chat_wl, f"{chat_wl}-extra-2", f"{chat_wl}-extra-3"}
        wait(lambda: want <= set(rt.backend.runs()), 60, "the base and the extras adopted")
        wait(lambda: rt.source.stats["unchanged"] >= 3, 60, "the source read the Deployment again")
        ctl = app.state.svc.controller
        done = ctl.cycles + 20  # about a second of controller cycles (and bind passes) after it
        wait(lambda: ctl.cycles >= done, 60, "20 more controller cycles")
        assert {n: _phase(app, n) for n in want} == dict.fromkeys(want, "Running")
        assert _holders(srv) == before  # the same pods, bound to the same workloads
        assert rt.backend.binder.stats["bound"] == 0  # nothing bound twice (the new binder's count)
        if srv.fake is not None:
            assert srv.fake.stats.binds == binds  # and none by any (the fake's own count)
        _no_device_twice(srv)
        assert violations(srv) == []


# -- which pods a run of an elastic owner may count as its own --------------------------------------
def _pod(name: str, workload: str = "", ordinal: int | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "serve", "annotations": {}, "labels": {}}
    if workload:
        md["annotations"]["gpupool.io/workload"] = workload
    if ordinal is not None:
        md["labels"]["apps.kubernetes.io/pod-index"] = str(ordinal)
    return {"metadata": md, "spec": {"nodeName": "n1"} if workload else {}}


def _names(got: list[dict[str, Any]]) -> list[str]:
    return [p["metadata"]["name"] for p in got]


def test_a_run_counts_its_own_pods_and_free_ones_never_another_runs() -> None:
    base, extra = "serve.deployment.chat", "serve.deployment.chat-extra-2"
    pods = [_pod("a", base), _pod("b", extra), _pod("c"), _pod("d")]
    claims = {("serve", "c"): extra}  # extra-2's bind of c is in flight
    assert _names(replica_pods(pods, base, "Deployment", 2, claims)) == ["a", "d"]
    assert _names(replica_pods(pods, extra, "Deployment", 1, claims)) == ["b", "c", "d"]


def test_statefulset_ordinals_stay_with_their_replicas() -> None:
    base = "serve.statefulset.web"
    pods = [_pod(f"web-{i}", ordinal=i) for i in range(5)]
    assert _names(replica_pods(pods, base, "StatefulSet", 2, {})) == ["web-0", "web-1"]
    assert _names(replica_pods(pods, f"{base}-extra-3", "StatefulSet", 1, {})) == ["web-3"]


# -- the switch ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("env", "want"), [("", False), ("true", True), ("Off", False), ("1", True)])
def test_the_elastic_switch_reads_its_setting(monkeypatch: pytest.MonkeyPatch, env: str, want: bool) -> None:
    from gpupool.kube.wiring import ELASTIC_ENV, kube_options

    monkeypatch.setenv(ELASTIC_ENV, env)
    assert kube_options(None, None, [], False, "default").policy.elastic is want
    assert kube_options(None, None, [], False, "default", elastic=not want).policy.elastic is (not want)


def test_a_bad_elastic_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.kube.wiring import ELASTIC_ENV, kube_options

    monkeypatch.setenv(ELASTIC_ENV, "sometimes")
    with pytest.raises(ValueError, match=f"{ELASTIC_ENV}: expected true or false, got 'sometimes'"):
        kube_options(None, None, [], False, "default")
