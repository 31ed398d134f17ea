"""Configuration kept in the cluster: ResourcePool and Queue objects (``gpupool.io/v1alpha1``)
and annotated ``scheduling.k8s.io/v1`` PriorityClasses, applied as if posted to ``/v1/apply``.

Why through the API's own apply path (``POST /v1/apply``'s handler, one object per call): a pool
applied with kubectl must meet exactly the validation, authorization, revision history and
audit a ``gpupool apply`` meets, and one bad object must never stop the others (a set is
all-or-nothing, so each object is its own set). A refused object gets a Warning Event and an
``Accepted=False`` status condition with the located errors; an accepted one ``Accepted=True``.

When it is on: always on Kubernetes, for the kinds the cluster serves (the CRDs installed by the
chart or the plain manifests); a cluster without them leaves the file configuration alone.
Objects from the cluster carry ``gpupool.io/origin: cluster``; deleting the Kubernetes object
deletes only such an object (a pool seeded from files is never deleted by the cluster).

Which PriorityClasses: only those annotated ``gpupool.io/preemptible`` (the chart's classes are):
a cluster's own classes (``system-node-critical`` ...) are not gpupool's to import. The
annotation ``gpupool.io/preemption-wait`` carries the class's ``spec.preemptionWait``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.kube.client import ApiError as KubeApiError
from gpupool.kube.client import Resource
from gpupool.kube.runtime.informer import Informer
from gpupool.kube.runtime.loop import LoopThread

log = logging.getLogger("gpupool.kube.config")

POOLS = Resource("gpupool.io", "v1alpha1", "resourcepools", "ResourcePool", False)
QUEUES = Resource("gpupool.io", "v1alpha1", "queues", "Queue", False)
PRIORITY_CLASSES = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False)
KINDS = {"ResourcePool": POOLS, "Queue": QUEUES, "PriorityClass": PRIORITY_CLASSES}
ORIGIN = "gpupool.io/origin"
PREEMPTIBLE = "gpupool.io/preemptible"
#: a PriorityClass's ``spec.preemptionWait`` (docs/engine.md, "Preemption cost"): "0s" evicts at once
PREEMPTION_WAIT = "gpupool.io/preemption-wait"
#: the reason of the Warning Event on a refused configuration object
REFUSED = "GpupoolConfigRefused"
PRINCIPAL = "system:kubernetes-config"


def to_manifest(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The gpupool manifest of a cluster object; None for a PriorityClass not meant for gpupool."""
    kind = str(obj.get("kind") or "")
    md = obj.get("metadata") or {}
    meta = {"name": str(md.get("name") or ""), "annotations": {ORIGIN: "cluster"}}
    if kind == "PriorityClass":
        ann = md.get("annotations") or {}
        if PREEMPTIBLE not in ann:
            return None
        spec: dict[str, Any] = {
            "value": obj.get("value", 0),
            "preemptible": str(ann[PREEMPTIBLE]).strip().lower() != "false",
        }
        if obj.get("description"):
            spec["description"] = str(obj["description"])
        if PREEMPTION_WAIT in ann:  # validated by the apply path, like a file's value
            spec["preemptionWait"] = str(ann[PREEMPTION_WAIT])
    else:
        spec = dict(obj.get("spec") or {})
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}


def _located(exc: Exception) -> str:
    """The located errors of a refused apply, one ``field: problem`` per line (API and
    manifest errors carry them; anything else is its message)."""
    errors = getattr(exc, "errors", None)
    if isinstance(errors, list) and errors:
        lines = [f"{e['field']}: {e['problem']}" if isinstance(e, Mapping) else str(e) for e in errors]
        return "; ".join(lines)
    return str(getattr(exc, "message", "") or exc)


class ConfigSource(LoopThread):
    """Watches the configuration kinds; applies each changed object alone (see the module)."""

    def __init__(
        self,
        api: Any,
        events: Any,
        *,
        informers: Mapping[str, Any] | None = None,
        gate: Callable[[], bool] = lambda: True,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.api = api
        #: called after an object changed gpupool's configuration (the workload source looks
        #: again at what it refused: a Job may name a queue applied with it)
        self.on_change = on_change
        self.events = events
        self.gate = gate
        self.informers = (
            dict(informers)
            if informers is not None
            else {kind: Informer(api, res) for kind, res in KINDS.items()}
        )
        self._dirty: dict[tuple[str, str], Mapping[str, Any] | None] = {}
        self._mu = threading.Lock()
        LoopThread.__init__(self)
        self._applied: dict[tuple[str, str], str] = {}  # (kind, name) -> resourceVersion handled
        #: objects refused at their last version: each kind has its own watch, so a queue can
        #: arrive a pass before the pool it names; they are tried again after any change
        self._refused: set[tuple[str, str]] = set()
        self.svc: Any = None
        self.stats = {"applied": 0, "unchanged": 0, "refused": 0, "deleted": 0, "errors": 0}
        for kind, inf in self.informers.items():
            inf.add_listener(self._listener(kind))

    def _listener(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        def on_event(type_: str, obj: dict[str, Any]) -> None:
            self._mark(kind, type_, obj)

        return on_event

    def _mark(self, kind: str, type_: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        with self._mu:
            self._dirty[(kind, name)] = obj if type_ == "DELETED" else None
        self._wake.set()

    # ------------------------------------------------------------------ lifecycle
    def start(self, svc: Any) -> None:
        """Apply through ``svc`` from now on (the informers start here if they are our own)."""
        self.svc = svc
        for inf in self.informers.values():
            if isinstance(inf, Informer):
                inf.start()
        self._start_loop("gpupool-kube-config")

    def stop(self) -> None:
        self._stop_loop()
        for inf in self.informers.values():
            if isinstance(inf, Informer):
                inf.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if not self.gate():
                continue  # a standby applies nothing; the leader does
            try:
                self.process()
            except Exception:  # one bad pass never stops the source
                self.stats["errors"] += 1
                log.exception("kubernetes configuration pass failed")

    # ------------------------------------------------------------------ one pass
    def process(self) -> int:
        """Handle every dirty object: pools first, then queues and classes (a queue may name a
        pool of the same `kubectl apply`). Returns how many were handled."""
        with self._mu:
            todo, self._dirty = self._dirty, {}
        order = {"ResourcePool": 0, "PriorityClass": 1, "Queue": 2}
        for (kind, name), gone in sorted(todo.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
            obj = self.informers[kind].get("", name)
            if obj is None:
                self._deleted(kind, name, gone)
            else:
                self._apply(kind, obj)
        return len(todo)

    def _apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        from gpupool.auth import Principal, Role
        from gpupool.service.usecases.apply import apply_set

        md = obj.get("metadata") or {}
        key, rv = (kind, str(md.get("name") or "")), str(md.get("resourceVersion") or "")
        if rv and self._applied.get(key) == rv:
            return  # our own status write came back: nothing new to apply
        manifest = to_manifest(obj)
        if manifest is None:
            return
        try:
            who = Principal(PRINCIPAL, Role.PLATFORM_ADMIN)
            [res] = apply_set(self.svc, who, [manifest], "kubectl apply")
        except Exception as exc:  # refused: the others go on; the object says why
            self.stats["refused"] += 1
            why = _located(exc)
            self.events.event(obj, "Warning", REFUSED, f"gpupool refused {kind} {key[1]}: {why}")
            self._status(kind, obj, False, "Invalid", why)
            self._refused.add(key)
            return
        self._refused.discard(key)
        self.stats["applied" if res["result"] != "unchanged" else "unchanged"] += 1
        if res["result"] != "unchanged":
            self._retry_refused()
            self.on_change()
        self._status(kind, obj, True, "Applied", f"{res['result']} in gpupool's configuration")

    def _retry_refused(self) -> None:
        """Mark the refused objects dirty again: the change may be what they lacked. It ends:
        a retry refused again changes nothing, so it starts no further retry."""
        with self._mu:
            for key in self._refused:
                self._applied.pop(key, None)
                self._dirty.setdefault(key, None)
            self._refused.clear()
        self._wake.set()

    def _status(self, kind: str, obj: Mapping[str, Any], ok: bool, reason: str, message: str) -> None:
        """The Accepted condition on the object's status (gpupool's CRDs; a PriorityClass has none)."""
        md = obj.get("metadata") or {}
        key = (kind, str(md.get("name") or ""))
        if kind == "PriorityClass":
            self._applied[key] = str(md.get("resourceVersion") or "")
            return
        cond = {
            "type": "Accepted",
            "status": "True" if ok else "False",
            "reason": reason,
            "message": message[:4000],
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        status = {"conditions": [cond], "observedGeneration": md.get("generation", 0)}
        try:
            got = self.api.patch(KINDS[kind], None, key[1], {"status": status}, sub="status")
            self._applied[key] = str((got.get("metadata") or {}).get("resourceVersion") or "")
        except KubeApiError as exc:
            self._applied[key] = str(md.get("resourceVersion") or "")
            log.debug("status of %s %s: %s", kind, key[1], exc)

    def _deleted(self, kind: str, name: str, gone: Mapping[str, Any] | None) -> None:
        """The Kubernetes object is gone: delete gpupool's copy if it came from the cluster."""
        from gpupool.auth import Principal, Role
        from gpupool.service.usecases.delete_config import delete_object
        from gpupool.store import NotFound

        self._applied.pop((kind, name), None)
        self._refused.discard((kind, name))
        try:
            rec = self.svc.store.get_object(kind, name)
        except NotFound:
            return
        if (rec.annotations or {}).get(ORIGIN) != "cluster":
            return  # from files or the API: the cluster does not own it
        try:
            delete_object(self.svc, Principal(PRINCIPAL, Role.PLATFORM_ADMIN), kind, name)
            self.stats["deleted"] += 1
        except Exception as exc:  # in use: it stays, and says so where the user looks
            self.stats["refused"] += 1
            if gone is not None:
                self.events.event(gone, "Warning", REFUSED, f"gpupool kept {kind} {name}: {_located(exc)}")


__all__ = ["KINDS", "ORIGIN", "ConfigSource", "to_manifest"]
