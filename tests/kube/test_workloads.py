"""Kubernetes objects as gpupool workloads: kinds, requests, gangs, slots, names, errors. The
translation of what the API server returns for an object (its defaults, its quantities) is checked
against the object as written on both the fake and the real API server (``kube_api``, issue 24)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.kube import annotations as ann
from gpupool.kube.workloads import (
    KubeWorkload,
    KubeWorkloadError,
    ObjectRef,
    PodSlot,
    WorkloadDefaults,
    owner_chain_key,
    pod_group_key,
    pod_slot,
    workload_from_object,
    workload_from_pods,
    workload_name,
)
from gpupool.manifests import NAME_PATTERN, Bundle, build, default_priority_classes, validate_document
from gpupool.model import PodRequest, Workload

QUEUE = {"kueue.x-k8s.io/queue-name": "team-a"}


def container(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"name": "main", "image": "registry.example/train:1", "resources": res}


def template(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"restartPolicy": "Never", "containers": list(containers), **spec},
    }


def kueue_job(**over: Any) -> dict[str, Any]:
    """A batch/v1 Job written for Kueue: queue-name label, suspend: true, whole GPUs in limits."""
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "sample-job", "namespace": "team-a", "uid": "8c1d-job", "labels": dict(QUEUE)},
        "spec": {
            "suspend": True,
            "parallelism": 4,
            "completions": 4,
            "completionMode": "Indexed",
            "template": template(
                container({"cpu": "8", "memory": "64Gi"}, {"nvidia.com/gpu": 8, "rdma/hca": 1})
            ),
        },
    }
    job.update(over)
    return job


def pytorch_job(min_available: int | None = None) -> dict[str, Any]:
    """A Kubeflow PyTorchJob: one master and three workers, each with 8 GPUs."""
    tpl = template(container({"cpu": "16", "memory": "128Gi"}, {"nvidia.com/gpu": "8"}))
    spec: dict[str, Any] = {
        "runPolicy": {"suspend": True},
        "pytorchReplicaSpecs": {
            "Worker": {"replicas": 3, "restartPolicy": "OnFailure", "template": copy.deepcopy(tpl)},
            "Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": copy.deepcopy(tpl)},
        },
    }
    if min_available is not None:
        spec["runPolicy"]["schedulingPolicy"] = {"minAvailable": min_available}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "bert",
            "namespace": "team-a",
            "uid": "u-pt",
            "labels": {"gpupool.io/queue": "team-a"},
        },
        "spec": spec,
    }


def jobset() -> dict[str, Any]:
    """A JobSet: a driver Job and two worker Jobs of two pods each."""

    def rjob(name: str, replicas: int, parallelism: int, gpus: int) -> dict[str, Any]:
        return {
            "name": name,
            "replicas": replicas,
            "template": {
                "spec": {
                    "parallelism": parallelism,
                    "completions": parallelism,
                    "completionMode": "Indexed",
                    "template": template(container({"cpu": "4"}, {"nvidia.com/gpu": gpus})),
                }
            },
        }

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "llm", "namespace": "team-a", "labels": dict(QUEUE)},
        "spec": {"suspend": True, "replicatedJobs": [rjob("driver", 1, 1, 0), rjob("workers", 2, 2, 4)]},
    }


def deployment(**resources: Any) -> dict[str, Any]:
    """An inference Deployment with fractional HAMi requests (a quarter of a GPU, 20 GiB)."""
    limits = resources or {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480, "nvidia.com/gpucores": 25}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "serving", "labels": {"gpupool.io/queue": "serving"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "chat"}},
            "template": {
                "metadata": {"labels": {"app": "chat"}},
                "spec": {
                    "priorityClassName": "inference-critical",
                    "containers": [container({"cpu": "2", "memory": "16Gi"}, limits)],
                    "tolerations": [
                        {"key": "gpupool.io/managed", "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "nodeSelector": {"gpupool.io/environment": "inference"},
                },
            },
        },
    }


def statefulset() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "kv", "namespace": "serving", "labels": {"gpupool.io/queue": "serving"}},
        "spec": {
            "replicas": 2,
            "serviceName": "kv",
            "template": template(container(limits={"nvidia.com/gpu": 1})),
        },
    }


def bare_pod(
    name: str, group: str | None = "ring", gpus: int = 1, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    md: dict[str, Any] = {
        "name": name,
        "namespace": "team-a",
        "uid": f"uid-{name}",
        "labels": {**QUEUE, **(labels or {})},
    }
    if group:
        md["labels"]["scheduling.x-k8s.io/pod-group"] = group
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {
            "schedulerName": "gpupool",
            "containers": [container({"cpu": "1"}, {"nvidia.com/gpu": gpus})],
        },
    }


def model(kw: KubeWorkload) -> Workload:
    """The manifest as the API would build it: schema and conversion, with the default classes."""
    errors: list[str] = []
    doc = validate_document(kw.manifest, "test", errors)
    assert doc is not None, errors
    b = build([doc], Bundle(priority_classes=list(default_priority_classes())), references=False)
    return b.workloads[0]


def translated(obj: dict[str, Any], defaults: WorkloadDefaults = WorkloadDefaults()) -> KubeWorkload:
    kw = workload_from_object(obj, defaults)
    assert kw is not None
    return kw


# -- kinds ---------------------------------------------------------------------------------------
def test_kueue_job_runs_unchanged() -> None:
    kw = translated(kueue_job())
    assert kw.ref == ObjectRef("batch/v1", "Job", "team-a", "sample-job", "8c1d-job")
    assert kw.suspendable and kw.pod_count == 4 and kw.suspend_field == ("spec", "suspend")
    md = kw.manifest["metadata"]
    assert md["name"] == "team-a.job.sample-job"
    assert md["annotations"]["gpupool.io/source"] == "Job/team-a/sample-job"
    assert md["annotations"]["gpupool.io/source-uid"] == "8c1d-job"
    w = model(kw)
    assert (w.queue, w.type.value, w.min_pods, w.pod_count) == ("team-a", "training", 4, 4)
    assert w.pod_groups[0].request == PodRequest(gpus=8, cpu_milli=8000, memory_mib=65536, rdma=1)


def test_job_parallelism_defaults_to_one_and_is_capped_by_completions() -> None:
    job = kueue_job()
    del job["spec"]["parallelism"]
    assert translated(job).pod_count == 1
    job = kueue_job()
    job["spec"]["completions"] = 2
    assert translated(job).pod_count == 2


def test_pytorchjob_master_and_workers() -> None:
    kw = translated(pytorch_job())
    w = model(kw)
    assert [(g.name, g.replicas) for g in w.pod_groups] == [("master", 1), ("worker", 3)]
    assert kw.suspendable and w.gang_min is None and w.min_pods == 4
    assert kw.suspend_field == ("spec", "runPolicy", "suspend")
    assert w.pod_groups[1].request.gpus == 8


def test_pytorchjob_min_available() -> None:
    w = model(translated(pytorch_job(min_available=2)))
    assert w.gang_min == 2 and w.min_pods == 2


def test_jobset_one_group_per_replicated_job() -> None:
    kw = translated(jobset())
    w = model(kw)
    assert [(g.name, g.replicas, g.request.gpus) for g in w.pod_groups] == [
        ("driver", 1, 0),
        ("workers", 4, 4),
    ]
    assert kw.pod_count == 5 and kw.suspendable and w.type.value == "training"
    assert kw.parallelism == {"workers": 2}


def test_deployment_fractional_hami() -> None:
    kw = translated(deployment())
    w = model(kw)
    req = w.pod_groups[0].request
    assert (req.gpus, req.gpu_milli, req.gpu_memory_mib) == (0, 250, 20480)
    assert not kw.suspendable and w.type.value == "inference" and w.priority_class == "inference-critical"
    assert w.node_selector == (("gpupool.io/environment", "inference"),)
    assert [t.key for t in w.tolerations] == ["gpupool.io/managed"] and w.tolerations[0].value is None
    assert w.gang_min is None and w.pod_count == 3


def test_deployment_min_replicas() -> None:
    d = deployment()
    d["metadata"]["annotations"] = {"gpupool.io/min-replicas": "1"}
    assert model(translated(d)).gang_min == 1


def test_deployment_scaled_to_zero_has_no_workload() -> None:
    d = deployment()
    d["spec"]["replicas"] = 0
    assert workload_from_object(d) is None


def test_hami_memory_without_cores_takes_the_whole_compute() -> None:
    w = model(translated(deployment(**{"nvidia.com/gpu": 1, "nvidia.com/gpumem": "10Gi"})))
    req = w.pod_groups[0].request
    assert (req.gpus, req.gpu_milli, req.gpu_memory_mib) == (0, 1000, 10240)


def test_kai_fraction_annotations() -> None:
    d = deployment(**{})
    d["spec"]["template"]["spec"]["containers"] = [container({"cpu": "1"})]
    d["spec"]["template"]["metadata"]["annotations"] = {"gpu-fraction": "0.5", "gpu-memory": "30000"}
    req = model(translated(d)).pod_groups[0].request
    assert (req.gpu_milli, req.gpu_memory_mib) == (500, 30000)


def test_statefulset_is_a_gang() -> None:
    kw = translated(statefulset())
    w = model(kw)
    assert w.min_pods == 2 and w.type.value == "inference" and not kw.suspendable and kw.suspend_field == ()


def test_gpupool_labels_and_annotations() -> None:
    job = kueue_job()
    job["metadata"]["labels"]["gpupool.io/priority-class"] = "experiment"
    job["metadata"]["annotations"] = {
        "gpupool.io/type": "fine-tuning",
        "gpupool.io/duration": "2h",
        "gpupool.io/pool": "training",
        "gpupool.io/topology": "nvlink",
        "gpupool.io/topology-mode": "Preferred",
    }
    job["spec"]["template"]["spec"]["priorityClassName"] = "training"
    w = model(translated(job))
    assert (w.priority_class, w.type.value, w.expected_duration_s, w.pool) == (
        "experiment",
        "fine-tuning",
        7200,
        "training",
    )
    assert w.topology is not None and (w.topology.scope.value, w.topology.mode.value) == (
        "nvlink",
        "Preferred",
    )


def test_priority_from_template() -> None:
    job = kueue_job()
    job["spec"]["template"]["spec"]["priorityClassName"] = "training"
    assert model(translated(job)).priority_class == "training"


def test_not_managed_without_queue() -> None:
    job = kueue_job()
    job["metadata"]["labels"] = {}
    assert workload_from_object(job) is None
    kw = translated(job, WorkloadDefaults(namespace_queues={"team-a": "team-a-default"}))
    assert kw.manifest["spec"]["queue"] == "team-a-default"


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("v1", "ConfigMap"), ("apps/v1", "DaemonSet"), ("batch/v1", "CronJob"), ("example.com/v1", "Job")],
)
def test_other_kinds_are_not_workloads(api_version: str, kind: str) -> None:
    assert workload_from_object({**kueue_job(), "apiVersion": api_version, "kind": kind}) is None


def test_init_containers_and_sidecars_count_as_the_kubelet_counts() -> None:
    job = kueue_job()
    job["spec"]["template"]["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"requests": {"cpu": "20", "memory": "1Gi"}}},
        {
            "name": "proxy",
            "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        },
    ]
    req = model(translated(job)).pod_groups[0].request
    assert (req.cpu_milli, req.memory_mib) == (20000, 65536 + 1024)


def test_several_gpu_containers_add_up() -> None:
    job = kueue_job()
    job["spec"]["template"]["spec"]["containers"].append(container(limits={"nvidia.com/gpu": 2}))
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 2
    assert model(translated(job)).pod_groups[0].request.gpus == 4


def test_an_init_container_with_more_gpus_sets_the_pod_request() -> None:
    job = _with_limits({"nvidia.com/gpu": 1})
    job["spec"]["template"]["spec"]["initContainers"] = [container(limits={"nvidia.com/gpu": 2})]
    assert model(translated(job)).pod_groups[0].request.gpus == 2


def test_translation_does_not_mutate_the_object() -> None:
    for obj in (kueue_job(), pytorch_job(), jobset(), deployment(), statefulset()):
        before = copy.deepcopy(obj)
        translated(obj)
        assert obj == before


# -- unreadable managed objects ------------------------------------------------------------------
GPU_FIELD = "spec.template.spec.containers[0].resources.requests.nvidia.com/gpu"


def _with_limits(limits: dict[str, Any]) -> dict[str, Any]:
    job = kueue_job()
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": limits}
    return job


@pytest.mark.parametrize(
    ("obj", "field", "problem"),
    [
        (_with_limits({"nvidia.com/gpu": "eight"}), GPU_FIELD, "invalid quantity"),
        (_with_limits({"nvidia.com/gpu": "1500m"}), GPU_FIELD, "whole number"),
        (_with_limits({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}), GPU_FIELD, "more than one GPU"),
        (
            _with_limits({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}),
            "spec.template.spec.containers[0].resources.requests.nvidia.com/gpucores",
            "percentage",
        ),
        (
            _with_limits({"nvidia.com/gpumem-percentage": 50}),
            "spec.template.spec.containers[0].resources.requests.nvidia.com/gpumem-percentage",
            "not supported",
        ),
        (
            _with_limits({"cpu": "lots"}),
            "spec.template.spec.containers[0].resources.requests.cpu",
            "invalid quantity",
        ),
        (kueue_job(metadata={"name": "x", "labels": QUEUE}), "metadata.namespace", "required"),
        (
            {**kueue_job(), "spec": {**kueue_job()["spec"], "parallelism": -1}},
            "spec.parallelism",
            "whole number",
        ),
        ({**pytorch_job(), "spec": {}}, "spec.pytorchReplicaSpecs", "required"),
        (pytorch_job(min_available=9), "spec.runPolicy.schedulingPolicy.minAvailable", "between 1 and the 4"),
        (
            {**jobset(), "spec": {"replicatedJobs": [{"replicas": 1}]}},
            "spec.replicatedJobs[0].name",
            "required",
        ),
    ],
)
def test_unreadable_object_names_the_field(obj: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(KubeWorkloadError) as exc:
        workload_from_object(obj)
    assert exc.value.field == field and problem in exc.value.problem


def test_bad_gpupool_annotations_are_named() -> None:
    for key, value in [
        ("gpupool.io/type", "gaming"),
        ("gpupool.io/duration", "soon"),
        ("gpupool.io/topology", "row"),
    ]:
        job = kueue_job()
        job["metadata"]["annotations"] = {key: value}
        with pytest.raises(KubeWorkloadError) as exc:
            workload_from_object(job)
        assert exc.value.field == f"metadata.annotations.{key}"


def test_whole_and_share_in_one_pod_is_refused() -> None:
    job = kueue_job()
    job["spec"]["template"]["spec"]["containers"].append(
        container(limits={"nvidia.com/gpu": 1, "nvidia.com/gpucores": 20})
    )
    with pytest.raises(KubeWorkloadError, match="not both"):
        workload_from_object(job)


def test_conflicting_node_selectors_are_refused() -> None:
    pt = pytorch_job()
    pt["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["nodeSelector"] = {"zone": "a"}
    pt["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"] = {"zone": "b"}
    with pytest.raises(KubeWorkloadError) as exc:
        workload_from_object(pt)
    assert exc.value.field == "spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelector.zone"


# -- bare pods -----------------------------------------------------------------------------------
def test_single_bare_pod() -> None:
    p = bare_pod("solo", group=None)
    kw = workload_from_pods([p])
    assert kw is not None and kw.ref == ObjectRef("v1", "Pod", "team-a", "solo", "uid-solo")
    assert kw.manifest["metadata"]["name"] == "team-a.pod.solo"
    assert model(kw).pod_count == 1 and pod_slot(p, kw) == PodSlot("main", 0)


def test_pod_group_with_declared_total() -> None:
    pods = [bare_pod(f"ring-{i}", labels={"kueue.x-k8s.io/pod-group-total-count": "4"}) for i in (2, 0, 1)]
    kw = workload_from_pods(pods)
    assert kw is not None and kw.ref.kind == "PodGroup" and kw.ref.name == "ring"
    assert kw.pod_count == 4 and model(kw).min_pods == 4
    assert [pod_slot(p, kw) for p in pods] == [PodSlot("main", 2), PodSlot("main", 0), PodSlot("main", 1)]


def test_pod_group_roles_by_shape() -> None:
    pods = [bare_pod("a-launcher", gpus=0), bare_pod("a-w0", gpus=8), bare_pod("a-w1", gpus=8)]
    kw = workload_from_pods(pods)
    assert kw is not None
    w = model(kw)
    assert [(g.name, g.replicas, g.request.gpus) for g in w.pod_groups] == [
        ("role-0", 1, 0),
        ("role-1", 2, 8),
    ]
    assert pod_slot(pods[2], kw) == PodSlot("role-1", 1)


def test_pods_of_another_scheduler_or_queue_are_not_managed() -> None:
    p = bare_pod("x")
    p["spec"]["schedulerName"] = "default-scheduler"
    assert workload_from_pods([p]) is None
    q = bare_pod("y")
    q["metadata"]["labels"] = {}
    assert workload_from_pods([q]) is None
    assert workload_from_pods([]) is None


def test_pod_group_errors() -> None:
    with pytest.raises(KubeWorkloadError, match="share a namespace"):
        other = bare_pod("b")
        other["metadata"]["namespace"] = "team-b"
        workload_from_pods([bare_pod("a"), other])
    with pytest.raises(KubeWorkloadError, match="without a group marker"):
        workload_from_pods([bare_pod("a", group=None), bare_pod("b", group=None)])
    bad = bare_pod("a", labels={"kueue.x-k8s.io/pod-group-total-count": "many"})
    with pytest.raises(KubeWorkloadError) as exc:
        workload_from_pods([bad])
    assert exc.value.field == "metadata.labels.kueue.x-k8s.io/pod-group-total-count"
    broken = bare_pod("a")
    broken["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "x"
    with pytest.raises(KubeWorkloadError) as exc:
        workload_from_pods([broken])
    assert exc.value.field == "spec.containers[0].resources.requests.nvidia.com/gpu"
    assert "(pod a)" in exc.value.problem


@pytest.mark.parametrize(
    ("where", "key", "expected"),
    [
        ("labels", "gpupool.io/workload", "g1"),
        ("labels", "scheduling.x-k8s.io/pod-group", "g1"),
        ("annotations", "scheduling.k8s.io/group-name", "g1"),
        ("labels", "kueue.x-k8s.io/pod-group-name", "g1"),
        ("annotations", "pod-group-name", "g1"),
    ],
)
def test_group_markers(where: str, key: str, expected: str) -> None:
    pod: dict[str, Any] = {"metadata": {where: {key: expected}}}
    assert pod_group_key(pod) == expected


def test_group_marker_order_and_binding_record() -> None:
    pod: dict[str, Any] = {
        "metadata": {
            "labels": {"kueue.x-k8s.io/pod-group-name": "kueue-g"},
            "annotations": {"scheduling.k8s.io/group-name": "volcano-g"},
        }
    }
    assert pod_group_key(pod) == "volcano-g"
    assert pod_group_key({"metadata": {}}) is None
    bound = {"metadata": {"annotations": {ann.WORKLOAD: "team-a.pod.solo", ann.NODE: "n1"}}}
    assert pod_group_key(bound) is None


def test_owner_chain_key() -> None:
    pod = {
        "metadata": {
            "namespace": "team-a",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n"},
                {"apiVersion": "batch/v1", "kind": "Job", "name": "sample-job", "controller": True},
            ],
        }
    }
    assert owner_chain_key(pod) == ("Job", "team-a", "sample-job")
    assert owner_chain_key({"metadata": {"namespace": "x"}}) is None


# -- slots ---------------------------------------------------------------------------------------
def _pod(name: str, **marks: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": marks}}


def test_slots_per_kind() -> None:
    job = translated(kueue_job())
    assert pod_slot(_pod("j-2", **{"batch.kubernetes.io/job-completion-index": "2"}), job) == PodSlot(
        "main", 2
    )
    assert pod_slot(_pod("j-9", **{"batch.kubernetes.io/job-completion-index": "9"}), job) is None
    assert pod_slot(_pod("j-x"), job) is None
    pt = translated(pytorch_job())
    marks = {"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "2"}
    assert pod_slot(_pod("bert-worker-2", **marks), pt) == PodSlot("worker", 2)
    marks = {"training.kubeflow.org/replica-type": "Master", "training.kubeflow.org/replica-index": "0"}
    assert pod_slot(_pod("bert-master-0", **marks), pt) == PodSlot("master", 0)
    sts = translated(statefulset())
    assert pod_slot(_pod("kv-1"), sts) == PodSlot("main", 1)
    assert pod_slot(_pod("kv-7"), sts) is None
    js = translated(jobset())
    marks = {
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/job-index": "1",
        "batch.kubernetes.io/job-completion-index": "1",
    }
    assert pod_slot(_pod("llm-workers-1-1-abc", **marks), js) == PodSlot("workers", 3)
    drv = {"jobset.sigs.k8s.io/replicatedjob-name": "driver", "jobset.sigs.k8s.io/job-index": "0"}
    assert pod_slot(_pod("llm-driver-0-0", **drv), js) == PodSlot("driver", 0)
    assert pod_slot(_pod("chat-5d8f-abc"), translated(deployment())) is None


# -- names ---------------------------------------------------------------------------------------
_NAME = re.compile(NAME_PATTERN)
_DNS = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
_KINDS = st.sampled_from(["Job", "PyTorchJob", "JobSet", "Deployment", "StatefulSet", "Pod", "PodGroup"])
_ANY = st.text(min_size=0, max_size=300)


@given(ns=_DNS | _ANY, kind=_KINDS | _ANY, name=_DNS | _ANY | st.text(min_size=240, max_size=400))
def test_workload_name_always_valid_and_deterministic(ns: str, kind: str, name: str) -> None:
    ref = ObjectRef("v1", kind, ns, name)
    got = workload_name(ref)
    assert _NAME.match(got) and len(got) <= 253
    assert workload_name(ObjectRef("v1", kind, ns, name, "other-uid")) == got


@given(
    a=st.tuples(_DNS, _KINDS, _DNS | _ANY | st.text(min_size=240, max_size=400)),
    b=st.tuples(_DNS, _KINDS, _DNS | _ANY | st.text(min_size=240, max_size=400)),
)
def test_workload_name_injective(a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    if a != b:
        assert workload_name(ObjectRef("v1", a[1], a[0], a[2])) != workload_name(
            ObjectRef("v1", b[1], b[0], b[2])
        )


def test_workload_name_readable_when_it_can_be() -> None:
    assert workload_name(ObjectRef("batch/v1", "Job", "team-a", "sample-job")) == "team-a.job.sample-job"
    long = workload_name(ObjectRef("batch/v1", "Job", "team-a", "x" * 253))
    assert len(long) <= 253 and long.startswith("team-a.job.xxx")
    assert workload_name(ObjectRef("v1", "Pod", "ns", "Upper_Case")) != workload_name(
        ObjectRef("v1", "Pod", "ns", "upper-case")
    )


def test_every_fixture_manifest_validates() -> None:
    kws = [
        translated(o)
        for o in (kueue_job(), pytorch_job(), pytorch_job(2), jobset(), deployment(), statefulset())
    ]
    pods = workload_from_pods([bare_pod("ring-0"), bare_pod("ring-1")])
    assert pods is not None
    for kw in [*kws, pods]:
        errors: list[str] = []
        assert validate_document(kw.manifest, "t", errors) is not None, errors
        assert model(kw).name == kw.manifest["metadata"]["name"] == workload_name(kw.ref)


def test_an_objects_max_retries_annotation_is_its_workloads_retry_limit() -> None:
    """Per-object maxRetries on Kubernetes (issue 23): ``gpupool.io/max-retries`` on the Job."""
    from gpupool.service.failures.policy import FaultState, policy_for

    job = kueue_job()
    job["metadata"].setdefault("annotations", {})["gpupool.io/max-retries"] = "7"
    kw = translated(job)
    assert kw.manifest["spec"]["maxRetries"] == 7
    assert policy_for(kw.manifest, FaultState()).max_retries == 7
    for bad in ("-1", "x", "1001"):
        job["metadata"]["annotations"]["gpupool.io/max-retries"] = bad
        with pytest.raises(KubeWorkloadError, match=r"metadata\.annotations\.gpupool\.io/max-retries"):
            workload_from_object(job)


# -- what the API servers return (issue 24) ----------------------------------------------------
_PLURALS = {
    "Job": ("jobs", "batch"),
    "Deployment": ("deployments", "apps"),
    "StatefulSet": ("statefulsets", "apps"),
}


def _as_created(kube_api: Any, obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``obj`` in the test's namespace, and the object the server makes of it (its defaults,
    quantities as it writes them; a server dry run, so no controller acts on it), the written
    one given the server's uid so the two differ only by what the server did."""
    raw = copy.deepcopy(obj)
    raw["metadata"]["namespace"] = kube_api.namespace
    raw["metadata"].pop("uid", None)
    if raw["kind"] == "StatefulSet":  # both servers require a selector and restartPolicy Always
        raw["spec"]["template"].setdefault("metadata", {})["labels"] = {"app": "kv"}
        raw["spec"]["template"]["spec"]["restartPolicy"] = "Always"
        raw["spec"]["selector"] = {"matchLabels": {"app": "kv"}}
    plural, group = _PLURALS.get(raw["kind"], ("pods", ""))
    r = kube_api.http.post(kube_api.path(plural, group=group), params={"dryRun": "All"}, json=raw)
    assert r.status_code == 201, r.text
    got = r.json()
    raw["metadata"]["uid"] = got["metadata"]["uid"]
    return raw, got


@pytest.mark.parametrize(
    "make", [kueue_job, deployment, statefulset], ids=["job", "deployment", "statefulset"]
)
def test_the_servers_object_translates_as_the_written_one(kube_api: Any, make: Any) -> None:
    """On both servers: the translation of what ``kubectl create`` gets back (server defaults:
    Job completions and pod failure defaults, Deployment strategy, StatefulSet policies, every
    pod template's restart, DNS and termination fields; quantities as the server writes them)
    is the translation of the object as written: the same manifest, the same engine model."""
    raw, got = _as_created(kube_api, make())
    assert got["metadata"].get("creationTimestamp") and got["spec"] != raw["spec"]  # defaults added
    want, have = translated(raw), translated(got)
    assert have.manifest == want.manifest
    assert (have.pod_count, have.suspendable, have.ref) == (want.pod_count, want.suspendable, want.ref)
    assert model(have) == model(want)


def test_the_servers_bare_pods_translate_as_the_written_ones(kube_api: Any) -> None:
    """The same for a gang of bare pods (``workload_from_pods``), but for the tolerations the
    DefaultTolerationSeconds admission adds to every pod (not-ready and unreachable, NoExecute;
    the fake adds them too): they reach the workload (without their seconds), and match only NoExecute taints
    (``model.Toleration.tolerates``), so a NotReady node's NoSchedule taint still keeps the pods off."""
    pairs = [_as_created(kube_api, bare_pod(f"ring-{i}")) for i in range(2)]
    want = workload_from_pods([raw for raw, _ in pairs])
    have = workload_from_pods([got for _, got in pairs])
    assert want is not None and have is not None
    manifest = copy.deepcopy(have.manifest)
    defaults = manifest["spec"].pop("tolerations", [])
    assert sorted((t["key"], t["operator"], t["effect"]) for t in defaults) == [
        ("node.kubernetes.io/not-ready", "Exists", "NoExecute"),
        ("node.kubernetes.io/unreachable", "Exists", "NoExecute"),
    ]
    assert manifest == want.manifest and have.pod_count == want.pod_count == 2
