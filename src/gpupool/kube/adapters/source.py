"""Workloads created with kubectl become gpupool submissions; deleted ones are cancelled.

Why through the API's own submission path (``usecases.submit.prepare`` and the batcher, in
``wiring.ServiceSubmitter``): a Job created with kubectl must meet exactly the validation,
admission policy and approval rules a ``gpupool submit`` meets, and land in the same store with
the same audit record. The source
submits as one system principal (``system:kubernetes``, a platform admin: it may submit to any
queue); which namespace may use which queue is the source's own policy (``SourcePolicy``).

How it stays cheap and safe under a watch storm:

* informer listeners only mark the object's key dirty; one worker thread translates and
  submits what is dirty, in batches (one group commit for many objects);
* an object is submitted once per distinct manifest: a Job's status updates (MODIFIED events
  that do not change what it asks for) cost one translation and no store write;
* a refused object (unknown queue, does not fit, validation error) gets a Warning Event with
  the located error and is remembered, so it is not refused again until it changes; an
  exception never escapes the worker and never blocks the other objects;
* bare pods (``schedulerName: gpupool``, no controller owner) are grouped by their gang marker
  (``workloads.pod_group_key``) and submitted once the group has been quiet for ``settle_s``,
  so a group created pod by pod is one workload, not one per pod.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpupool.kube import schedulers
from gpupool.kube import workloads as kw
from gpupool.kube.adapters import elastic
from gpupool.kube.adapters.source_policy import SourcePolicy, parse_namespace_queues, policy_from_options
from gpupool.kube.runtime.loop import LoopThread
from gpupool.kube.source_keys import OWNER_KINDS, owned_by_a_top_kind, top_owner_key
from gpupool.kube.workloads import KubeWorkload, KubeWorkloadError

log = logging.getLogger("gpupool.kube.source")
__all__ = [
    "OWNER_KINDS",
    "KubeSource",
    "Outcome",
    "SourcePolicy",
    "parse_namespace_queues",
    "policy_from_options",
    "top_owner_key",
]

#: the principal every Kubernetes-created workload is submitted as (its owner in the store)
SYSTEM_NAME = "system:kubernetes"
#: informer kinds whose objects are top owners (one workload each)
TOP_KINDS = ("jobs", "pytorchjobs", "jobsets", "deployments", "statefulsets")
#: the reason of the Warning Event on a refused object
REFUSED = "GpupoolRefused"
#: the reason of the Warning Event on an object gpupool should manage but cannot read
INVALID = "GpupoolInvalid"

Key = tuple[str, str, str]  # (informer kind, namespace, name or pod group)
#: informer kinds whose objects may be elastic (gpupool.io/min-replicas), and the separator of
#: an extra's key (``web#extra-3``: no Kubernetes name holds a '#', so it never collides)
ELASTIC_INFORMERS = ("deployments", "statefulsets")
EXTRA_KEY = "#extra-"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one submission: created, unchanged, or refused with the located errors."""

    name: str
    result: str
    message: str = ""
    errors: tuple[tuple[str, str], ...] = ()

    @property
    def refused(self) -> bool:
        return self.result not in ("created", "unchanged")

    def text(self) -> str:
        where = "; ".join(f"{f}: {p}" for f, p in self.errors)
        return f"{self.message} ({where})" if where and where not in self.message else self.message


class Submitter(Protocol):
    """Where the source sends work (the service in production, a fake in tests)."""

    def submit_many(self, manifests: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        """Submit each manifest; one Outcome per manifest, in order; never raises for one."""

    def cancel(self, name: str) -> bool:
        """Cancel a workload if it exists and has not finished; True when it was cancelled."""

    def active(self) -> set[str]:
        """Names of the unfinished workloads this source submitted (to reconcile after a restart)."""


class EventSink(Protocol):
    """Events on the Kubernetes object (``gpupool.kube.adapters.status.EventRecorder``)."""

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...


class InformerLike(Protocol):
    def get(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def items(self) -> list[dict[str, Any]]: ...
    def add_listener(self, fn: Callable[[str, dict[str, Any]], None]) -> None: ...


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def is_bare_managed(pod: Mapping[str, Any], scheduler_name: str = "gpupool") -> bool:
    """A pod gpupool schedules that no controller owns (it is its own workload or gang member)."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping) or spec.get("schedulerName") != scheduler_name:
        return False
    owners = _meta(pod).get("ownerReferences") or []
    return not any(isinstance(o, Mapping) and o.get("controller") for o in owners)


def digest(manifest: Mapping[str, Any]) -> str:
    """A manifest's identity for 'unchanged' (key order does not matter)."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode()).hexdigest()[:24]


class _Unready(Exception):
    """The translation failed on an object in a way it never should (a bug, not a bad object):
    the object is held back and retried, and the others go on."""


class KubeSource(LoopThread):
    """Watches the top-owner kinds and bare pods; submits, refuses with an Event, cancels."""

    def __init__(
        self,
        informers: Mapping[str, InformerLike],
        submitter: Submitter,
        events: EventSink,
        policy: SourcePolicy | None = None,
        *,
        settle_s: float = 0.2,
        batch: int = 500,
        gate: Callable[[], bool] = lambda: True,
    ) -> None:
        self.informers = informers
        self.submitter = submitter
        self.events = events
        self.policy = policy or SourcePolicy()
        self.settle_s = settle_s
        self.batch = batch
        #: submit only while this replica leads (a standby keeps its caches and waits)
        self.gate = gate
        self._mu = threading.Lock()
        self._dirty: dict[Key, float] = {}  # key -> when it last changed (monotonic)
        self._gone: dict[Key, dict[str, Any]] = {}  # the last object seen before DELETED
        self._groups: dict[tuple[str, str], set[str]] = {}  # (ns, group) -> pod names
        LoopThread.__init__(self)
        #: per key: the digest of the manifest last submitted or refused, and the workload name
        self._seen: dict[Key, str] = {}
        self.names: dict[Key, str] = {}
        #: objects whose last attempt failed for gpupool's own reason (no reconcile meanwhile)
        self._failing: set[Key] = set()
        self.stats: dict[str, int] = dict.fromkeys(
            ("submitted", "unchanged", "refused", "invalid", "cancelled", "skipped", "errors"), 0
        )
        self.last_error = ""
        #: every cached object read (and submitted or refused) since this replica began leading
        self.caught_up = False

    # ------------------------------------------------------------------ listening
    def attach(self) -> None:
        """Listen to the informers (before they start, so no event is missed)."""
        for kind in TOP_KINDS:
            inf = self.informers.get(kind)
            if inf is not None:
                inf.add_listener(self._listener(kind))
        pods = self.informers.get("pods")
        if pods is not None:
            pods.add_listener(self._on_pod)

    def _listener(self, kind: str) -> Callable[[str, dict[str, Any]], None]:
        def on_event(type_: str, obj: dict[str, Any]) -> None:
            m = _meta(obj)
            key = (kind, str(m.get("namespace") or ""), str(m.get("name") or ""))
            self._mark(key, obj if type_ == "DELETED" else None)

        return on_event

    def _on_pod(self, type_: str, pod: dict[str, Any]) -> None:
        if not is_bare_managed(pod, self.policy.defaults.scheduler_name):
            return
        m = _meta(pod)
        ns, name = str(m.get("namespace") or ""), str(m.get("name") or "")
        group = self.group_of(pod)
        with self._mu:
            members = self._groups.setdefault((ns, group), set())
            if type_ == "DELETED":
                members.discard(name)
            else:
                members.add(name)
        self._mark(("pods", ns, group), pod if type_ == "DELETED" else None)

    @staticmethod
    def group_of(pod: Mapping[str, Any]) -> str:
        """The bare pod's group: its gang marker, else the pod alone (its own name)."""
        name = str(_meta(pod).get("name") or "")
        try:
            return kw.pod_group_key(pod) or name
        except Exception:  # a pod whose markers cannot be read is its own group
            return name

    def members(self, namespace: str, group: str) -> list[str]:
        """Names of the bare pods of one group, as the source last saw them."""
        with self._mu:
            return sorted(self._groups.get((namespace, group), ()))

    def _mark(self, key: Key, deleted: dict[str, Any] | None) -> None:
        with self._mu:
            self._dirty[key] = time.monotonic()
            if deleted is not None:
                self._gone[key] = deleted
            else:
                self._gone.pop(key, None)
        self._wake.set()

    # ------------------------------------------------------------------ the worker
    def start(self) -> None:
        self._start_loop("gpupool-kube-source")

    def stop(self) -> None:
        self._stop_loop()

    def resync(self) -> None:
        """Mark every cached object dirty (on becoming the leader: a standby submits nothing)."""
        for kind in TOP_KINDS:
            inf = self.informers.get(kind)
            for obj in inf.items() if inf is not None else ():
                m = _meta(obj)
                self._mark((kind, str(m.get("namespace") or ""), str(m.get("name") or "")), None)
        pods = self.informers.get("pods")
        for pod in pods.items() if pods is not None else ():
            self._on_pod("ADDED", pod)

    def retry_refused(self) -> None:
        """Look again at the objects the service refused (the configuration changed: the queue a
        Job names may exist now, as when a queue and its Job are applied together)."""
        with self._mu:
            keys = [k for k, mark in self._seen.items() if mark.startswith("refused:")]
        for key in keys:
            self._seen.pop(key, None)
            self._mark(key, None)

    def _run(self) -> None:
        # the first pass (everything cached is dirty) is followed by a reconcile, as is every
        # takeover from another replica
        leading, reconcile_due, t0 = True, True, time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if not self.gate():
                leading = self.caught_up = False
                continue
            if not leading:  # took over from another replica: everything is ours to check
                leading, reconcile_due, t0 = True, True, time.monotonic()
                self.caught_up = False
                self.resync()
            try:
                while self.process() and not self._stop.is_set():
                    pass
                n = self.reconcile() if reconcile_due and not self._dirty else None
                if n is not None:
                    reconcile_due, self.caught_up = False, True
                    done = ", ".join(f"{k} {v}" for k, v in self.stats.items() if v)
                    log.warning(
                        "kubernetes source: every object read in %.2f s (%s); %d workloads of deleted objects cancelled",
                        time.monotonic() - t0,
                        done,
                        n,
                    )
            except Exception as exc:  # the worker must survive anything one pass throws
                self.stats["errors"] += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("kubernetes source pass failed")

    def process(self, now: float | None = None) -> int:
        """One pass over what is dirty (and settled): returns how many keys it handled."""
        keys = self._take(time.monotonic() if now is None else now)
        if not keys:
            return 0
        todo: list[tuple[Key, KubeWorkload, dict[str, Any], str]] = []
        for key, gone in keys:
            if self._absent(key):
                self._deleted(key, gone)
                continue
            objs = self._objects(key)
            ident = self._identity(objs) + self._scale(key, objs)
            if not objs or self._seen.get(key) == f"ok:{ident}":
                continue  # accepted already: workloads are immutable, status updates change nothing
            try:
                elastic = self._elastic(key, objs[0])
                got = self._translate(key, objs) if elastic is None else None
            except _Unready as exc:
                self._unready(key, exc)
                continue
            if got is not None:
                todo.append((key, got, objs[0], ident))
            todo += [(k, w, objs[0], ident) for k, w in elastic or ()]
        for i in range(0, len(todo), self.batch):
            if self._stop.is_set():
                break  # shutting down: the next run reads these objects again
            try:
                self._submit(todo[i : i + self.batch])
            except Exception as exc:  # the service failed the batch (store down): retry them later
                self._failed([k for k, *_ in todo[i:]], exc)
                break
        return len(keys)

    def _failed(self, keys: Sequence[Key], exc: Exception) -> None:
        self.stats["errors"] += 1
        self.last_error = f"submitting: {type(exc).__name__}: {exc}"
        log.warning("kubernetes source: %s; %d objects retried in 1 s", self.last_error, len(keys))
        self._failing.update(keys)
        self._stop.wait(1.0)
        for key in keys:
            self._mark(key, None)

    def _unready(self, key: Key, exc: _Unready) -> None:
        self.stats["errors"] += 1
        self._failing.add(key)
        if self.last_error != str(exc):
            log.error("kubernetes source: %s; %s/%s/%s not submitted", exc, *key)
        self.last_error = str(exc)

    def _take(self, now: float) -> list[tuple[Key, dict[str, Any] | None]]:
        """Dirty keys ready to handle: top owners at once, pod groups once quiet for settle_s."""
        out: list[tuple[Key, dict[str, Any] | None]] = []
        with self._mu:
            for key, at in list(self._dirty.items()):
                if key[0] == "pods" and now - at < self.settle_s:
                    continue
                del self._dirty[key]
                out.append((key, self._gone.pop(key, None)))
            waiting = bool(self._dirty)
        if waiting and not out:
            time.sleep(min(self.settle_s, 0.05))  # a pod group settling: look again shortly
            self._wake.set()
        return out

    def reconcile(self) -> int | None:
        """After a restart (caches synced, one pass done): cancel the workloads this source
        submitted whose object was deleted while gpupool was down. Skipped while any object
        could not be translated or submitted (its workload must not be cancelled for gpupool's own
        fault): None then."""
        if self._failing or self._dirty:
            return None
        present = set(self.names.values())
        gone = sorted(self.submitter.active() - present)
        n = sum(1 for name in gone if self.submitter.cancel(name))
        self.stats["cancelled"] += n
        return n

    # ------------------------------------------------------------------ one key
    def _absent(self, key: Key) -> bool:
        kind, ns, name = key
        if kind == "pods":
            with self._mu:
                return not self._groups.get((ns, name))
        inf = self.informers.get(kind)
        return inf is None or inf.get(ns, name) is None

    def _objects(self, key: Key) -> list[dict[str, Any]]:
        kind, ns, name = key
        inf = self.informers[kind]
        if kind != "pods":
            obj = inf.get(ns, name)
            return [obj] if obj is not None else []
        with self._mu:
            members = sorted(self._groups.get((ns, name), ()))
        return [p for p in (inf.get(ns, n) for n in members) if p is not None]

    def _identity(self, objs: Sequence[Mapping[str, Any]]) -> str:
        """Which incarnation of the object (its uid; a pod group's member uids)."""
        return ",".join(str(_meta(o).get("uid") or _meta(o).get("name") or "") for o in objs)

    def _translate(self, key: Key, objs: list[dict[str, Any]]) -> KubeWorkload | None:
        """The workload of an object, or None (not managed, or refused here with an Event)."""
        if key[0] != "pods" and owned_by_a_top_kind(objs[0]):
            self.stats["skipped"] += 1
            return None  # a JobSet's child Job: part of its JobSet's workload, never its own
        try:
            if key[0] == "pods":
                got = kw.workload_from_pods(objs, self.policy.defaults)
            else:
                got = kw.workload_from_object(objs[0], self.policy.defaults)
        except KubeWorkloadError as exc:
            self._refuse(
                key, objs[0], INVALID, f"gpupool cannot read this object: {exc}", f"invalid:{exc}", "invalid"
            )
            return None
        except Exception as exc:  # a bug in the translation: this object waits, the others go on
            raise _Unready(
                f"the Kubernetes translation layer failed on {key[0]}/{key[1]}/{key[2]}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if got is None:
            self.stats["skipped"] += 1
            return None
        held = schedulers.foreign(objs[0], self.policy.defaults.scheduler_name) if key[0] != "pods" else None
        if held is not None:  # never admitted, charged and shown Running while another scheduler has it
            msg = f"gpupool will not schedule workload {_name_of(got)}: {held}"
            self._refuse(key, objs[0], REFUSED, msg, f"scheduler:{held}")
            return None
        queue = _queue_of(got.manifest)
        why = self.policy.refusal(key[1], queue)
        if why is not None:
            self._refuse(
                key, objs[0], REFUSED, f"gpupool refused workload {_name_of(got)}: {why}", f"policy:{why}"
            )
            return None
        return got

    def _refuse(
        self, key: Key, obj: Mapping[str, Any], reason: str, message: str, mark: str, stat: str = "refused"
    ) -> None:
        """A Warning Event on the object, once per distinct problem (not on every status update),
        counted under ``stat`` once as well: the counters say how many problems, not how often
        an unchanged object was looked at again."""
        if self._seen.get(key) == mark:
            return
        self._seen[key] = mark
        self.stats[stat] += 1
        self.events.event(obj, "Warning", reason, message)

    def _deleted(self, key: Key, gone: Mapping[str, Any] | None) -> None:
        """The object is gone: cancel its workload (a name known from this run, else derived)
        and, for an elastic object, every extra."""
        self._scale_down(key, 0)
        self._seen.pop(key, None)
        name = self.names.pop(key, None)
        if name is None and gone is not None and key[0] != "pods":
            try:
                got = kw.workload_from_object(gone, self.policy.defaults)
            except Exception:  # unreadable or a translation bug: nothing known to cancel
                got = None
            name = _name_of(got) if got is not None else None
        if name is not None and self.submitter.cancel(name):
            self.stats["cancelled"] += 1

    # ------------------------------------------------------------------ elastic objects
    def _scale(self, key: Key, objs: Sequence[Mapping[str, Any]]) -> str:
        """The replica count, for an elastic object (it changes which workloads it stands for)."""
        if not self.policy.elastic or key[0] not in ELASTIC_INFORMERS or not objs:
            return ""
        spec = objs[0].get("spec")
        return f"/r{spec.get('replicas', 1) if isinstance(spec, Mapping) else 1}"

    def _elastic(self, key: Key, obj: dict[str, Any]) -> list[tuple[Key, KubeWorkload]] | None:
        """The base and extras of an elastic object, keyed (the extras' keys carry ``#extra-i``);
        None when it is not elastic (the ordinary translation applies). Cancels the extras
        above the current replica count at once (their quota is free at the next cycle)."""
        if not self.policy.elastic or key[0] not in ELASTIC_INFORMERS:
            return None
        try:
            got = elastic.elastic_workloads(obj, self.policy.defaults)
        except KubeWorkloadError as exc:
            self._refuse(
                key, obj, INVALID, f"gpupool cannot read this object: {exc}", f"invalid:{exc}", "invalid"
            )
            return []
        except Exception as exc:
            raise _Unready(f"the elastic translation failed on {key[0]}/{key[1]}/{key[2]}: {exc}") from exc
        if got is None:
            return None if elastic.min_replicas(obj) is None else []
        why = self.policy.refusal(key[1], _queue_of(got.base.manifest))
        if why is not None:
            msg = f"gpupool refused workload {_name_of(got.base)}: {why}"
            self._refuse(key, obj, REFUSED, msg, f"policy:{why}")
            return []
        self._scale_down(key, got.replicas)
        extras = [
            ((key[0], key[1], f"{key[2]}{EXTRA_KEY}{i}"), w)
            for i, w in enumerate(got.extras, got.min_replicas)
        ]
        return [(key, got.base), *[(k, w) for k, w in extras if k not in self.names]]

    def _scale_down(self, key: Key, replicas: int) -> None:
        """Cancel the extras of ``key`` whose replica index is ``replicas`` or more."""
        prefix = f"{key[2]}{EXTRA_KEY}"
        for k in [k for k in self.names if k[:2] == key[:2] and k[2].startswith(prefix)]:
            tail = k[2][len(prefix) :]
            if tail.isdigit() and int(tail) >= replicas:
                self._seen.pop(k, None)
                if self.submitter.cancel(self.names.pop(k)):
                    self.stats["cancelled"] += 1

    def _submit(self, todo: Sequence[tuple[Key, KubeWorkload, dict[str, Any], str]]) -> None:
        outcomes = self.submitter.submit_many([w.manifest for _, w, _, _ in todo])
        for (key, w, obj, ident), out in zip(todo, outcomes, strict=True):
            self._failing.discard(key)  # an answer, accepted or refused
            if out.refused:
                self._refuse(
                    key,
                    obj,
                    REFUSED,
                    f"gpupool refused workload {out.name}: {out.text()}",
                    f"refused:{digest(w.manifest)}",
                )
                continue
            self._seen[key] = f"ok:{ident}"
            self.names[key] = out.name or _name_of(w)
            self.stats["submitted" if out.result == "created" else "unchanged"] += 1


def _queue_of(manifest: Mapping[str, Any]) -> str:
    spec = manifest.get("spec") or {}
    labels = _meta(manifest).get("labels") or {}
    queue = spec.get("queue") if isinstance(spec, Mapping) else None
    if not queue and isinstance(labels, Mapping):
        queue = next((labels[k] for k in kw.QUEUE_LABELS if labels.get(k)), "")
    return str(queue or "")


def _name_of(w: KubeWorkload) -> str:
    return str(_meta(w.manifest).get("name") or "")
