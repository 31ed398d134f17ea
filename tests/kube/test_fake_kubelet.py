"""The simulated kubelet (Pending -> Running -> Succeeded/Failed, NotReady nodes) and the HAMi
device-plugin stand-in (acceptance, refusal with an Event, the node lock, the device ledger)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpupool.kube.fake import FakeApiServer
from gpupool.kube.fake.kubelet import kubelet_of

RUN, EXIT = "fake.gpupool.io/run-seconds", "fake.gpupool.io/exit-code"
ALLOC, PHASE, LOCK = "hami.io/vgpu-devices-to-allocate", "hami.io/bind-phase", "hami.io/mutex.lock"


def pod(
    name: str, gpus: int = 0, annotations: dict[str, str] | None = None, containers: int = 1
) -> dict[str, Any]:
    cs = [
        {
            "name": f"c{i}",
            "image": "x",
            **({"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}} if gpus and i == 0 else {}),
        }
        for i in range(containers)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"schedulerName": "gpupool", "containers": cs},
    }


def uuids(srv: FakeApiServer, node: str) -> list[str]:
    reg = json.loads(srv.get("nodes", "", node)["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    return [d["id"] for d in reg]


def phase(srv: FakeApiServer, name: str) -> str:
    return str(srv.get("pods", "default", name)["status"]["phase"])


def test_bound_pod_runs_then_succeeds(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("p", annotations={RUN: "2"}))
    assert phase(srv, "p") == "Pending"
    srv.bind("default", "p", node)
    running = srv.wait_for(
        lambda: phase(srv, "p") != "Pending" and srv.get("pods", "default", "p"), what="start"
    )
    assert running["status"]["phase"] in ("Running", "Succeeded") and running["status"]["startTime"]
    done = srv.wait_for(
        lambda: phase(srv, "p") == "Succeeded" and srv.get("pods", "default", "p"), what="end"
    )
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_start_time_stays_when_the_kubelet_first_took_the_pod(fake_server: FakeApiServer) -> None:
    """A kubelet sets ``startTime`` once, when it takes the pod (still ``ContainerCreating``);
    the fake overwrote it when the containers started."""
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("slow", annotations={"fake.gpupool.io/start-seconds": "150"}))  # 1.5 s at 0.01
    srv.bind("default", "slow", node)
    creating = srv.wait_for(
        lambda: srv.get("pods", "default", "slow")["status"].get("startTime"), what="take"
    )
    running = srv.wait_for(
        lambda: phase(srv, "slow") == "Running" and srv.get("pods", "default", "slow"), what="run"
    )
    assert running["status"]["startTime"] == creating


def test_pod_without_run_seconds_keeps_running(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("forever"))
    srv.bind("default", "forever", node)
    p = srv.wait_for(
        lambda: phase(srv, "forever") == "Running" and srv.get("pods", "default", "forever"), what="run"
    )
    assert p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert {c["type"]: c["status"] for c in p["status"]["conditions"]}["Ready"] == "True"


def test_exit_code_fails_the_pod(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("f", annotations={RUN: "0", EXIT: "137"}))
    srv.bind("default", "f", node)
    p = srv.wait_for(lambda: phase(srv, "f") == "Failed" and srv.get("pods", "default", "f"), what="fail")
    assert p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


def test_not_ready_node_parks_its_pods_until_ready(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    n = srv.set_node_ready(node, False)
    assert {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"] == "False"
    srv.create(pod("w"))
    srv.bind("default", "w", node)
    srv.wait_for(srv.runtime.idle, what="the simulators to settle")
    assert phase(srv, "w") == "Pending"
    srv.set_node_ready(node, True)
    srv.wait_for(lambda: phase(srv, "w") == "Running", what="the pod to start on the Ready node")


def test_hami_accepts_matching_devices_and_releases_the_node_lock(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    ids = uuids(srv, node)
    srv.patch("nodes", "", node, {"metadata": {"annotations": {LOCK: "2026-12-01T00:00:00Z,default,g"}}})
    value = f"{ids[0]},NVIDIA,81559,100:{ids[1]},NVIDIA,81559,100:;"
    srv.create(pod("g", gpus=2, annotations={ALLOC: value, PHASE: "allocating"}))
    srv.bind("default", "g", node)
    p = srv.wait_for(lambda: phase(srv, "g") == "Running" and srv.get("pods", "default", "g"), what="run")
    assert p["metadata"]["annotations"][PHASE] == "success"
    assert LOCK not in srv.get("nodes", "", node)["metadata"]["annotations"]
    assert srv.stats.violations == []


def test_hami_refuses_a_device_count_mismatch_with_an_event(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    ids = uuids(srv, node)
    srv.create(pod("m", gpus=2, annotations={ALLOC: f"{ids[0]},NVIDIA,81559,100:;"}))
    srv.bind("default", "m", node)
    p = srv.wait_for(lambda: phase(srv, "m") == "Failed" and srv.get("pods", "default", "m"), what="refusal")
    assert (
        p["metadata"]["annotations"][PHASE] == "failed"
        and p["status"]["reason"] == "UnexpectedAdmissionError"
    )
    evs = srv.list("events", "default", field_selector="involvedObject.name=m")
    assert evs and evs[0]["type"] == "Warning" and "device number not matched" in evs[0]["message"]


def test_hami_refuses_unknown_devices_and_bad_format(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    other = srv.add_gpu_nodes(1, prefix="other")[0]
    srv.create(pod("u", gpus=1, annotations={ALLOC: f"{uuids(srv, other)[0]},NVIDIA,100,10:;"}))
    srv.create(pod("b", gpus=1, annotations={ALLOC: "not-a-device"}))
    srv.create(pod("none", gpus=1))
    for name in ("u", "b", "none"):
        srv.bind("default", name, node)
    for name, why in (("u", "is not on this node"), ("b", "must end with ';'"), ("none", "has no")):
        srv.wait_for(lambda n=name: phase(srv, n) == "Failed", what=f"{name} refused")
        msg = srv.list("events", "default", field_selector=f"involvedObject.name={name}")[0]["message"]
        assert why in msg


def test_hami_entries_follow_containers(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    ids = uuids(srv, node)
    srv.create(pod("two", gpus=1, containers=2, annotations={ALLOC: f"{ids[0]},NVIDIA,1000,10:;;"}))
    srv.bind("default", "two", node)
    srv.wait_for(lambda: phase(srv, "two") == "Running", what="run")


def test_ledger_records_a_whole_device_given_twice(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    dev = uuids(srv, node)[3]
    for name in ("a", "b"):
        srv.create(pod(name, gpus=1, annotations={ALLOC: f"{dev},NVIDIA,81559,100:;"}))
        srv.bind("default", name, node)
    srv.wait_for(lambda: phase(srv, "a") == phase(srv, "b") == "Running", what="both admitted")
    assert any(dev in v and "whole" in v for v in srv.stats.violations)


def test_ledger_accepts_fractions_that_fit_and_flags_overcommit(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    dev = uuids(srv, node)[0]
    for name, mem in (("h1", 40000), ("h2", 40000)):
        srv.create(pod(name, gpus=1, annotations={ALLOC: f"{dev},NVIDIA,{mem},50:;"}))
        srv.bind("default", name, node)
    srv.wait_for(lambda: phase(srv, "h1") == phase(srv, "h2") == "Running", what="both admitted")
    assert srv.stats.violations == []
    srv.create(pod("h3", gpus=1, annotations={ALLOC: f"{dev},NVIDIA,10000,0:;"}))
    srv.bind("default", "h3", node)
    srv.wait_for(lambda: phase(srv, "h3") == "Running", what="admitted")
    assert any("memory over-committed" in v for v in srv.stats.violations)


def test_finished_pod_frees_its_device(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    dev = uuids(srv, node)[0]
    srv.create(pod("first", gpus=1, annotations={ALLOC: f"{dev},NVIDIA,81559,100:;", RUN: "0"}))
    srv.bind("default", "first", node)
    srv.wait_for(lambda: phase(srv, "first") == "Succeeded", what="first done")
    srv.create(pod("second", gpus=1, annotations={ALLOC: f"{dev},NVIDIA,81559,100:;"}))
    srv.bind("default", "second", node)
    srv.wait_for(lambda: phase(srv, "second") == "Running", what="second runs")
    assert srv.stats.violations == []


def test_deleting_a_pod_whose_node_is_gone_removes_it(fake_server: FakeApiServer) -> None:
    srv = fake_server
    srv.create(pod("lost"))
    srv.bind("default", "lost", "no-such-node")
    srv.delete("pods", "default", "lost")
    srv.wait_for(lambda: not srv.list("pods", "default", field_selector="metadata.name=lost"), what="removal")


def test_a_deleted_pod_is_failed_143_before_it_goes(fake_server: FakeApiServer) -> None:
    """At the end of its grace the kubelet stops the containers and writes the terminal phase
    (Failed, exit 143), then the pod is deleted: a watcher sees the Failed pod first, as from
    the real kubelet and the node agent (issue 24: a deleted replica read as its workload's
    failure was found on the real server only)."""
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("leaving"))
    srv.bind("default", "leaving", node)
    srv.wait_for(lambda: phase(srv, "leaving") == "Running", what="run")
    seen: list[tuple[str, str, Any]] = []

    def on_event(rt: Any, etype: str, obj: dict[str, Any], _old: Any) -> None:
        if rt.key == "pods" and obj["metadata"]["name"] == "leaving":
            cs = (obj.get("status") or {}).get("containerStatuses") or [{}]
            code = ((cs[0].get("state") or {}).get("terminated") or {}).get("exitCode")
            seen.append((etype, str((obj.get("status") or {}).get("phase")), code))

    srv.store.listeners.append(on_event)
    srv.delete("pods", "default", "leaving", grace_period_seconds=1)
    srv.wait_for(
        lambda: not srv.list("pods", "default", field_selector="metadata.name=leaving"), what="removal"
    )
    assert ("MODIFIED", "Failed", 143) in seen, seen
    assert seen[-1][0] == "DELETED", seen
    assert seen.index(("MODIFIED", "Failed", 143)) < len(seen) - 1


def test_terminating_pod_on_a_not_ready_node_stays(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("stuck"))
    srv.bind("default", "stuck", node)
    srv.wait_for(lambda: phase(srv, "stuck") == "Running", what="run")
    srv.set_node_ready(node, False)
    srv.delete("pods", "default", "stuck", grace_period_seconds=1)
    srv.wait_for(srv.runtime.idle, what="settle")
    assert srv.get("pods", "default", "stuck")["metadata"]["deletionTimestamp"]
    srv.set_node_ready(node, True)
    srv.wait_for(
        lambda: not srv.list("pods", "default", field_selector="metadata.name=stuck"), what="removal"
    )


# ---------------------------------------------------------------- ending a pod on demand
def test_complete_ends_a_running_pod_as_a_real_kubelet_reports_it(fake_server: FakeApiServer) -> None:
    """kubelet_of(srv).complete: a pod without run-seconds (it would run forever) ends now,
    Succeeded, every container terminated with exit 0 / Completed, not Ready."""
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("c", containers=2))
    srv.bind("default", "c", node)
    srv.wait_for(lambda: phase(srv, "c") == "Running", what="run")
    assert kubelet_of(srv).complete("default", "c") is True
    p = srv.get("pods", "default", "c")
    assert p["status"]["phase"] == "Succeeded"
    states = [cs["state"]["terminated"] for cs in p["status"]["containerStatuses"]]
    assert [(s["exitCode"], s["reason"]) for s in states] == [(0, "Completed"), (0, "Completed")]
    assert {c["type"]: c["status"] for c in p["status"]["conditions"]}["Ready"] == "False"
    assert kubelet_of(srv).complete("default", "c") is False  # already ended: nothing changes


def test_a_pod_completed_on_demand_frees_its_device(fake_server: FakeApiServer) -> None:
    """The HAMi stand-in's ledger lets the device go: a second pod given the same whole device
    afterwards is no violation."""
    srv = fake_server
    node = srv.add_gpu_nodes(1)[0]
    dev = uuids(srv, node)[0]
    srv.create(pod("first", gpus=1, annotations={ALLOC: f"{dev},NVIDIA,81559,100:;"}))
    srv.bind("default", "first", node)
    srv.wait_for(lambda: phase(srv, "first") == "Running", what="first runs")
    assert kubelet_of(srv).complete("default", "first")
    srv.create(pod("second", gpus=1, annotations={ALLOC: f"{dev},NVIDIA,81559,100:;"}))
    srv.bind("default", "second", node)
    srv.wait_for(lambda: phase(srv, "second") == "Running", what="second runs")
    assert srv.stats.violations == []


def test_complete_with_an_exit_code_fails_the_pod(fake_server: FakeApiServer) -> None:
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("e"))
    srv.bind("default", "e", node)
    srv.wait_for(lambda: phase(srv, "e") == "Running", what="run")
    assert kubelet_of(srv).complete("default", "e", exit_code=3)
    term = srv.get("pods", "default", "e")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert phase(srv, "e") == "Failed" and (term["exitCode"], term["reason"]) == (3, "Error")


def test_complete_leaves_pods_that_are_not_running(fake_server: FakeApiServer) -> None:
    """An unbound (Pending) pod, a missing one and a terminating one are not ended; a bad exit
    code is refused by name."""
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    srv.create(pod("waiting"))
    k = kubelet_of(srv)
    assert k.complete("default", "waiting") is False and phase(srv, "waiting") == "Pending"
    assert k.complete("default", "no-such-pod") is False
    srv.create(pod("leaving"))
    srv.bind("default", "leaving", node)
    srv.wait_for(lambda: phase(srv, "leaving") == "Running", what="run")
    srv.set_node_ready(node, False)  # so the terminating pod stays to be looked at
    srv.delete("pods", "default", "leaving", grace_period_seconds=30)
    assert k.complete("default", "leaving") is False and phase(srv, "leaving") == "Running"
    with pytest.raises(ValueError, match="exit_code"):
        k.complete("default", "waiting", exit_code=256)


def test_completing_a_jobs_pods_completes_the_job(fake_server: FakeApiServer) -> None:
    """The Job controller counts pods ended on demand: an Indexed Job of two whose pods are
    completed gets Complete (and succeeded 2), which is what a Job's owner outcome reads."""
    srv = fake_server
    node = srv.add_gpu_nodes(1, hami=False)[0]
    ctr = {"name": "c", "image": "x"}
    tpl = {"spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [ctr]}}
    spec = {"parallelism": 2, "completions": 2, "completionMode": "Indexed", "template": tpl}
    md = {"name": "j", "namespace": "default"}
    srv.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": md, "spec": spec})

    def two_pods() -> list[str] | None:
        pods = srv.list("pods", "default", label_selector="job-name=j")
        return [p["metadata"]["name"] for p in pods] if len(pods) == 2 else None

    names = srv.wait_for(two_pods, what="the Job's pods")
    for name in names:
        srv.bind("default", name, node)
    srv.wait_for(lambda: all(phase(srv, n) == "Running" for n in names), what="both run")
    k = kubelet_of(srv)
    assert k.complete("default", names[0])
    srv.wait_for(srv.runtime.idle, what="settle")
    assert "Complete" not in _conditions(srv.get("jobs.batch", "default", "j"))

    def complete() -> dict[str, Any] | None:
        job = srv.get("jobs.batch", "default", "j")
        return job if _conditions(job).get("Complete") == "True" else None

    assert k.complete("default", names[1])
    job = srv.wait_for(complete, what="the Job Complete")
    assert job["status"]["succeeded"] == 2 and job["status"]["completedIndexes"] == "0,1"
    assert srv.runtime.errors == []


def test_kubelet_of_a_server_without_one_says_so() -> None:
    with pytest.raises(LookupError, match="kubelet=False"):
        kubelet_of(FakeApiServer(kubelet=False))


def _conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
