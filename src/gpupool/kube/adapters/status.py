"""Why a workload waits, where Kubernetes users look: pod conditions and Events on the owner.

Why here and not only in ``gpupool explain``: users of a cluster read ``kubectl describe pod``
and ``kubectl get events``; a pod that is Pending with no condition and no event is the most
reported complaint about batch schedulers (``../shared/docs/kubernetes.md`` section 6). So:

* each waiting pod of a Kubernetes workload carries ``PodScheduled=False``, reason
  ``Unschedulable``, message = gpupool's reason and the queue position (what ``explain`` says),
  patched on ``pods/status`` only when the message changes (a change of position alone at most
  every ``position_interval_s``: positions move with every admission);
* with each condition written, the pod gets a Warning Event ``FailedScheduling`` with the same
  message (``kubectl describe pod`` shows a pod's Events, not its condition messages);
* the owner gets Events as client-go's recorder makes them: one Event object per (object,
  reason), repeats counted with ``count``/``lastTimestamp`` on the same object, and at most one
  write per (object, reason) per ``interval_s`` (what changes meanwhile is written together);
* admissions and preemptions come from the controller's audit records (``workload.admit``
  with the pool and nodes, ``workload.preempt`` with the preemptor and the rule): the audit is
  the durable record of every decision, so no extra hook in the controller is needed and a
  restart does not invent or lose one.

The writer runs in its own thread, woken by the controller's ``on_cycle`` hook, so the cycle
never waits on the API server.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpupool.kube.adapters.source import Key, top_owner_key
from gpupool.kube.adapters.waiting import Waiting
from gpupool.kube.runtime.loop import LoopThread

log = logging.getLogger("gpupool.kube.status")

COMPONENT = "gpupool"
#: kind of the top owner by the source's informer names
KINDS = {
    "jobs": ("batch/v1", "Job"),
    "pytorchjobs": ("kubeflow.org/v1", "PyTorchJob"),
    "jobsets": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "deployments": ("apps/v1", "Deployment"),
    "statefulsets": ("apps/v1", "StatefulSet"),
    "pods": ("v1", "Pod"),
}


def _now_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


class Writes(Protocol):
    """The writes the status writer makes (``KubeWrites`` over KubeApi; a recorder in tests)."""

    def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...
    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...
    def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...


class KubeWrites:
    """``Writes`` over ``gpupool.kube.client.KubeApi``."""

    def __init__(self, api: Any) -> None:
        from gpupool.kube.client import RESOURCES, STRATEGIC_PATCH

        self.api = api
        self._events = RESOURCES["events"]
        self._pods = RESOURCES["pods"]
        self._strategic = STRATEGIC_PATCH

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.api.create(self._events, namespace, body)

    def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.api.patch(self._events, namespace, name, patch)

    def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.api.patch(self._pods, namespace, name, patch, sub="status", content_type=self._strategic)


@dataclass(slots=True)
class _Series:
    """One Event object: a (object, reason) pair and its repeats."""

    name: str
    namespace: str
    involved: dict[str, Any]
    type: str
    reason: str
    message: str
    first: float
    count: int = 1
    written_count: int = 0
    last_write: float = float("-inf")


class EventRecorder:
    """Events deduplicated by (object, reason) and rate-limited per (object, reason).

    ``event`` never raises and never blocks on the API beyond one request; ``flush`` writes the
    repeats that the rate limit held back (the status writer calls it every pass)."""

    def __init__(
        self,
        writes: Writes,
        *,
        interval_s: float = 30.0,
        instance: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writes = writes
        self.interval_s = interval_s
        self.instance = instance or f"gpupool-{secrets.token_hex(3)}"
        self.clock = clock
        self._mu = threading.Lock()
        self._series: dict[tuple[str, str], _Series] = {}
        self.stats = {"created": 0, "patched": 0, "held": 0, "errors": 0}

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an Event on ``obj`` (a Kubernetes object as a dict, with kind and apiVersion)."""
        involved = involved_object(obj)
        key = (str(involved.get("uid") or "") or "/".join(str(v) for v in involved.values()), reason)
        now = self.clock()
        with self._mu:
            s = self._series.get(key)
            if s is None:
                s = _Series(
                    self._event_name(involved),
                    str(involved.get("namespace") or "default"),
                    involved,
                    type_,
                    reason,
                    message,
                    now,
                    count=0,
                )
                self._series[key] = s
            s.count += 1
            s.message, s.type = message, type_
            due = now - s.last_write >= self.interval_s
            if due:
                s.last_write = now
        if due:
            self._write(s, now)
        else:
            self.stats["held"] += 1

    def flush(self) -> None:
        """Write the repeats the rate limit held back, once their interval has passed; forget
        series idle for an hour (the API server's own event TTL), so memory stays bounded."""
        now = self.clock()
        with self._mu:
            idle = [
                k for k, s in self._series.items() if s.count == s.written_count and now - s.last_write > 3600
            ]
            for k in idle:
                del self._series[k]
            due = [
                s
                for s in self._series.values()
                if s.count > s.written_count and now - s.last_write >= self.interval_s
            ]
            for s in due:
                s.last_write = now
        for s in due:
            self._write(s, now)

    def forget(self, uid: str) -> None:
        """Drop the series of a deleted object."""
        with self._mu:
            for key in [k for k in self._series if k[0] == uid]:
                del self._series[key]

    @staticmethod
    def _event_name(involved: Mapping[str, Any]) -> str:
        return f"{involved.get('name') or 'object'}.{secrets.token_hex(8)}"

    def _write(self, s: _Series, now: float) -> None:
        count = s.count
        try:
            if s.written_count == 0:
                self.writes.create_event(s.namespace, self._body(s, now, count))
                self.stats["created"] += 1
            else:
                patch = {"count": count, "lastTimestamp": _now_iso(now), "message": s.message, "type": s.type}
                self.writes.patch_event(s.namespace, s.name, patch)
                self.stats["patched"] += 1
        except Exception as exc:  # events are advisory: never fail the caller for one
            self.stats["errors"] += 1
            log.warning("event %s on %s/%s: %s", s.reason, s.namespace, s.involved.get("name"), exc)
            return
        s.written_count = count

    def _body(self, s: _Series, now: float, count: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": s.name, "namespace": s.namespace},
            "involvedObject": s.involved,
            "type": s.type,
            "reason": s.reason,
            "message": s.message,
            "count": count,
            "firstTimestamp": _now_iso(s.first),
            "lastTimestamp": _now_iso(now),
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
        }


def involved_object(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The ObjectReference of an object (list items may lack kind and apiVersion: Pod assumed)."""
    m = _meta(obj)
    out = {
        "apiVersion": str(obj.get("apiVersion") or "v1"),
        "kind": str(obj.get("kind") or "Pod"),
        "namespace": str(m.get("namespace") or "default"),
        "name": str(m.get("name") or ""),
    }
    if m.get("uid"):
        out["uid"] = str(m["uid"])
    return out


def waiting_reasons(ctl: Any, names: Iterable[str]) -> dict[str, Waiting]:
    """``controller.explain``'s code, reason and position for many pending workloads at once
    (one sort per queue instead of one per workload)."""
    from gpupool.engine.ordering import workload_order_key

    wanted = set(names)
    out: dict[str, Waiting] = {}
    with ctl.lock:
        queues = {q.queue for n, q in ctl.pending.items() if n in wanted}
        for queue in queues:
            same = sorted(
                (q for q in ctl.pending.values() if q.queue == queue),
                key=lambda q: workload_order_key(q.model),
            )
            for pos, q in enumerate(same, 1):
                if q.name not in wanted:
                    continue
                p = ctl.reasons.get(q.name)
                code, why = (
                    (str(p.code), p.reason)
                    if p is not None
                    else ("NotConsidered", "not yet considered by the scheduler")
                )
                out[q.name] = Waiting(code, why, queue, pos, len(same))
    return out


class WorkloadSource(Protocol):
    """What the writer reads of the workload source (gpupool.kube.adapters.source.KubeSource):
    the workloads it submitted, and how bare pods form groups."""

    @property
    def names(self) -> Mapping[Key, str]:
        """The gpupool workload of each source key."""
        ...

    def group_of(self, pod: Mapping[str, Any]) -> str:
        """A bare pod's group (its gang marker, else the pod alone: its own name)."""
        ...

    def members(self, namespace: str, group: str) -> list[str]:
        """Names of the bare pods of one group."""
        ...


class StatusWriter(LoopThread):
    """Writes why each waiting Kubernetes workload waits (pod conditions, owner Events), and
    Admitted / Preempted Events from the audit, in its own thread."""

    def __init__(
        self,
        ctl: Any,
        store: Any,
        source: WorkloadSource,
        informers: Mapping[str, Any],
        writes: Writes,
        recorder: EventRecorder,
        *,
        position_interval_s: float = 10.0,
        max_pod_writes: int = 500,
        clock: Callable[[], float] = time.time,
        gate: Callable[[], bool] = lambda: True,
        mirror: Any = None,
    ) -> None:
        from gpupool.kube.adapters.mirror import WorkloadMirror  # only where mirrors are written

        self.ctl = ctl
        #: the Workload status mirrors (``kubectl get workloads.gpupool.io``); over the real API
        #: by default, none with a test's recording ``Writes`` unless one is given
        self.mirror = (
            mirror
            if mirror is not None
            else (WorkloadMirror(writes.api) if isinstance(writes, KubeWrites) else None)
        )
        self.store = store
        self.source = source
        self.informers = informers
        self.writes = writes
        self.recorder = recorder
        self.position_interval_s = position_interval_s
        self.max_pod_writes = max_pod_writes
        self.clock = clock
        self.gate = gate
        #: per pod (ns, name): the condition message written and when
        self._written: dict[tuple[str, str], tuple[str, str, float]] = {}
        self._audit_seq = 0
        LoopThread.__init__(self)
        self.stats = {"passes": 0, "conditions": 0, "admitted": 0, "preempted": 0, "errors": 0}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Skip the audit history (its Events were written by an earlier run), then run."""
        try:
            self._audit_seq = int(self.store.audit_head()[0])
        except Exception:
            log.warning("status writer: cannot read the audit head; starting from the beginning")
        self._start_loop("gpupool-kube-status")

    def stop(self) -> None:
        self._stop_loop()

    def on_cycle(self, _stats: Any = None) -> None:
        """The controller's ``on_cycle`` hook: ask for a pass (never blocks the cycle)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(2.0)
            self._wake.clear()
            if not self.gate():
                continue  # a standby writes nothing on the objects
            try:
                self.step()
            except Exception:  # advisory status: keep going
                self.stats["errors"] += 1
                log.exception("status writer pass failed")
            self._stop.wait(1.0)  # at most one pass a second

    # ------------------------------------------------------------------ one pass
    def step(self) -> None:
        names = {name: key for key, name in list(self.source.names.items())}
        waiting = waiting_reasons(self.ctl, names) if names else {}
        if names:
            self._conditions(names, waiting)
            self._decisions(names)
        self._mirror(names, waiting)
        self.recorder.flush()
        self.stats["passes"] += 1

    def _mirror(self, names: Mapping[str, Key], waiting: Mapping[str, Waiting]) -> None:
        """The Workload mirrors of the source's workloads (one store query per 500 names)."""
        if self.mirror is None:
            return
        listed = list(names)
        records: list[Any] = []
        for i in range(0, len(listed), 500):
            records += self.store.list_workloads(names=listed[i : i + 500])
        ns_of = {n: key[1] for n, key in names.items()}
        self.mirror.sync(records, waiting, ns_of, lambda n: self.owner_object(names[n]))

    def _conditions(self, names: Mapping[str, Key], waiting: Mapping[str, Waiting]) -> None:
        pods = self._waiting_pods({names[n] for n in waiting}) if waiting else {}
        live = {
            (str(_meta(p).get("namespace") or ""), str(_meta(p).get("name") or ""))
            for ps in pods.values()
            for p in ps
        }
        self._written = {ref: v for ref, v in self._written.items() if ref in live}  # bound or gone: forget
        now = self.clock()
        budget = self.max_pod_writes
        for name, w in waiting.items():
            key = names[name]
            msg = w.message()
            owner = self.owner_object(key) if key[0] != "pods" else None  # a bare pod: its own events
            if owner is not None:
                self.recorder.event(owner, "Normal", "Pending", msg)
            for pod in pods.get(key, ()):
                if budget <= 0:
                    return
                if self._write_condition(pod, w, msg, now):
                    budget -= 1

    def _write_condition(self, pod: Mapping[str, Any], w: Waiting, msg: str, now: float) -> bool:
        """Patch PodScheduled=False when the message changed (a moved position at most every
        ``position_interval_s``). True when it wrote."""
        m = _meta(pod)
        ref = (str(m.get("namespace") or ""), str(m.get("name") or ""))
        last = self._written.get(ref)
        if last is not None:
            old_msg, old_reason, at = last
            if old_msg == msg or (old_reason == w.code + w.reason and now - at < self.position_interval_s):
                return False
        if last is None and _condition_message(pod) == msg:
            self._written[ref] = (msg, w.code + w.reason, now)
            return False
        cond = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": msg,
            "lastTransitionTime": _now_iso(now),
        }
        # the resourceVersion read is the precondition: a pod bound since (PodScheduled=True) is
        # not marked unschedulable by a stale pass; the conflict is retried on the next one
        patch: dict[str, Any] = {"status": {"conditions": [cond]}}
        if m.get("resourceVersion"):
            patch["metadata"] = {"resourceVersion": str(m["resourceVersion"])}
        try:
            self.writes.patch_pod_status(ref[0], ref[1], patch)
        except Exception as exc:
            self.stats["errors"] += 1
            log.debug("PodScheduled on %s/%s: %s", *ref, exc)
            return True
        self._written[ref] = (msg, w.code + w.reason, now)
        self.stats["conditions"] += 1
        # what `kubectl describe pod` shows (it lists the pod's Events, not condition messages);
        # FailedScheduling as kube-scheduler names it, so tools and habits find it
        self.recorder.event(
            {"apiVersion": "v1", "kind": "Pod", "metadata": m}, "Warning", "FailedScheduling", msg
        )
        return True

    def _waiting_pods(self, keys: set[Key]) -> dict[Key, list[dict[str, Any]]]:
        """Unbound pods of the given workloads, by the workload's source key."""
        pods = self.informers.get("pods")
        out: dict[Key, list[dict[str, Any]]] = {}
        if pods is None:
            return out
        jobs = self.informers.get("jobs")
        group_of = self.source.group_of
        for pod in pods.items():
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or _meta(pod).get("deletionTimestamp"):
                continue
            key = top_owner_key(pod, jobs, group_of)
            if key in keys:
                out.setdefault(key, []).append(pod)
        return out

    def owner_object(self, key: Key) -> dict[str, Any] | None:
        """The top owner as an object an Event can name (a pod group: its first pod)."""
        kind, ns, name = key
        name = name.partition("#")[0]  # an elastic extra ('web#extra-3'): its Deployment
        inf = self.informers.get(kind)
        if inf is None:
            return None
        if kind == "pods":
            members = sorted(self.source.members(ns, name))
            obj = next((p for p in (inf.get(ns, n) for n in members) if p is not None), None)
        else:
            obj = inf.get(ns, name)
        if obj is None:
            return None
        api_version, k = KINDS.get(kind, ("v1", kind))
        return {"apiVersion": api_version, "kind": k, "metadata": _meta(obj)}

    def _decisions(self, names: Mapping[str, Key]) -> None:
        """Admitted and Preempted Events from the audit records since the last pass."""
        recs = self.store.audit_records(after_seq=self._audit_seq, limit=5000)
        for r in recs:
            self._audit_seq = max(self._audit_seq, int(r.seq))
            key = names.get(r.name)
            if key is None or r.action not in ("workload.admit", "workload.preempt"):
                continue
            owner = self.owner_object(key)
            if owner is None:
                continue
            d = r.detail or {}
            if r.action == "workload.admit":
                nodes = ", ".join(d.get("nodes") or [])
                msg = f"admitted by gpupool to pool {d.get('pool')} on nodes {nodes}"
                self.recorder.event(owner, "Normal", "Admitted", msg)
                self.stats["admitted"] += 1
            else:
                msg = f"preempted by {d.get('preemptor')} ({d.get('rule')}: {d.get('reason')})"
                self.recorder.event(owner, "Warning", "Preempted", msg)
                self.stats["preempted"] += 1


def _condition_message(pod: Mapping[str, Any]) -> str:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or "")
    return ""


__all__ = [
    "EventRecorder",
    "KubeWrites",
    "StatusWriter",
    "Writes",
    "waiting_reasons",
]
