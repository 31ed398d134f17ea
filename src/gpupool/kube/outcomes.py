"""How a run ended, read from its pods and its owner's status (pure functions).

Why these reasons: the controller's retry policy (gpupool.service.failures) keys on them: the
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


__all__ = ["Outcome", "owner_outcome", "pod_failure", "pods_outcome"]
