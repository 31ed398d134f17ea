"""The controllers: Job (suspend, parallelism, completions, Indexed, backoffLimit), Deployment ->
ReplicaSet -> pods, StatefulSet names (on the fake and on the real API server, ``kube_api``: the
fake's simulated controllers and the real kube-controller-manager); PyTorchJob and JobSet, and
the fake's own bookkeeping (fake only: see each test)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpupool.kube.fake import FakeApiServer
from tests.kube.conftest import KubeTarget

RUN = "fake.gpupool.io/run-seconds"
INDEX = "batch.kubernetes.io/job-completion-index"


def job(
    name: str,
    parallelism: int = 2,
    completions: int | None = 2,
    suspend: bool = False,
    indexed: bool = False,
    annotations: dict[str, str] | None = None,
    backoff: int = 6,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "suspend": suspend,
        "backoffLimit": backoff,
        "template": {
            "metadata": {"annotations": annotations or {}},
            "spec": {
                "schedulerName": "gpupool",
                "restartPolicy": "Never",
                "containers": [{"name": "c", "image": "x"}],
            },
        },
    }
    if completions is not None:
        spec["completions"] = completions
    if indexed:
        spec["completionMode"] = "Indexed"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def job_pods(srv: FakeApiServer, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in srv.list("pods", "default", f"batch.kubernetes.io/job-name={name}")
        if not p["metadata"].get("deletionTimestamp")
    ]


def condition(obj: dict[str, Any], ctype: str) -> str:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == ctype), "")


T = TypeVar("T")
JOBS = {"group": "batch"}
APPS = {"group": "apps"}


def until(what: str, probe: Callable[[], T | None], timeout: float = 90.0) -> T:
    """Poll ``probe`` until it is truthy: the real controllers back off (a failed pod is
    retried after 10 s), and the machine is a loaded 2-core one."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.1)


def create(k: KubeTarget, res: str, obj: dict[str, Any], **where: str) -> None:
    obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "namespace"}}
    r = k.http.post(k.path(res, **where), json=obj)
    assert r.status_code == 201, r.text


def get(k: KubeTarget, res: str, name: str, **where: str) -> dict[str, Any]:
    return dict(k.http.get(k.path(res, name, **where)).json())


def merge(k: KubeTarget, res: str, name: str, body: dict[str, Any], **where: str) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    r = k.http.patch(k.path(res, name, **where), json=body, headers=headers)
    assert r.status_code == 200, r.text


def listed(k: KubeTarget, res: str, selector: str = "", **where: str) -> list[dict[str, Any]]:
    params = {"labelSelector": selector} if selector else {}
    return list(k.http.get(k.path(res, **where), params=params).json()["items"])


def live_pods(k: KubeTarget, selector: str) -> list[dict[str, Any]]:
    return [p for p in listed(k, "pods", selector) if not p["metadata"].get("deletionTimestamp")]


def bind_all(k: KubeTarget, pods: list[dict[str, Any]], node: str) -> None:
    """Act as the scheduler (neither server runs one here)."""
    for p in pods:
        if not p["spec"].get("nodeName"):
            name = p["metadata"]["name"]
            body = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
            k.http.post(k.path("pods", f"{name}/binding"), json=body)


def test_suspended_job_has_no_pods_until_resumed(kube_api: KubeTarget) -> None:
    k, sel = kube_api, "batch.kubernetes.io/job-name=j"
    create(k, "jobs", job("j", suspend=True), **JOBS)
    until("Suspended", lambda: condition(get(k, "jobs", "j", **JOBS), "Suspended") == "True")
    assert live_pods(k, sel) == []
    merge(k, "jobs", "j", {"spec": {"suspend": False}}, **JOBS)
    pods = until("2 pods", lambda: len(live_pods(k, sel)) == 2 and live_pods(k, sel))
    uid = get(k, "jobs", "j", **JOBS)["metadata"]["uid"]
    for p in pods:
        assert p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
        assert p["metadata"]["labels"]["controller-uid"] == uid
        owner = p["metadata"]["ownerReferences"][0]
        assert owner["uid"] == uid and owner["controller"]
        assert p["spec"]["schedulerName"] == "gpupool"
    until("resumed", lambda: condition(get(k, "jobs", "j", **JOBS), "Suspended") == "False")
    merge(k, "jobs", "j", {"spec": {"suspend": True}}, **JOBS)
    until("re-suspension deleting the active pods", lambda: live_pods(k, sel) == [])
    until("active 0", lambda: get(k, "jobs", "j", **JOBS)["status"].get("active", 0) == 0)


def test_indexed_job_labels_pods_with_their_completion_index(kube_api: KubeTarget) -> None:
    k, sel = kube_api, "batch.kubernetes.io/job-name=ix"
    create(k, "jobs", job("ix", parallelism=3, completions=3, indexed=True), **JOBS)
    pods = until("3 pods", lambda: len(live_pods(k, sel)) == 3 and live_pods(k, sel))
    idx = sorted(p["metadata"]["labels"][INDEX] for p in pods)
    assert idx == ["0", "1", "2"]
    assert all(p["metadata"]["annotations"][INDEX] == p["metadata"]["labels"][INDEX] for p in pods)
    for p in pods:
        assert p["metadata"]["name"].startswith(f"ix-{p['metadata']['labels'][INDEX]}-")


def drive(k: KubeTarget, name: str, ctype: str, node: str) -> dict[str, Any]:
    """Act as the scheduler: bind every unbound pod of the Job until it has condition ``ctype``."""

    def step() -> dict[str, Any] | None:
        bind_all(k, live_pods(k, f"batch.kubernetes.io/job-name={name}"), node)
        j = get(k, "jobs", name, **JOBS)
        return j if condition(j, ctype) == "True" else None

    return until(f"Job {name} {ctype}", step, 120)


def test_job_completes_after_its_pods_succeed(kube_api: KubeTarget) -> None:
    k = kube_api
    node = k.add_kubelet_nodes(1, gpus=0, hami=False)[0]
    create(k, "jobs", job("done", parallelism=2, completions=3, annotations={RUN: "1"}), **JOBS)
    until("2 pods", lambda: len(live_pods(k, "batch.kubernetes.io/job-name=done")) == 2)
    j = drive(k, "done", "Complete", node)
    assert (
        j["status"]["succeeded"] == 3 and j["status"].get("active", 0) == 0 and j["status"]["completionTime"]
    )
    pods = listed(k, "pods", "batch.kubernetes.io/job-name=done")
    assert len([p for p in pods if p["status"]["phase"] == "Succeeded"]) == 3


def test_job_fails_after_backoff_limit(kube_api: KubeTarget) -> None:
    k = kube_api
    node = k.add_kubelet_nodes(1, gpus=0, hami=False)[0]
    failing = {RUN: "0", "fake.gpupool.io/exit-code": "3"}
    create(k, "jobs", job("bad", parallelism=1, completions=1, backoff=1, annotations=failing), **JOBS)
    j = drive(k, "bad", "Failed", node)
    assert j["status"]["failed"] == 2
    failed = [
        p for p in listed(k, "pods", "batch.kubernetes.io/job-name=bad") if p["status"]["phase"] == "Failed"
    ]
    assert failed[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_a_deleted_running_pod_counts_as_a_failure_unless_ignored(kube_api: KubeTarget) -> None:
    """A running pod of a Job deleted (not by a suspension) counts against ``backoffLimit``: with
    0 the Job fails and makes no replacement; a ``podFailurePolicy`` ignoring the pod's
    DisruptionTarget gets it replaced, uncounted; a suspension's deletions count for nothing.
    The fake replaced every deleted pod uncounted, which hid a backend failing Jobs on a real
    cluster by deleting their pods (issue 24)."""
    k = kube_api
    node = k.add_kubelet_nodes(1, gpus=0, hami=False)[0]
    long = {RUN: "100000"}
    ignore = {
        "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    }
    kept = job("kept", parallelism=1, completions=1, backoff=0, annotations=long)
    kept["spec"]["podFailurePolicy"] = ignore
    for obj in (job("lost", parallelism=1, completions=1, backoff=0, annotations=long), kept):
        create(k, "jobs", obj, **JOBS)
    for j in ("lost", "kept", "paused"):
        if j == "paused":
            create(k, "jobs", job(j, parallelism=1, completions=1, backoff=0, annotations=long), **JOBS)
        sel = f"batch.kubernetes.io/job-name={j}"
        until(f"{j}'s pod", lambda sel=sel: live_pods(k, sel))
        bind_all(k, live_pods(k, sel), node)
        until(
            f"{j} running",
            lambda sel=sel: [p for p in live_pods(k, sel) if p["status"].get("phase") == "Running"],
        )
    first = live_pods(k, "batch.kubernetes.io/job-name=kept")[0]["metadata"]
    mark = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "PreemptionByScheduler",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    r = k.http.patch(
        k.path("pods", f"{first['name']}/status"),
        json={"status": {"conditions": [mark]}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert r.status_code == 200, r.text
    for j in ("lost", "kept"):
        (pod,) = live_pods(k, f"batch.kubernetes.io/job-name={j}")
        assert k.http.delete(k.path("pods", pod["metadata"]["name"])).status_code == 200
    merge(k, "jobs", "paused", {"spec": {"suspend": True}}, **JOBS)

    def failed_job() -> dict[str, Any] | None:
        got = get(k, "jobs", "lost", **JOBS)
        return got if condition(got, "Failed") == "True" else None

    lost = until("lost Failed", failed_job)
    assert lost["status"]["failed"] == 1
    assert [c["reason"] for c in lost["status"]["conditions"] if c["type"] == "Failed"] == [
        "BackoffLimitExceeded"
    ]
    again = until(
        "kept's replacement",
        lambda: [
            p
            for p in live_pods(k, "batch.kubernetes.io/job-name=kept")
            if p["metadata"]["uid"] != first["uid"]
        ],
    )
    assert again and condition(get(k, "jobs", "kept", **JOBS), "Failed") != "True"
    until("paused's pod gone", lambda: not live_pods(k, "batch.kubernetes.io/job-name=paused"))
    until("paused Suspended", lambda: condition(get(k, "jobs", "paused", **JOBS), "Suspended") == "True")
    for j in ("kept", "paused"):
        got = get(k, "jobs", j, **JOBS)
        assert not got["status"].get("failed") and condition(got, "Failed") != "True", (j, got["status"])
    assert live_pods(k, "batch.kubernetes.io/job-name=lost") == []


def test_deployment_makes_one_replicaset_and_its_pods(kube_api: KubeTarget) -> None:
    k = kube_api
    tpl = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "v1"}]}}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": tpl},
    }
    create(k, "deployments", deployment, **APPS)
    until("3 pods", lambda: len(live_pods(k, "app=web")) == 3)
    rss = listed(k, "replicasets", **APPS)
    assert len(rss) == 1 and rss[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    h = rss[0]["metadata"]["labels"]["pod-template-hash"]
    assert all(p["metadata"]["labels"]["pod-template-hash"] == h for p in live_pods(k, "app=web"))
    merge(k, "deployments", "web", {"spec": {"replicas": 1}}, **APPS)
    until("scaled to 1", lambda: len(live_pods(k, "app=web")) == 1)


def test_statefulset_pods_have_ordinal_names(kube_api: KubeTarget) -> None:
    """The real controller makes each pod once the one before runs and is Ready: the pods are
    bound to a node with a kubelet as they come."""
    k = kube_api
    node = k.add_kubelet_nodes(1, gpus=0, hami=False)[0]
    tpl = {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": tpl,
        },
    }
    create(k, "statefulsets", sts, **APPS)

    def three() -> list[dict[str, Any]] | None:
        pods = live_pods(k, "app=db")
        bind_all(k, pods, node)
        return pods if len(pods) == 3 else None

    pods = sorted(until("3 pods", three, 120), key=lambda p: p["metadata"]["name"])
    assert [p["metadata"]["name"] for p in pods] == ["db-0", "db-1", "db-2"]
    assert pods[2]["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "2"


def pytorchjob(name: str, workers: int, suspend: bool = False) -> dict[str, Any]:
    rs = {
        "restartPolicy": "OnFailure",
        "template": {
            "spec": {
                "schedulerName": "gpupool",
                "containers": [
                    {"name": "pytorch", "image": "pt", "resources": {"limits": {"nvidia.com/gpu": 8}}}
                ],
            }
        },
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "runPolicy": {"suspend": suspend},
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, **rs}, "Worker": {"replicas": workers, **rs}},
        },
    }


def test_pytorchjob_pods_carry_replica_labels_and_honour_suspend(fake_server: FakeApiServer) -> None:
    """Fake only: its training operator (the real server runs none)."""
    srv = fake_server
    srv.create(pytorchjob("bert", 2, suspend=True))
    srv.wait_for(
        lambda: condition(srv.get("pytorchjobs.kubeflow.org", "default", "bert"), "Suspended") == "True",
        what="Suspended",
    )
    assert srv.list("pods") == []
    srv.patch("pytorchjobs.kubeflow.org", "default", "bert", {"spec": {"runPolicy": {"suspend": False}}})
    sel = "training.kubeflow.org/job-name=bert"
    pods = srv.wait_for(
        lambda: len(srv.list("pods", "default", sel)) == 3 and srv.list("pods", "default", sel), what="3 pods"
    )
    got = {
        (
            p["metadata"]["name"],
            p["metadata"]["labels"]["training.kubeflow.org/replica-type"],
            p["metadata"]["labels"]["training.kubeflow.org/replica-index"],
        )
        for p in pods
    }
    assert got == {
        ("bert-master-0", "master", "0"),
        ("bert-worker-0", "worker", "0"),
        ("bert-worker-1", "worker", "1"),
    }


def test_jobset_makes_child_jobs_and_passes_suspend_down(fake_server: FakeApiServer) -> None:
    """Fake only: its JobSet operator (the real server runs none)."""
    srv = fake_server
    tpl = {
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "template": {
                "spec": {
                    "schedulerName": "gpupool",
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "x"}],
                }
            },
        }
    }
    srv.create(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "default"},
            "spec": {
                "suspend": True,
                "replicatedJobs": [{"name": "workers", "replicas": 2, "template": tpl}],
            },
        }
    )
    jobs = srv.wait_for(lambda: len(srv.list("jobs.batch")) == 2 and srv.list("jobs.batch"), what="2 jobs")
    assert [j["metadata"]["name"] for j in jobs] == ["js-workers-0", "js-workers-1"]
    assert all(j["spec"]["suspend"] for j in jobs) and srv.list("pods") == []
    srv.patch("jobsets.jobset.x-k8s.io", "default", "js", {"spec": {"suspend": False}})
    pods = srv.wait_for(lambda: len(srv.list("pods")) == 4 and srv.list("pods"), what="4 pods")
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] for p in pods} == {"js"}
    assert sorted({p["metadata"]["labels"]["jobset.sigs.k8s.io/job-index"] for p in pods}) == ["0", "1"]


def test_controllers_off_means_no_pods(tmp_path: Any) -> None:
    """Fake only: its switch for the simulated controllers."""
    with FakeApiServer(controllers=False, kubelet=False) as srv:
        srv.create(job("j"))
        assert srv.list("pods") == [] and srv.runtime.handlers == {}


def test_job_whose_pods_are_refused_gets_one_failed_create_event(fake_server: FakeApiServer) -> None:
    """Fake only: it waits for the fake's runtime to be idle to count the Events."""
    srv = fake_server
    bad = job("pc", parallelism=2)
    bad["spec"]["template"]["spec"]["priorityClassName"] = "missing"
    srv.create(bad)
    evs = srv.wait_for(
        lambda: srv.list("events", "default", field_selector="involvedObject.name=pc"), what="event"
    )
    srv.patch("jobs.batch", "default", "pc", {"metadata": {"labels": {"poke": "1"}}})  # another reconcile
    srv.wait_for(srv.runtime.idle, what="settle")
    evs = srv.list("events", "default", field_selector="involvedObject.name=pc")
    assert len(evs) == 1 and evs[0]["reason"] == "FailedCreate" and "no PriorityClass" in evs[0]["message"]
    assert srv.list("pods") == [] and srv.runtime.errors == []
