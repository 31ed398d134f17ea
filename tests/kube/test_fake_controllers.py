"""The simulated controllers: Job (suspend, parallelism, completions, Indexed, backoffLimit),
Deployment -> ReplicaSet -> pods, StatefulSet names, PyTorchJob and JobSet."""

from __future__ import annotations

from typing import Any

from gpupool.kube.fake import FakeApiServer

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


def bind_all(srv: FakeApiServer, pods: list[dict[str, Any]], node: str = "cpu-0000") -> None:
    for p in pods:
        if not p["spec"].get("nodeName"):
            srv.bind("default", p["metadata"]["name"], node)


def condition(obj: dict[str, Any], ctype: str) -> str:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == ctype), "")


def test_suspended_job_has_no_pods_until_resumed(fake_server: FakeApiServer) -> None:
    srv = fake_server
    srv.create(job("j", suspend=True))
    srv.wait_for(
        lambda: condition(srv.get("jobs.batch", "default", "j"), "Suspended") == "True", what="Suspended"
    )
    assert job_pods(srv, "j") == []
    srv.patch("jobs.batch", "default", "j", {"spec": {"suspend": False}})
    pods = srv.wait_for(lambda: len(job_pods(srv, "j")) == 2 and job_pods(srv, "j"), what="2 pods")
    uid = srv.get("jobs.batch", "default", "j")["metadata"]["uid"]
    for p in pods:
        assert p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == uid
        assert p["metadata"]["labels"]["controller-uid"] == uid
        assert (
            p["metadata"]["ownerReferences"][0]["uid"] == uid
            and p["metadata"]["ownerReferences"][0]["controller"]
        )
        assert p["spec"]["schedulerName"] == "gpupool"
    srv.wait_for(
        lambda: condition(srv.get("jobs.batch", "default", "j"), "Suspended") == "False", what="resumed"
    )
    srv.patch("jobs.batch", "default", "j", {"spec": {"suspend": True}})
    srv.wait_for(lambda: job_pods(srv, "j") == [], what="re-suspension deletes active pods")
    srv.wait_for(lambda: srv.get("jobs.batch", "default", "j")["status"]["active"] == 0, what="active 0")


def test_indexed_job_labels_pods_with_their_completion_index(fake_server: FakeApiServer) -> None:
    srv = fake_server
    srv.create(job("ix", parallelism=3, completions=3, indexed=True))
    pods = srv.wait_for(lambda: len(job_pods(srv, "ix")) == 3 and job_pods(srv, "ix"), what="3 pods")
    idx = sorted(p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods)
    assert idx == ["0", "1", "2"]
    assert all(
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
        == p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
        for p in pods
    )
    for p in pods:
        assert p["metadata"]["name"].startswith(f"ix-{p['metadata']['labels'][INDEX]}-")


def drive(srv: FakeApiServer, name: str, ctype: str) -> dict[str, Any]:
    """Act as the scheduler: bind every unbound pod of the Job until it has condition ``ctype``."""

    def step() -> dict[str, Any] | None:
        bind_all(srv, job_pods(srv, name))
        j = srv.get("jobs.batch", "default", name)
        return j if condition(j, ctype) == "True" else None

    return srv.wait_for(step, what=f"Job {name} {ctype}")


def test_job_completes_after_its_pods_succeed(fake_server: FakeApiServer) -> None:
    srv = fake_server
    srv.add_gpu_nodes(1, prefix="cpu", gpus=0)
    srv.create(job("done", parallelism=2, completions=3, annotations={RUN: "1"}))
    srv.wait_for(lambda: len(job_pods(srv, "done")) == 2, what="2 pods")
    j = drive(srv, "done", "Complete")
    assert j["status"]["succeeded"] == 3 and j["status"]["active"] == 0 and j["status"]["completionTime"]
    assert len([p for p in job_pods(srv, "done") if p["status"]["phase"] == "Succeeded"]) == 3


def test_job_fails_after_backoff_limit(fake_server: FakeApiServer) -> None:
    srv = fake_server
    srv.add_gpu_nodes(1, prefix="cpu", gpus=0)
    srv.create(
        job(
            "bad",
            parallelism=1,
            completions=1,
            backoff=1,
            annotations={RUN: "0", "fake.gpupool.io/exit-code": "3"},
        )
    )
    j = drive(srv, "bad", "Failed")
    assert j["status"]["failed"] == 2
    failed = [p for p in job_pods(srv, "bad") if p["status"]["phase"] == "Failed"]
    assert failed[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


def test_deployment_makes_one_replicaset_and_its_pods(fake_server: FakeApiServer) -> None:
    srv = fake_server
    tpl = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "v1"}]}}
    srv.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": tpl},
        }
    )
    srv.wait_for(lambda: len(srv.list("pods", "default", "app=web")) == 3, what="3 pods")
    rss = srv.list("replicasets.apps")
    assert len(rss) == 1 and rss[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    h = rss[0]["metadata"]["labels"]["pod-template-hash"]
    assert all(
        p["metadata"]["labels"]["pod-template-hash"] == h for p in srv.list("pods", "default", "app=web")
    )
    srv.patch("deployments.apps", "default", "web", {"spec": {"replicas": 1}})
    srv.wait_for(
        lambda: (
            len(
                [
                    p
                    for p in srv.list("pods", "default", "app=web")
                    if not p["metadata"].get("deletionTimestamp")
                ]
            )
            == 1
        ),
        what="scaled to 1",
    )


def test_statefulset_pods_have_ordinal_names(fake_server: FakeApiServer) -> None:
    srv = fake_server
    tpl = {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    srv.create(
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {
                "replicas": 3,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": tpl,
            },
        }
    )
    pods = srv.wait_for(
        lambda: len(srv.list("pods", "default", "app=db")) == 3 and srv.list("pods", "default", "app=db"),
        what="3 pods",
    )
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
    with FakeApiServer(controllers=False, kubelet=False) as srv:
        srv.create(job("j"))
        assert srv.list("pods") == [] and srv.runtime.handlers == {}


def test_job_whose_pods_are_refused_gets_one_failed_create_event(fake_server: FakeApiServer) -> None:
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
