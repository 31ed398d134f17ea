"""Objects created with kubectl become submissions (gpupool.kube.adapters.source): once per object,
refusals as Warning Events that never block the others, deletes cancel, the namespace policy.

The translation (gpupool.kube.workloads) is replaced by a small local fake here, so these tests
pin the source's own behaviour whatever the translation decides; the service path is real in
``test_service_submitter_*``. One test runs the source over gpupool's informers and the real
translation on both the fake and the real API server (``kube_api``, issue 24)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpupool.kube import workloads as kw
from gpupool.kube.adapters.source import (
    INVALID,
    REFUSED,
    KubeSource,
    Outcome,
    SourcePolicy,
    parse_namespace_queues,
    policy_from_options,
)
from gpupool.kube.wiring import ServiceSubmitter
from gpupool.kube.workloads import KubeWorkload, KubeWorkloadError, ObjectRef
from tests.test_service_support import running_app, wait_for, wl

QUEUE = "kueue.x-k8s.io/queue-name"


class Inf:
    """An informer's cache and listeners, fed by the test."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, str], dict[str, Any]] = {}
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cache.get((namespace, name))

    def items(self) -> list[dict[str, Any]]:
        return list(self.cache.values())

    def add_listener(self, fn: Callable[[str, dict[str, Any]], None]) -> None:
        self.listeners.append(fn)

    def put(self, obj: dict[str, Any], type_: str = "ADDED") -> None:
        m = obj["metadata"]
        self.cache[(m["namespace"], m["name"])] = obj
        for fn in self.listeners:
            fn(type_, obj)

    def delete(self, obj: dict[str, Any]) -> None:
        m = obj["metadata"]
        self.cache.pop((m["namespace"], m["name"]), None)
        for fn in self.listeners:
            fn("DELETED", obj)


class Subm:
    def __init__(self) -> None:
        self.manifests: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.names: set[str] = set()

    def submit_many(self, manifests: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        out = []
        for m in manifests:
            self.manifests.append(dict(m))
            name = m["metadata"]["name"]
            if m["spec"]["queue"] == "ghost":
                out.append(Outcome(name, "refused", "unknown queue", (("spec.queue", "no queue 'ghost'"),)))
                continue
            out.append(Outcome(name, "unchanged" if name in self.names else "created"))
            self.names.add(name)
        return out

    def cancel(self, name: str) -> bool:
        self.cancelled.append(name)
        return name in self.names

    def active(self) -> set[str]:
        return set(self.names)


class Events:
    def __init__(self) -> None:
        self.got: list[tuple[str, str, str, str]] = []

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.got.append((obj["metadata"]["name"], type_, reason, message))


def job(
    name: str, queue: str | None = "team-a", ns: str = "ml", uid: str = "", **extra: Any
) -> dict[str, Any]:
    labels = {QUEUE: queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "labels": labels},
        "spec": {
            "suspend": True,
            "parallelism": 1,
            "template": {"spec": {"schedulerName": "gpupool"}},
            **extra,
        },
    }


def fake_from_object(obj: Mapping[str, Any], defaults: kw.WorkloadDefaults = kw.WorkloadDefaults()) -> Any:
    m = obj["metadata"]
    queue = (m.get("labels") or {}).get(QUEUE) or defaults.namespace_queues.get(m["namespace"])
    if not queue:
        return None
    if obj["spec"].get("parallelism") == -1:
        raise KubeWorkloadError("spec.parallelism", "must be >= 0")
    ref = ObjectRef(obj["apiVersion"], obj["kind"], m["namespace"], m["name"], m.get("uid", ""))
    manifest = {"metadata": {"name": f"{m['namespace']}-{m['name']}"}, "spec": {"queue": queue}}
    return KubeWorkload(ref, manifest, suspendable=True, pod_count=1)


def fake_from_pods(
    pods: Sequence[Mapping[str, Any]], defaults: kw.WorkloadDefaults = kw.WorkloadDefaults()
) -> Any:
    first = pods[0]["metadata"]
    ref = ObjectRef("v1", "Pod", first["namespace"], first["name"])
    manifest = {"metadata": {"name": f"group-{len(pods)}"}, "spec": {"queue": "team-a", "pods": len(pods)}}
    return KubeWorkload(ref, manifest, suspendable=False, pod_count=len(pods))


@pytest.fixture
def translated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kw, "workload_from_object", fake_from_object)
    monkeypatch.setattr(kw, "workload_from_pods", fake_from_pods)
    monkeypatch.setattr(kw, "pod_group_key", lambda pod: (pod["metadata"].get("labels") or {}).get("group"))


def make(policy: SourcePolicy | None = None) -> tuple[KubeSource, dict[str, Inf], Subm, Events]:
    infs = {k: Inf() for k in ("jobs", "pods", "deployments")}
    sub, ev = Subm(), Events()
    src = KubeSource(infs, sub, ev, policy, settle_s=0.0)
    src.attach()
    return src, infs, sub, ev


@pytest.mark.usefixtures("translated")
def test_object_submitted_once_status_updates_change_nothing() -> None:
    src, infs, sub, ev = make()
    j = job("train")
    infs["jobs"].put(j)
    infs["jobs"].put(j, "ADDED")  # a duplicate event (relist)
    assert src.process() == 1
    assert [m["metadata"]["name"] for m in sub.manifests] == ["ml-train"]
    infs["jobs"].put({**j, "status": {"active": 1}}, "MODIFIED")
    src.process()
    assert len(sub.manifests) == 1 and src.stats["submitted"] == 1
    assert src.names[("jobs", "ml", "train")] == "ml-train"
    assert ev.got == []


@pytest.mark.usefixtures("translated")
def test_refusal_is_a_warning_event_once_and_blocks_no_one() -> None:
    src, infs, _, ev = make()
    infs["jobs"].put(job("bad", queue="ghost"))
    infs["jobs"].put(job("broken", parallelism=-1))
    infs["jobs"].put(job("good"))
    src.process()
    assert ("good", "ml-good") in [(n[2], v) for n, v in src.names.items()]
    assert [(e[0], e[1], e[2]) for e in ev.got] == [
        ("broken", "Warning", INVALID),
        ("bad", "Warning", REFUSED),
    ]
    bad = next(e for e in ev.got if e[0] == "bad")
    assert "spec.queue: no queue 'ghost'" in bad[3]  # the located error
    broken = next(e for e in ev.got if e[0] == "broken")
    assert "spec.parallelism" in broken[3]
    infs["jobs"].put({**job("bad", queue="ghost"), "status": {}}, "MODIFIED")
    infs["jobs"].put({**job("broken", parallelism=-1), "status": {}}, "MODIFIED")
    src.process()
    assert len(ev.got) == 2  # not refused again until the object changes
    # nor counted again: the counters say how many problems, not how many status updates
    assert (src.stats["refused"], src.stats["invalid"]) == (1, 1)
    infs["jobs"].put(job("bad", queue="team-b"), "MODIFIED")  # fixed: submitted
    src.process()
    assert src.names[("jobs", "ml", "bad")] == "ml-bad"


@pytest.mark.usefixtures("translated")
def test_unmanaged_objects_are_skipped_and_namespace_default_applies() -> None:
    src, infs, sub, _ = make(policy_from_options(["batch=team-b"], restrict=False))
    infs["jobs"].put(job("plain", queue=None, ns="web"))  # no label, no default: not gpupool's
    infs["jobs"].put(job("nolabel", queue=None, ns="batch"))
    src.process()
    assert [m["spec"]["queue"] for m in sub.manifests] == ["team-b"]
    assert src.stats["skipped"] == 1


@pytest.mark.usefixtures("translated")
def test_deleted_object_cancels_its_workload() -> None:
    src, infs, sub, _ = make()
    j = job("train")
    infs["jobs"].put(j)
    src.process()
    infs["jobs"].delete(j)
    src.process()
    assert sub.cancelled == ["ml-train"]
    assert ("jobs", "ml", "train") not in src.names


@pytest.mark.usefixtures("translated")
def test_deleted_before_gpupool_saw_it_submitted_derives_the_name() -> None:
    src, infs, sub, _ = make()
    sub.names.add("ml-old")  # submitted by an earlier run
    infs["jobs"].delete(job("old"))
    src.process()
    assert sub.cancelled == ["ml-old"]


@pytest.mark.usefixtures("translated")
def test_restart_reconcile_cancels_workloads_whose_object_is_gone() -> None:
    src, infs, sub, _ = make()
    sub.names.update({"ml-kept", "ml-vanished"})
    infs["jobs"].put(job("kept"))
    src.process()
    assert src.reconcile() == 1
    assert sub.cancelled == ["ml-vanished"]


@pytest.mark.usefixtures("translated")
def test_allow_list_refuses_a_queue_not_mapped_to_the_namespace() -> None:
    policy = policy_from_options(["ml=team-a", "ml=team-c"], restrict=True)
    src, infs, sub, ev = make(policy)
    infs["jobs"].put(job("ok", queue="team-c"))
    infs["jobs"].put(job("other", queue="team-b"))
    infs["jobs"].put(job("elsewhere", queue="team-a", ns="guest"))
    src.process()
    assert [m["metadata"]["name"] for m in sub.manifests] == ["ml-ok"]
    msgs = {e[0]: e[3] for e in ev.got}
    assert "allowed: team-a, team-c" in msgs["other"]
    assert "allowed: none" in msgs["elsewhere"]


@pytest.mark.usefixtures("translated")
def test_bare_pods_grouped_by_marker_submitted_once_settled() -> None:
    src, infs, sub, _ = make()
    src.settle_s = 0.5
    for i in range(3):
        pod = {
            "metadata": {"name": f"w{i}", "namespace": "ml", "uid": f"p{i}", "labels": {"group": "g"}},
            "spec": {"schedulerName": "gpupool"},
        }
        infs["pods"].put(pod)
    owned = {
        "metadata": {
            "name": "j-1",
            "namespace": "ml",
            "ownerReferences": [{"kind": "Job", "controller": True}],
        },
        "spec": {"schedulerName": "gpupool"},
    }
    infs["pods"].put(owned)  # a Job's pod: the Job is the workload, not the pod
    infs["pods"].put({"metadata": {"name": "web", "namespace": "ml"}, "spec": {}})  # not gpupool's
    import time

    assert src.process(now=time.monotonic()) == 0  # still settling
    assert src.process(now=time.monotonic() + 1) == 1
    assert [m["spec"]["pods"] for m in sub.manifests] == [3]
    assert src.members("ml", "g") == ["w0", "w1", "w2"]


def test_a_translation_bug_is_a_clear_error_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def stub(*_: Any, **__: Any) -> Any:
        raise TypeError("a bug in the translation")

    monkeypatch.setattr(kw, "workload_from_object", stub)
    src, infs, sub, ev = make()
    infs["jobs"].put(job("train"))
    src.process()
    assert sub.manifests == [] and ev.got == []
    assert "translation layer" in src.last_error and src.stats["errors"] == 1
    assert src.reconcile() is None  # never cancels while it cannot translate


@pytest.mark.parametrize("item", ["ml", "=q", "ml=", "ml:q"])
def test_namespace_queue_option_names_the_bad_item(item: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE=QUEUE"):
        parse_namespace_queues([item])


def test_namespace_queue_first_is_the_default() -> None:
    p = policy_from_options(["ml=a", "ml=b", "ml=a", "cv=c"], restrict=True)
    assert dict(p.defaults.namespace_queues) == {"ml": "a", "cv": "c"}
    assert p.allowed == {"ml": frozenset({"a", "b"}), "cv": frozenset({"c"})}
    assert policy_from_options(["ml=a"], restrict=False).allowed is None


def test_service_submitter_goes_through_the_api_submission_path(tmp_path: Path) -> None:
    """Real prepare + batcher + controller: a valid manifest is created (owned by
    system:kubernetes), an unknown queue is refused with the located error, the same manifest
    again is unchanged, and cancel cancels."""
    with running_app(tmp_path) as api:
        svc = api.c.app.state.svc  # type: ignore[attr-defined]
        sub = ServiceSubmitter(svc)
        outs = sub.submit_many([wl("k-one"), wl("k-bad", queue="no-such-queue"), wl("k-one")])
        assert [o.result for o in outs[:2]] == ["created", "refused"]
        assert outs[2].result in ("created", "unchanged")
        assert any(f == "spec.queue" for f, _ in outs[1].errors), outs[1]
        assert svc.store.get_workload("k-one").owner == "system:kubernetes"
        assert "k-one" in sub.active()
        assert sub.submit_many([wl("k-one")])[0].result == "unchanged"
        assert sub.cancel("k-one") is True
        wait_for(lambda: api.phase("k-one") == "Cancelled", 5, "cancelled")
        assert sub.cancel("k-one") is False and sub.cancel("nope") is False


@pytest.mark.usefixtures("translated")
def test_a_standby_submits_nothing_and_catches_up_when_it_leads() -> None:
    """The worker thread: while the gate is shut nothing is submitted; on taking over it rereads
    every cached object and cancels what an earlier leader submitted for objects now gone."""
    src, infs, sub, _ = make()
    leading = [False]
    src.gate = lambda: leading[0]
    sub.names.add("ml-vanished")
    src.start()
    try:
        infs["jobs"].put(job("train"))
        src._wake.set()
        import time

        time.sleep(0.3)
        assert sub.manifests == []
        leading[0] = True
        src._wake.set()
        wait_for(lambda: "ml-vanished" in sub.cancelled, 5, "the takeover's reconcile")
        assert [m["metadata"]["name"] for m in sub.manifests] == ["ml-train"]
    finally:
        src.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--backend", "kubernetes", "--kubeconfig", "/no/such/kubeconfig"],
            "--kubeconfig /no/such/kubeconfig: no such file",
        ),
        (
            ["--backend", "kubernetes", "--namespace-queue", "ml"],
            "--namespace-queue 'ml': expected NAMESPACE=QUEUE",
        ),
        (["--backend", "kubernetes", "--restrict-namespace-queues"], "needs at least one --namespace-queue"),
        (["--backend", "kubernetes", "--kubeconfig", "EMPTY"], "No current context set"),
        (["--context", "prod"], "--context applies to --backend kubernetes only"),
        (["--namespace-queue", "ml=q"], "--namespace-queue applies to --backend kubernetes only"),
        (["--wait-for-pods-ready", "5m"], "--wait-for-pods-ready applies to --backend kubernetes only"),
        (["--elastic"], "--elastic/--no-elastic applies to --backend kubernetes only"),
        (
            ["--backend", "kubernetes", "--kubeconfig", "EMPTY", "--wait-for-pods-ready", "soon"],
            "waitForPodsReady.timeout",
        ),
        (["--alerts-interval", "0"], "--alerts-interval 0: must be > 0"),
    ],
)
def test_serve_kubernetes_options_are_checked(args: list[str], message: str, tmp_path: Path) -> None:
    """``gpupool serve`` refuses bad Kubernetes options (and a kubeconfig it cannot use) with
    exit 2 naming the problem, before it opens a database."""
    from typer.testing import CliRunner

    from gpupool.cli.main import app

    empty = tmp_path / "kubeconfig"
    empty.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    args = [str(empty) if a == "EMPTY" else a for a in args]
    r = CliRunner().invoke(app, ["serve", "--state-dir", str(tmp_path), *args])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert not (tmp_path / "gpupool.db").exists()


@pytest.mark.usefixtures("translated")
def test_a_failed_batch_is_retried_and_holds_the_reconcile_back() -> None:
    """The service failing a whole batch (the store unreachable) is not a refusal: no Event,
    the objects are submitted on a later pass, and no reconcile runs meanwhile."""
    src, infs, sub, ev = make()
    sub.names.add("ml-vanished")
    real = sub.submit_many
    calls = [0]

    def flaky(manifests: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        calls[0] += 1
        if calls[0] == 1:
            raise ConnectionError("database unreachable")
        return real(manifests)

    sub.submit_many = flaky  # type: ignore[method-assign]
    infs["jobs"].put(job("train"))
    src.process()
    assert ev.got == [] and "database unreachable" in src.last_error
    assert src.reconcile() is None and sub.cancelled == []
    src.process()
    assert src.names[("jobs", "ml", "train")] == "ml-train"
    assert src.reconcile() == 1 and sub.cancelled == ["ml-vanished"]


@pytest.mark.usefixtures("translated")
def test_an_owner_whose_pods_go_to_another_scheduler_is_refused_with_the_scheduler_named() -> None:
    """A Kueue-style Job without schedulerName: gpupool (no webhook) must not be admitted, charged
    and shown Running while kube-scheduler holds its pods (issue 23)."""
    src, infs, sub, ev = make()
    infs["jobs"].put(job("plain", template={"spec": {}}))
    infs["jobs"].put(job("volcano", template={"spec": {"schedulerName": "volcano"}}))
    infs["jobs"].put(job("ours"))
    src.process()
    assert [m["metadata"]["name"] for m in sub.manifests] == ["ml-ours"]
    got = {e[0]: e for e in ev.got}
    assert got["plain"][1:3] == ("Warning", REFUSED)
    assert "default-scheduler (no schedulerName set)" in got["plain"][3]
    assert "spec.template.spec.schedulerName" in got["plain"][3]
    assert "go to volcano" in got["volcano"][3]
    infs["jobs"].put(job("plain", template={"spec": {"schedulerName": "gpupool"}}), "MODIFIED")
    src.process()
    assert "ml-plain" in [m["metadata"]["name"] for m in sub.manifests]


def test_a_deployment_may_leave_its_scheduler_to_the_pod_webhook_when_its_pods_carry_a_queue() -> None:
    from gpupool.kube.schedulers import foreign

    def dep(labels: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
        tpl = {"metadata": {"labels": labels}, "spec": spec}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {"template": tpl},
        }

    assert foreign(dep({QUEUE: "serving"}, {})) is None
    assert "default-scheduler" in (foreign(dep({}, {})) or "")
    assert "go to kai" in (foreign(dep({QUEUE: "serving"}, {"schedulerName": "kai"})) or "")
    assert foreign(dep({}, {"schedulerName": "gpupool"})) is None


@pytest.mark.usefixtures("translated")
def test_a_jobsets_child_job_is_never_a_workload_of_its_own_even_with_a_namespace_default() -> None:
    """With --namespace-queue (the README's quick start) every JobSet's child Jobs became
    workloads of their own that ended Failed (issue 23)."""
    src, infs, sub, ev = make(policy_from_options(["ml=team-a"], restrict=False))
    child = job("js-worker-0", queue=None)
    child["metadata"]["ownerReferences"] = [{"kind": "JobSet", "name": "js", "controller": True}]
    infs["jobs"].put(child)
    infs["jobs"].put(job("alone", queue=None))
    src.process()
    assert [m["metadata"]["name"] for m in sub.manifests] == ["ml-alone"]
    assert ev.got == [] and src.stats["skipped"] == 1


def test_on_the_server_a_job_is_submitted_once_refused_once_and_its_delete_cancels(kube_api: Any) -> None:
    """On both servers (issue 24): the source over gpupool's informers and the real translation,
    fed by the server's own events (create, a label added, a delete): a Kueue Job submitted once
    whatever updates follow, a Job of an unknown queue refused with one Warning naming the field
    (offered again on an update, as its queue may exist by then, but not refused twice), the
    delete cancelling the submitted workload."""
    import time

    from gpupool.kube.client import KubeApi, load_config
    from gpupool.kube.runtime.informer import Informers
    from tests.kube.cluster import job as kueue_job

    ns = kube_api.namespace
    api = KubeApi(load_config(str(kube_api.kubeconfig)))
    infs = Informers(api)
    sub, ev = Subm(), Events()
    src = KubeSource(infs.by_kind, sub, ev, None, settle_s=0.0)
    src.attach()
    infs.start()
    jobs = kube_api.path("jobs", group="batch")
    try:
        assert infs.wait_synced(30)
        for name, queue in (("train", "llm-research"), ("lost", "ghost")):
            obj = kueue_job(name, pods=2)
            obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
            r = kube_api.http.post(jobs, json=obj)
            assert r.status_code == 201, r.text

        def mine() -> list[str]:
            src.process()
            return [
                m["metadata"]["name"] for m in sub.manifests if m["metadata"]["name"].startswith(f"{ns}.")
            ]

        wait_for(lambda: len(mine()) == 2, 30, "both Jobs submitted")
        train = src.names[("jobs", ns, "train")]
        assert train == f"{ns}.job.train" and sorted(mine()) == sorted([train, f"{ns}.job.lost"])
        assert [(e[0], e[1], e[2]) for e in ev.got] == [("lost", "Warning", REFUSED)]
        assert "spec.queue: no queue 'ghost'" in ev.got[0][3]

        # updates that change nothing gpupool reads (a label): the Job not submitted again; the
        # refused one is offered again (its queue may exist by now) but not refused again
        seen = {n: infs.by_kind["jobs"].get(ns, n)["metadata"]["resourceVersion"] for n in ("train", "lost")}
        for name in ("train", "lost"):
            r = kube_api.http.patch(
                f"{jobs}/{name}",
                json={"metadata": {"labels": {"team": "x"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert r.status_code == 200, r.text
        wait_for(
            lambda: all(
                infs.by_kind["jobs"].get(ns, n)["metadata"]["resourceVersion"] != seen[n] for n in seen
            ),
            30,
            "the updates in the informer's cache",
        )
        time.sleep(0.5)  # not a synchronisation: room for late events, then none may count
        src.process()
        assert mine().count(train) == 1
        assert [(e[0], e[2]) for e in ev.got] == [("lost", REFUSED)]  # not refused again

        r = kube_api.http.request("DELETE", f"{jobs}/train", json={"propagationPolicy": "Background"})
        assert r.status_code == 200, r.text

        def cancelled() -> bool:
            src.process()
            return train in sub.cancelled

        wait_for(cancelled, 30, "the deleted Job's workload cancelled")
        assert ("jobs", ns, "train") not in src.names
    finally:
        infs.stop()
        api.close()
