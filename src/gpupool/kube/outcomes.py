"""How a run ended, read from its pods and its owner's status (pure functions).

Why these reasons: the controller's retry policy (gpupool.service.failures.policy) keys on them: the
job's own failures (``Error``, ``OOMKilled``) count against ``maxRetries``; faults of the
platform (``NodeFailure``, and ``BindFailed`` from the binder) are requeued at once. The node's
refusals (``UnexpectedAdmissionError`` from the kubelet's device admission, HAMi's
``bind-phase=failed`` from its device plugin) are named as they appear on the pod, so the
record says what an operator will find with ``kubectl describe``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.kube import annotations as kube_ann

#: pod status reasons of the node lifecycle controller and the kubelet for a lost node
NODE_LOST = frozenset({"NodeLost", "NodeShutdown", "Terminated", "Shutdown"})
#: the controllers that replace a pod deleted under them
REPLICATING = frozenset({"ReplicaSet", "StatefulSet"})


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished run: ``Succeeded`` or ``Failed`` with the exit code and reason when known."""

    outcome: str
    message: str
    exit_code: int | None = None
    reason: str = ""


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    st = obj.get("status")
    return st if isinstance(st, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata")
    return str(md.get("name", "")) if isinstance(md, Mapping) else ""


def pod_failure(pod: Mapping[str, Any]) -> Outcome | None:
    """Why a pod failed, or None while it has not."""
    md = pod.get("metadata")
    ann = (md.get("annotations") if isinstance(md, Mapping) else None) or {}
    name = _name(pod)
    if ann.get(kube_ann.HAMI_BIND_PHASE) == "failed":
        return Outcome(
            "Failed",
            f"pod {name}: HAMi's device plugin failed to allocate its devices",
            None,
            "BindPhaseFailed",
        )
    st = _status(pod)
    reason = str(st.get("reason") or "")
    if reason == "UnexpectedAdmissionError":
        msg = str(st.get("message") or "the kubelet refused the pod's devices")
        return Outcome("Failed", f"pod {name}: {msg}", None, "UnexpectedAdmissionError")
    if st.get("phase") != "Failed":
        return None
    if reason in NODE_LOST:
        return Outcome("Failed", f"pod {name}: its node was lost ({reason})", None, "NodeFailure")
    if isinstance(md, Mapping) and md.get("deletionTimestamp") and _replaced_by_controller(md):
        # a replica deleted under its ReplicaSet or StatefulSet (a scale-down, ``kubectl delete``):
        # the kubelet stops it and writes a terminal phase (Failed, 143) before it goes, and its
        # controller makes a replacement. Not the workload failing: on the real server this had
        # the run requeued and re-admitted, its other replicas stale and the replacement never
        # bound (issue 24)
        return None
    for cs in [*(st.get("initContainerStatuses") or ()), *(st.get("containerStatuses") or ())]:
        term = ((cs or {}).get("state") or {}).get("terminated") or {}
        code = term.get("exitCode")
        if code not in (None, 0):
            why = "OOMKilled" if term.get("reason") == "OOMKilled" or code == 137 else "Error"
            return Outcome(
                "Failed",
                f"pod {name}: container {cs.get('name', '')} exited with code {code}",
                int(code),
                why,
            )
    return Outcome(
        "Failed", f"pod {name} failed" + (f": {reason}" if reason else ""), None, reason or "Error"
    )


def _replaced_by_controller(md: Mapping[str, Any]) -> bool:
    """The pod's controller replaces it when it is deleted: a ReplicaSet's or StatefulSet's."""
    return any(
        isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") in REPLICATING
        for ref in md.get("ownerReferences") or ()
    )


def owner_outcome(obj: Mapping[str, Any]) -> Outcome | None:
    """A finished owner's outcome from its conditions (Job ``Complete``/``Failed``, PyTorchJob
    ``Succeeded``/``Failed``, JobSet ``Completed``/``Failed``), or None while it runs."""
    for c in _status(obj).get("conditions") or ():
        if not isinstance(c, Mapping) or str(c.get("status")) != "True":
            continue
        kind = str(c.get("type", ""))
        text = str(c.get("message") or c.get("reason") or kind)
        if kind in ("Complete", "Succeeded", "Completed"):
            return Outcome("Succeeded", f"{obj.get('kind', 'owner')} {_name(obj)} completed")
        if kind == "Failed":
            return Outcome(
                "Failed",
                f"{obj.get('kind', 'owner')} {_name(obj)} failed: {text}",
                None,
                str(c.get("reason") or "Error"),
            )
    return None


def pods_outcome(pods: Iterable[Mapping[str, Any]], expected: int) -> Outcome | None:
    """A run without an owner status (bare pods, serving kinds): failed when one pod failed,
    succeeded when all ``expected`` pods succeeded."""
    done = 0
    for p in pods:
        f = pod_failure(p)
        if f is not None:
            return f
        if _status(p).get("phase") == "Succeeded":
            done += 1
    if expected and done >= expected:
        return Outcome("Succeeded", f"all {done} pods succeeded")
    return None


# -- Kueue's waitForPodsReady ---------------------------------------------------------------
PODS_READY_TIMEOUT = "PodsReadyTimeout"


@dataclass(frozen=True, slots=True)
class PodsReadyPolicy:
    """Kueue's ``waitForPodsReady``: a gang whose pods are not all Ready within ``timeout_s`` of
    its admission is evicted and requeued (off when ``timeout_s`` is None, as in Kueue).

    Why: a gang admitted on devices but stuck (an image that never pulls, a pod the kubelet
    cannot start) holds GPUs while doing nothing, and a gang is useless until every pod runs.
    The requeue is a failure with reason ``PodsReadyTimeout`` under the workload's retry policy:
    its backoff and ``maxRetries`` (``gpupool.io/retry-backoff`` overrides) play the part of
    Kueue's ``requeuingStrategy`` (exponential backoff, then deactivation)."""

    timeout_s: float | None = None


def pods_ready_policy(doc: Any, where: str = "waitForPodsReady") -> PodsReadyPolicy:
    """Parse ``{enable: bool, timeout: duration}`` (Kueue's field names; a bare duration means
    enabled with that timeout; None means off). Raises ValueError naming the field at fault."""
    from gpupool.quantity import QuantityError, parse_duration

    if doc is None:
        return PodsReadyPolicy()
    if isinstance(doc, str | int | float) and not isinstance(doc, bool):
        doc = {"enable": True, "timeout": doc}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: expected a mapping {{enable, timeout}} or a duration, got {doc!r}")
    unknown = sorted(set(doc) - {"enable", "timeout"})
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field (known: enable, timeout)")
    enable = doc.get("enable", True)
    if not isinstance(enable, bool):
        raise ValueError(f"{where}.enable: expected true or false, got {enable!r}")
    if not enable:
        return PodsReadyPolicy()
    try:
        secs = parse_duration(doc.get("timeout", "5m"))  # Kueue's default timeout
    except QuantityError as exc:
        raise ValueError(f"{where}.timeout: {exc}") from exc
    if secs <= 0:
        raise ValueError(f"{where}.timeout: must be more than 0 seconds")
    return PodsReadyPolicy(secs)


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running with the Ready condition True, or already Succeeded (a pod that finished fast)."""
    st = _status(pod)
    if st.get("phase") == "Succeeded":
        return True
    if st.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or ())


def not_ready_reason(pods: Iterable[Mapping[str, Any]], want: int, timeout_s: float) -> str:
    """Why a gang missed its podsReady timeout: how many pods are not ready, and the first
    few by name with their phase and waiting reason (what ``kubectl get pods`` shows)."""
    pods = list(pods)
    late = [p for p in pods if not pod_ready(p)]
    shown = ", ".join(f"{_name(p)} {_phase_detail(p)}" for p in late[:3])
    missing = max(0, want - len(pods))
    parts = [f"{len(late) + missing} of {want} pods not ready {timeout_s:g}s after admission"]
    if shown:
        parts.append(shown + (" ..." if len(late) > 3 else ""))
    if missing:
        parts.append(f"{missing} not created")
    return "; ".join(parts)


def _phase_detail(pod: Mapping[str, Any]) -> str:
    st = _status(pod)
    phase = str(st.get("phase") or "Pending")
    for cs in st.get("containerStatuses") or ():
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"{phase} ({waiting['reason']})"
    return phase


__all__ = [
    "PODS_READY_TIMEOUT",
    "Outcome",
    "PodsReadyPolicy",
    "not_ready_reason",
    "owner_outcome",
    "pod_failure",
    "pod_ready",
    "pods_outcome",
    "pods_ready_policy",
]
