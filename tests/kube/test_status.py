"""Why a workload waits, on the Kubernetes objects (gpupool.kube.adapters.status): PodScheduled=False
with explain's reason and position, Events deduplicated and rate-limited as client-go's recorder
does, Admitted and Preempted Events from the audit. The recorder and writer logic is checked
against recorded writes (no server); ``KubeWrites``, what gpupool writes with, on both the fake
and the real API server (``kube_api``, issue 24): conditions, Events, counts and the
resourceVersion precondition as each server takes them."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpupool.kube.adapters.source import top_owner_key
from gpupool.kube.adapters.status import EventRecorder, StatusWriter, waiting_reasons
from tests.test_service_support import running_app, wait_for, wl


class Rec:
    """Records the writes; ``fail`` makes every write raise."""

    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.patched: list[tuple[str, str, dict[str, Any]]] = []
        self.pods: list[tuple[str, str, dict[str, Any]]] = []
        self.fail = False

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        if self.fail:
            raise ConnectionError("down")
        self.created.append((namespace, body))

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.patched.append((namespace, name, patch))

    def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        if self.fail:
            raise ConnectionError("down")
        self.pods.append((namespace, name, patch))


class Clock:
    def __init__(self) -> None:
        self.t = 1.7e9

    def __call__(self) -> float:
        return self.t


JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": "ml", "uid": "u1"}}


def test_first_event_written_at_once_repeats_counted_on_the_same_object() -> None:
    w, clk = Rec(), Clock()
    r = EventRecorder(w, interval_s=30, clock=clk)
    r.event(JOB, "Normal", "Pending", "waiting: quota")
    assert len(w.created) == 1
    ns, body = w.created[0]
    assert ns == "ml" and body["count"] == 1 and body["reason"] == "Pending"
    assert body["involvedObject"] == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "namespace": "ml",
        "name": "train",
        "uid": "u1",
    }
    assert body["source"] == {"component": "gpupool"} and body["firstTimestamp"] == body["lastTimestamp"]
    for _ in range(5):
        r.event(JOB, "Normal", "Pending", "waiting: quota (position 2)")
    r.flush()
    assert len(w.created) == 1 and w.patched == []  # rate-limited: nothing more within 30 s
    clk.t += 31
    r.flush()
    assert len(w.patched) == 1
    _, name, patch = w.patched[0]
    assert name == body["metadata"]["name"]  # the same Event object, its count raised
    assert patch["count"] == 6 and patch["message"] == "waiting: quota (position 2)"
    r.flush()
    assert len(w.patched) == 1  # nothing new: no write


def test_another_reason_is_its_own_event_and_not_held_back() -> None:
    w, clk = Rec(), Clock()
    r = EventRecorder(w, interval_s=30, clock=clk)
    r.event(JOB, "Normal", "Pending", "waiting")
    r.event(JOB, "Normal", "Admitted", "admitted to pool p")
    assert [b["reason"] for _, b in w.created] == ["Pending", "Admitted"]
    other = {**JOB, "metadata": {**JOB["metadata"], "uid": "u2"}}  # type: ignore[dict-item]
    r.event(other, "Normal", "Pending", "waiting")
    assert len(w.created) == 3


def test_a_failed_write_never_raises_and_is_retried_later() -> None:
    w, clk = Rec(), Clock()
    r = EventRecorder(w, interval_s=30, clock=clk)
    w.fail = True
    r.event(JOB, "Warning", "GpupoolRefused", "unknown queue")
    assert r.stats["errors"] == 1
    w.fail = False
    clk.t += 31
    r.flush()
    assert len(w.created) == 1 and w.created[0][1]["type"] == "Warning"


def _pod(name: str, owner: dict[str, Any] | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "uid": f"uid-{name}",
        "labels": labels or {},
        "resourceVersion": "7",
    }
    if owner:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"metadata": meta, "spec": {"schedulerName": "gpupool"}, "status": {"phase": "Pending"}}


class Cache:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objs}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get((namespace, name))

    def items(self) -> list[dict[str, Any]]:
        return list(self.objs.values())


def test_top_owner_of_a_pod() -> None:
    js_job = {
        "metadata": {
            "name": "js-w-0",
            "namespace": "ml",
            "ownerReferences": [{"kind": "JobSet", "name": "js", "controller": True}],
        }
    }
    jobs = Cache(js_job)
    by_name = lambda p: "g"  # noqa: E731
    assert top_owner_key(_pod("a", {"kind": "Job", "name": "train"}), jobs, by_name) == (
        "jobs",
        "ml",
        "train",
    )
    assert top_owner_key(_pod("b", {"kind": "Job", "name": "js-w-0"}), jobs, by_name) == (
        "jobsets",
        "ml",
        "js",
    )
    rs = _pod("c", {"kind": "ReplicaSet", "name": "web-5d4f8"}, {"pod-template-hash": "5d4f8"})
    assert top_owner_key(rs, jobs, by_name) == ("deployments", "ml", "web")
    assert top_owner_key(_pod("d", {"kind": "PyTorchJob", "name": "pt"}), jobs, by_name) == (
        "pytorchjobs",
        "ml",
        "pt",
    )
    assert top_owner_key(_pod("e", None), jobs, by_name) == ("pods", "ml", "g")


class Source:
    def __init__(self, names: dict[tuple[str, str, str], str]) -> None:
        self.names = names

    @staticmethod
    def group_of(pod: Mapping[str, Any]) -> str:
        return str(pod["metadata"]["name"])

    def members(self, namespace: str, group: str) -> list[str]:
        return [group]


def test_waiting_pods_carry_explains_reason_and_position_admitted_gets_an_event(tmp_path: Path) -> None:
    """Real controller: two workloads that can never fit wait; their pods get PodScheduled=False
    with the reason and position that explain gives, once; an admitted one gets an Admitted
    Event naming its pool and nodes."""
    with running_app(tmp_path) as api:
        svc = api.c.app.state.svc  # type: ignore[attr-defined]
        for i in range(16):  # more 8-GPU work than the queue and the cluster take: some waits
            r = api.req("POST", "/v1/workloads", json=wl(f"w{i:02}", gpus=8, duration="10h"))
            assert r.status_code == 201, r.text

        seen: list[Any] = []

        def settled() -> list[str]:
            """The two last waiting workloads, once every one of the 16 is running or has a
            reason and two reads in a row agree: the controller admits in several cycles, and
            a queue read mid-way has another length than explain's a moment later."""
            with svc.controller.lock:
                ctl = svc.controller
                waiting = sorted(n for n in ctl.pending if n in ctl.reasons)
                snap = (tuple(waiting), tuple(sorted(ctl.engine.running)), len(ctl.pending))
            if len(waiting) < 2 or len(snap[1]) + len(waiting) < 16:
                return []
            if not seen or seen[-1] != snap:
                seen.append(snap)
                time.sleep(0.3)  # another cycle's chance to change it
                return []
            return waiting[-2:]

        waiting = wait_for(settled, 60, "two waiting workloads, the queue settled")
        with svc.controller.lock:  # both reads see one queue: no cycle runs between them
            got = waiting_reasons(svc.controller, [*waiting, "not-kube"])
            explained = {n: svc.controller.explain(svc.store.get_workload(n)) for n in got}
        assert set(got) == set(waiting)
        for name, w in got.items():
            ex = explained[name]
            assert (w.code, w.reason, w.position, w.length) == (
                ex["code"],
                ex["reason"],
                ex["position"],
                ex["queueLength"],
            )
        huge = waiting[0]

        jobs = Cache(
            {"metadata": {"name": huge, "namespace": "ml", "uid": "ja"}},
            {"metadata": {"name": "small", "namespace": "ml", "uid": "js"}},
        )
        pods = Cache(
            _pod(f"{huge}-0", {"kind": "Job", "name": huge}),
            _pod(f"{huge}-1", {"kind": "Job", "name": huge}),
        )
        names = {("jobs", "ml", huge): huge, ("jobs", "ml", "small"): "small"}
        writes, clk = Rec(), Clock()
        rec = EventRecorder(writes, clock=clk)
        sw = StatusWriter(
            svc.controller, svc.store, Source(names), {"jobs": jobs, "pods": pods}, writes, rec, clock=clk
        )
        sw.start()
        sw.stop()  # only to read the audit head; the passes below are driven by hand
        sw.step()
        assert sorted(p[1] for p in writes.pods) == [f"{huge}-0", f"{huge}-1"]
        cond = writes.pods[0][2]["status"]["conditions"][0]
        # the cached resourceVersion is the patch's precondition (a pod bound since is left alone)
        assert writes.pods[0][2]["metadata"] == {"resourceVersion": "7"}
        assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable")
        w = got[huge]
        assert w.reason in cond["message"] and f"position {w.position} of {w.length}" in cond["message"]
        pending = [b for _, b in writes.created if b["reason"] == "Pending"]
        assert len(pending) == 1 and pending[0]["involvedObject"]["kind"] == "Job"
        on_pods = [b for _, b in writes.created if b["reason"] == "FailedScheduling"]
        assert sorted(b["involvedObject"]["name"] for b in on_pods) == [f"{huge}-0", f"{huge}-1"]
        assert all(b["type"] == "Warning" and b["message"] == cond["message"] for b in on_pods)
        sw.step()
        assert len(writes.pods) == 2  # unchanged message: no second patch

        r = api.req(
            "POST", "/v1/workloads", json=wl("small", queue="serving", priorityClass="inference-critical")
        )
        assert r.status_code == 201
        api.wait_phase("small", "Running", "Admitted")
        sw.step()
        admitted = [b for _, b in writes.created if b["reason"] == "Admitted"]
        assert len(admitted) == 1 and admitted[0]["involvedObject"]["name"] == "small"
        assert "pool" in admitted[0]["message"] and "nodes" in admitted[0]["message"]


def test_a_preempted_workload_gets_a_warning_event_naming_the_preemptor(tmp_path: Path) -> None:
    """Real controller: experiment work fills the queue's GPUs; a training workload in the same
    queue preempts one of them; the victim's owner gets a Warning Event Preempted with the
    preemptor and the rule, taken from the audit record."""
    with running_app(tmp_path) as api:
        svc = api.c.app.state.svc  # type: ignore[attr-defined]
        names = [f"low{i:02}" for i in range(12)]
        for n in names:
            assert api.req("POST", "/v1/workloads", json=wl(n, gpus=8, duration="10h")).status_code == 201
        wait_for(lambda: svc.controller.reasons, 10, "the queue full")
        writes, clk = Rec(), Clock()
        rec = EventRecorder(writes, clock=clk)
        jobs = Cache(*({"metadata": {"name": n, "namespace": "ml", "uid": f"u-{n}"}} for n in names))
        source = Source({("jobs", "ml", n): n for n in names})
        sw = StatusWriter(
            svc.controller, svc.store, source, {"jobs": jobs, "pods": Cache()}, writes, rec, clock=clk
        )
        sw.start()
        sw.stop()
        urgent = wl("urgent", gpus=8, duration="1h", priorityClass="training")
        assert api.req("POST", "/v1/workloads", json=urgent).status_code == 201

        def preempted() -> list[Any]:
            sw.step()
            return [b for _, b in writes.created if b["reason"] == "Preempted"]

        got = wait_for(preempted, 15, "a Preempted Event")
        ev = got[0]
        assert ev["type"] == "Warning" and ev["involvedObject"]["name"] in names
        assert "preempted by urgent" in ev["message"], ev["message"]


# -- on the API servers (issue 24) -----------------------------------------------------------
class _Ctl:
    """What ``waiting_reasons`` reads of the controller: one pending workload and its reason."""

    def __init__(self, name: str, code: str, reason: str) -> None:
        import threading
        from types import SimpleNamespace

        from gpupool.model import PodGroup, PodRequest, Workload

        self.lock = threading.Lock()
        model = Workload(name, "q", (PodGroup("main", 2, PodRequest(gpus=1)),))
        self.pending = {name: SimpleNamespace(name=name, queue="q", model=model)}
        self.reasons = {name: SimpleNamespace(code=code, reason=reason)}


class _NoAudit:
    def audit_head(self) -> tuple[int, int]:
        return (0, 0)

    def audit_records(self, after_seq: int = 0, limit: int = 0) -> list[Any]:
        return []

    def list_workloads(self, names: Any = None) -> list[Any]:
        return []


class _NoMirror:
    def sync(self, *_: Any) -> None:
        pass


class _Listed:
    """An informer's cache as the server lists it now (its resourceVersions included)."""

    def __init__(self, kube_api: Any, resource: str, group: str = "") -> None:
        path = kube_api.path(resource, group=group)
        items = kube_api.http.get(path).json()["items"]
        self.objs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in items}

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get((namespace, name))

    def items(self) -> list[dict[str, Any]]:
        return list(self.objs.values())


def test_kube_writes_mark_waiting_pods_and_their_job_on_the_server(kube_api: Any) -> None:
    """On both servers (issue 24), through ``KubeWrites`` (the writer gpupool runs with): a
    waiting Job's pods get PodScheduled=False with the reason and position, each pod a
    FailedScheduling Warning and the Job a Pending Event; a repeat raises the count of the same
    Event; a pass whose cached pod is stale (written since) is refused by the resourceVersion
    precondition and leaves the pod's condition as it was."""
    from gpupool.kube.adapters.status import KubeWrites
    from gpupool.kube.client import KubeApi, load_config
    from tests.kube.cluster import wait_for as poll

    ns = kube_api.namespace
    tpl = {
        "spec": {
            "schedulerName": "gpupool",
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
        }
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": tpl},
    }
    r = kube_api.http.post(kube_api.path("jobs", group="batch"), json=job)
    assert r.status_code == 201, r.text
    poll(lambda: len(_Listed(kube_api, "pods").items()) == 2, 60, "the Job controller's two pods")
    api = KubeApi(load_config(str(kube_api.kubeconfig)))
    try:
        writes, clk = KubeWrites(api), Clock()
        rec = EventRecorder(writes, interval_s=30, clock=clk)
        source = Source({("jobs", ns, "train"): "w-train"})
        ctl = _Ctl("w-train", "Quota", "the queue's quota is used")

        def writer() -> StatusWriter:
            caches = {"jobs": _Listed(kube_api, "jobs", "batch"), "pods": _Listed(kube_api, "pods")}
            return StatusWriter(ctl, _NoAudit(), source, caches, writes, rec, mirror=_NoMirror(), clock=clk)

        sw = writer()
        sw.step()
        assert sw.stats["errors"] == 0 and sw.stats["conditions"] == 2 and rec.stats["errors"] == 0
        msg = "gpupool: Quota: the queue's quota is used (position 1 of 1 in queue q)"

        def conditions() -> dict[str, dict[str, Any]]:
            return {
                p["metadata"]["name"]: next(
                    c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"
                )
                for p in _Listed(kube_api, "pods").items()
            }

        for cond in conditions().values():
            assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", msg)
        events = kube_api.http.get(kube_api.path("events")).json()["items"]
        pending = [e for e in events if e["reason"] == "Pending"]
        assert len(pending) == 1 and pending[0]["count"] == 1 and pending[0]["message"] == msg
        assert (
            pending[0]["involvedObject"]["kind"] == "Job" and pending[0]["involvedObject"]["name"] == "train"
        )
        failed = [e for e in events if e["reason"] == "FailedScheduling"]
        assert sorted(e["involvedObject"]["name"] for e in failed) == sorted(conditions())
        assert all(e["type"] == "Warning" and e["source"]["component"] == "gpupool" for e in failed)

        # the same Event, counted: a repeat within 30 s held back, written after it
        rec.event(
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": pending[0]["involvedObject"]},
            "Normal",
            "Pending",
            msg,
        )
        clk.t += 31
        rec.flush()
        again = kube_api.http.get(kube_api.path("events", pending[0]["metadata"]["name"])).json()
        assert again["count"] == 2 and rec.stats["errors"] == 0

        # a stale cache: the pods are written after the writer read them
        stale = writer()
        for name in conditions():
            r = kube_api.http.patch(
                kube_api.path("pods", name),
                json={"metadata": {"labels": {"touched": "yes"}}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert r.status_code == 200, r.text
        ctl.reasons["w-train"].reason = "no node fits"
        stale.step()
        assert stale.stats["conditions"] == 0 and stale.stats["errors"] == 2
        assert {c["message"] for c in conditions().values()} == {msg}  # left as it was
    finally:
        api.close()
