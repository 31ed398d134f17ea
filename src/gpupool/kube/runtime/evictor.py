"""Acting on owners and pods: admit (unsuspend + record the placement), preempt (re-suspend, or
``DisruptionTarget`` and delete/evict), and Events on the owner.

Why the placement is recorded on the owner at admission (annotation ``gpupool.io/admission``,
in the same merge patch that unsuspends it): the controller marks a workload Running as soon as
``start`` returns, before every pod is bound. If the process dies in the middle of a gang, the
next one must finish binding the rest exactly as decided; the cluster keeps that decision
(bare pods: on the gang's first pod), so a restart resumes it without the store's help, and
nothing is bound twice because bound pods are skipped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from gpupool.kube.client import BY_KIND, RESOURCES, STRATEGIC_PATCH, ApiError, KubeApi
from gpupool.kube.runtime.informer import object_key

log = logging.getLogger("gpupool.kube.evictor")

ADMISSION = "gpupool.io/admission"
#: where each suspendable kind keeps its suspend flag
SUSPEND_PATH: dict[str, tuple[str, ...]] = {
    "Job": ("spec", "suspend"),
    "JobSet": ("spec", "suspend"),
    "PyTorchJob": ("spec", "runPolicy", "suspend"),
}
#: serving kinds whose pods leave through the Eviction API (it honours PodDisruptionBudgets)
EVICTED_KINDS = frozenset({"Deployment", "StatefulSet"})


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _nested(path: Sequence[str], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for key in reversed(path[:-1]):
        out = {key: out}
    return out


def read_admission(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The admission recorded on an owner (``workload``, ``placement``, ``startedAt``), or None."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    text = ann.get(ADMISSION)
    if not text:
        return None
    try:
        rec = json.loads(text)
    except ValueError:
        return None
    ok = (
        isinstance(rec, dict)
        and isinstance(rec.get("workload"), str)
        and isinstance(rec.get("placement"), dict)
    )
    return rec if ok else None


def retrying(call: Callable[[], Any], tries: int = 6, pause_s: float = 0.02) -> Any:
    """``call()``, again on a conflict, a server error or a lost connection: these writes carry
    no resourceVersion precondition, so repeating one is safe, and an admission or a
    preemption must not fail on one transient answer."""
    for attempt in range(tries):
        try:
            return call()
        except ApiError as exc:
            if exc.code not in (0, 409, 429, 500, 502, 503, 504) or attempt == tries - 1:
                raise
            time.sleep(pause_s * 2**attempt)
    return None


class Evictor:
    """The owner- and pod-level writes of admission and preemption."""

    def __init__(self, api: KubeApi, component: str = "gpupool") -> None:
        self.api = api
        self.component = component

    def patch_owner(self, obj: Mapping[str, Any], patch: dict[str, Any]) -> None:
        """One merge patch of the owner object (Job, PyTorchJob, ...), retried on conflicts."""
        res = BY_KIND[str(obj.get("kind"))]
        ns, name = object_key(obj)
        retrying(lambda: self.api.patch(res, ns or None, name, patch))

    def admit(self, obj: Mapping[str, Any], record: Mapping[str, Any]) -> None:
        """Record the admission on the owner and unsuspend it (one request)."""
        patch: dict[str, Any] = {
            "metadata": {"annotations": {ADMISSION: json.dumps(record, separators=(",", ":"))}}
        }
        path = SUSPEND_PATH.get(str(obj.get("kind")))
        if path is not None:
            patch.update(_nested(path, False))
        self.patch_owner(obj, patch)

    def release(self, obj: Mapping[str, Any], suspend: bool) -> None:
        """Forget the admission on the owner; re-suspend it when ``suspend`` and the kind can."""
        patch: dict[str, Any] = {"metadata": {"annotations": {ADMISSION: None}}}
        path = SUSPEND_PATH.get(str(obj.get("kind")))
        if suspend and path is not None:
            patch.update(_nested(path, True))
        try:
            self.patch_owner(obj, patch)
        except ApiError as exc:
            if exc.code != 404:
                raise

    def disrupt(self, pods: Sequence[Mapping[str, Any]], owner_kind: str, message: str) -> int:
        """Mark each live pod ``DisruptionTarget`` (reason ``PreemptionByScheduler``), then delete
        it with its grace period (the Eviction API for serving kinds); returns how many."""
        n = 0
        for pod in pods:
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            try:
                self._disrupt_one(pod, owner_kind, message)
                n += 1
            except ApiError as exc:
                if exc.code != 404:  # gone already: what we wanted
                    raise
        return n

    def _disrupt_one(self, pod: Mapping[str, Any], owner_kind: str, message: str) -> None:
        ns, name = object_key(pod)
        pods = RESOURCES["pods"]
        cond = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": message,
            "lastTransitionTime": _rfc3339(time.time()),
        }
        patch = {"status": {"conditions": [cond]}}
        retrying(lambda: self.api.patch(pods, ns, name, patch, sub="status", content_type=STRATEGIC_PATCH))
        if owner_kind in EVICTED_KINDS:
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": ns},
            }
            retrying(lambda: self.api.post_sub(pods, ns, name, "eviction", body))
        else:
            retrying(lambda: self.api.delete(pods, ns, name))

    def delete_pods(self, pods: Sequence[Mapping[str, Any]]) -> None:
        for pod in pods:
            ns, name = object_key(pod)
            try:
                retrying(lambda: self.api.delete(RESOURCES["pods"], ns, name))  # noqa: B023
            except ApiError as exc:
                if exc.code != 404:
                    raise

    def event(self, obj: Mapping[str, Any], reason: str, message: str, kind: str = "Normal") -> None:
        """An Event on ``obj`` (best effort: an Event lost is a log line, never a failed action)."""
        md = obj.get("metadata") or {}
        ns = str(md.get("namespace") or "default")
        now = _rfc3339(time.time())
        ev = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{md.get('name', 'gpupool')}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", ""),
                "name": md.get("name", ""),
                "namespace": ns,
                "uid": md.get("uid", ""),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.create(RESOURCES["events"], ns, ev)
        except ApiError as exc:
            log.warning("event %s on %s/%s not written: %s", reason, ns, md.get("name"), exc)


__all__ = ["ADMISSION", "EVICTED_KINDS", "SUSPEND_PATH", "Evictor", "read_admission"]
