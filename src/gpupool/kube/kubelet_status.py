"""The pod status a kubelet writes, and the annotations that tell a simulated kubelet how long a
pod runs: shared by the fake API server's in-process kubelet (``gpupool.kube.fake.kubelet``)
and the node agent that plays the kubelet against any API server over HTTP
(``gpupool.kube.nodeagent``), so both simulate the same pod lives.

The convention (issue 24 keeps the fake's): ``fake.gpupool.io/run-seconds`` ends a running pod
after that long (without it the pod runs until deleted), ``fake.gpupool.io/exit-code`` is the
exit code it ends with (0: ``Succeeded``, else ``Failed``), ``fake.gpupool.io/start-seconds``
holds an admitted pod in ``ContainerCreating`` that long first.
"""

from __future__ import annotations

import time
from typing import Any

Obj = dict[str, Any]

RUN_SECONDS = "fake.gpupool.io/run-seconds"
EXIT_CODE = "fake.gpupool.io/exit-code"
START_SECONDS = "fake.gpupool.io/start-seconds"

#: the node and pod addresses a simulated node reports (no network exists behind them)
HOST_IP = "10.0.0.1"
POD_IP = "10.1.0.1"


def now_rfc3339() -> str:
    """Now, as the API's Time fields are written (seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def node_ready_condition(ready: bool, not_ready_message: str) -> Obj:
    """A node's Ready condition as a kubelet posts it (the fake's kubelet and the node agent
    both write it; ``not_ready_message`` says who set the node NotReady)."""
    now = now_rfc3339()
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "kubelet is posting ready status" if ready else not_ready_message,
    }


def pod_conditions(pod: Obj, ready: bool) -> list[Obj]:
    """Initialized/Ready/ContainersReady as a kubelet sets them; the conditions others own
    (``PodScheduled``, the scheduler's; ``DisruptionTarget``, a preempting scheduler's or the
    eviction API's) are kept, as a kubelet keeps them (issue 24: the node agent once dropped a
    DisruptionTarget written just before it started the pod)."""
    now = now_rfc3339()
    s = "True" if ready else "False"
    mine = ("Initialized", "Ready", "ContainersReady")
    kept = [c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") not in mine]
    return kept + [
        {"type": t, "status": v, "lastProbeTime": None, "lastTransitionTime": now}
        for t, v in (("Initialized", "True"), ("Ready", s), ("ContainersReady", s))
    ]


def _container(c: Obj, ready: bool, state: Obj) -> Obj:
    return {
        "name": c["name"],
        "image": c.get("image", ""),
        "ready": ready,
        "restartCount": 0,
        "imageID": "",
        "started": ready,
        "state": state,
    }


def creating_status(pod: Obj) -> Obj:
    """Admitted, devices allocated, containers not started (``ContainerCreating``)."""
    waiting = {"waiting": {"reason": "ContainerCreating"}}
    return {
        **(pod.get("status") or {}),
        "phase": "Pending",
        "startTime": now_rfc3339(),
        "hostIP": HOST_IP,
        "conditions": pod_conditions(pod, False),
        "containerStatuses": [_container(c, False, waiting) for c in pod["spec"].get("containers", [])],
    }


def running_status(pod: Obj) -> Obj:
    """Every container running and ready. ``startTime`` stays when the kubelet first took the
    pod (set while it was ``ContainerCreating``), as a kubelet keeps it."""
    now = now_rfc3339()
    status = pod.get("status") or {}
    running = {"running": {"startedAt": now}}
    return {
        **status,
        "phase": "Running",
        "startTime": status.get("startTime") or now,
        "hostIP": HOST_IP,
        "podIP": POD_IP,
        "conditions": pod_conditions(pod, True),
        "containerStatuses": [_container(c, True, running) for c in pod["spec"].get("containers", [])],
    }


def terminated_status(pod: Obj, code: int) -> Obj:
    """Every container exited with ``code``: ``Succeeded`` (reason ``Completed``) or
    ``Failed`` (reason ``Error``)."""
    now = now_rfc3339()
    reason = "Completed" if code == 0 else "Error"
    status = pod.get("status") or {}
    started = status.get("startTime", now)
    ended = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now}}
    return {
        **status,
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": pod_conditions(pod, False),
        "containerStatuses": [_container(c, False, ended) for c in pod["spec"].get("containers", [])],
    }


def failed_status(pod: Obj, message: str) -> Obj:
    """Refused at admission (a device plugin's ``Allocate`` failed)."""
    return {
        **(pod.get("status") or {}),
        "phase": "Failed",
        "reason": "UnexpectedAdmissionError",
        "message": f"Pod was rejected: Allocate failed due to {message}, which is unexpected",
        "startTime": now_rfc3339(),
    }


def exit_code(pod: Obj) -> int:
    """The exit code the pod's ``exit-code`` annotation asks for (0 when absent or not a number)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(EXIT_CODE, "0") or "0"
    try:
        return int(raw)
    except ValueError:
        return 0


def pod_event(pod: Obj, etype: str, reason: str, message: str) -> Obj:
    """The core/v1 Event a kubelet records about ``pod`` (Pulled, Started, Killing, ...): the
    fake's kubelet and the HTTP node agent write the same one."""
    md = pod["metadata"]
    now = now_rfc3339()
    return {
        "metadata": {"generateName": md["name"] + ".", "namespace": md["namespace"]},
        "involvedObject": {
            "kind": "Pod",
            "apiVersion": "v1",
            "namespace": md["namespace"],
            "name": md["name"],
            "uid": md["uid"],
        },
        "reason": reason,
        "message": message,
        "type": etype,
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
    }
