"""Objects, the global resourceVersion, the event history and who hears about writes.

Why stored objects are never mutated: a write builds a new dict and replaces the old one, so
the history, open watches and listers can share references without copying (10,000 pods, many
watchers), and a reader never sees half a write.
"""

from __future__ import annotations

import builtins
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.kube.fake import errors
from gpupool.kube.fake.resources import BUILTINS, ResourceType
from gpupool.kube.fake.selectors import Pred

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace '' for cluster-scoped


def now_rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def deep_copy(v: Any) -> Any:
    """A copy of JSON data (faster than copy.deepcopy, which handles any Python object)."""
    if isinstance(v, dict):
        return {k: deep_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [deep_copy(x) for x in v]
    return v


@dataclass(slots=True)
class Event:
    """One write as a watch sees it. ``line`` is the encoded watch line, made once on demand."""

    rv: int
    key: str
    type: str
    obj: Obj
    line: bytes | None = None


class Watcher(Protocol):
    """Something told about each committed event of one resource (a watch stream)."""

    def offer(self, ev: Event) -> None: ...


@dataclass(slots=True)
class _Watch:
    ns: str
    pred: Pred | None
    sink: Watcher


@dataclass
class Stats:
    """Counters tests and the benchmark read: requests by verb+resource, binds, evictions,
    HAMi violations (``violations`` lists their messages)."""

    requests: dict[str, int] = field(default_factory=dict)
    binds: int = 0
    evictions: int = 0
    watches_dropped: int = 0
    faults_injected: int = 0
    violations: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)  # requests that hit a fake-server bug (500)

    def count(self, what: str) -> None:
        self.requests[what] = self.requests.get(what, 0) + 1

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def requests_per_bind(self) -> float:
        return self.total_requests / self.binds if self.binds else 0.0


Listener = Callable[[ResourceType, str, Obj, Obj | None], None]


class Store:
    """All objects of the fake cluster, keyed by resource key then (namespace, name)."""

    def __init__(self, history_size: int = 10_000) -> None:
        self.lock = threading.RLock()
        self.rv = 1
        self.history_size = history_size
        self.types: dict[str, ResourceType] = {}
        self.by_path: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[str, dict[Key, Obj]] = {}
        self._hist: list[Event] = []
        self._watches: dict[str, list[_Watch]] = {}
        self._owned: dict[str, set[tuple[str, Key]]] = {}
        self.listeners: list[Listener] = []
        self.stats = Stats()
        #: set while a ``dryRun`` request runs: writes are computed, checked and not stored
        self.dry_run = False
        for rt in BUILTINS:
            self.register(rt)

    # -- types ---------------------------------------------------------------------------
    def register(self, rt: ResourceType) -> None:
        """Serve a resource type (its objects survive re-registration)."""
        with self.lock:
            self.types[rt.key] = rt
            self.by_path[(rt.group, rt.version, rt.plural)] = rt
            self.objects.setdefault(rt.key, {})

    def unregister(self, group: str, plural: str) -> None:
        with self.lock:
            for path in [p for p in self.by_path if p[0] == group and p[2] == plural]:
                del self.by_path[path]
            key = f"{plural}.{group}"
            self.types.pop(key, None)
            self.objects.pop(key, None)

    def type_of(self, key: str) -> ResourceType:
        """The resource type for ``pods``, ``jobs.batch``, ``pytorchjobs.kubeflow.org``..."""
        rt = self.types.get(key)
        if rt is None:
            raise errors.not_found("resource", key)
        return rt

    # -- reads ---------------------------------------------------------------------------
    def get(self, rt: ResourceType, ns: str, name: str) -> Obj:
        obj = self.objects[rt.key].get((ns if rt.namespaced else "", name))
        if obj is None:
            raise errors.not_found(rt.plural, name, rt.group)
        return obj

    def find(self, rt: ResourceType, ns: str, name: str) -> Obj | None:
        return self.objects[rt.key].get((ns if rt.namespaced else "", name))

    def list(self, rt: ResourceType, ns: str = "", pred: Pred | None = None) -> tuple[list[Obj], int]:
        """Objects in key order (as etcd lists them) and the resourceVersion of the list."""
        with self.lock:
            items = self.objects[rt.key]
            keys = sorted(k for k in items if not ns or k[0] == ns)
            objs = [items[k] for k in keys]
            if pred is not None:
                objs = [o for o in objs if pred(o)]
            return objs, self.rv

    def owned_by(self, uid: str) -> builtins.list[tuple[str, Key]]:
        return sorted(self._owned.get(uid, ()))

    # -- writes --------------------------------------------------------------------------
    def commit(self, rt: ResourceType, etype: str, obj: Obj, old: Obj | None = None) -> Obj:
        """Store (or remove, for DELETED) ``obj`` under the next resourceVersion and tell watches."""
        with self.lock:
            if self.dry_run:
                return obj
            self.rv += 1
            # a new metadata dict: writers build ``{**cur, ...}``, which shares ``cur``'s, and the
            # previous version's event (encoded only when a watch sends it) must keep its version
            md = {**obj["metadata"], "resourceVersion": str(self.rv)}
            obj = {**obj, "metadata": md}
            k = (md.get("namespace", "") if rt.namespaced else "", md["name"])
            if etype == "DELETED":
                self.objects[rt.key].pop(k, None)
            else:
                self.objects[rt.key][k] = obj
            self._index_owners(rt.key, k, old, None if etype == "DELETED" else obj)
            ev = Event(self.rv, rt.key, etype, obj)
            self._record(ev)
            for w in self._watches.get(rt.key, ()):
                if (not w.ns or w.ns == k[0]) and (w.pred is None or w.pred(obj)):
                    w.sink.offer(ev)
            for listener in self.listeners:
                listener(rt, etype, obj, old)
            return obj

    def _index_owners(self, key: str, k: Key, old: Obj | None, new: Obj | None) -> None:
        for o, add in ((old, False), (new, True)):
            for ref in ((o or {}).get("metadata") or {}).get("ownerReferences") or ():
                bucket = self._owned.setdefault(ref.get("uid", ""), set())
                if add:
                    bucket.add((key, k))
                else:
                    bucket.discard((key, k))

    def _record(self, ev: Event) -> None:
        self._hist.append(ev)
        if len(self._hist) > 2 * self.history_size:
            del self._hist[: len(self._hist) - self.history_size]

    # -- watch ---------------------------------------------------------------------------
    def oldest_rv(self) -> int:
        """The oldest resourceVersion a watch may start from (events after it are all kept)."""
        return self._hist[0].rv - 1 if self._hist else self.rv

    def watch(
        self, rt: ResourceType, ns: str, pred: Pred | None, since: int | None, sink: Watcher
    ) -> tuple[builtins.list[Event], int]:
        """Register ``sink`` and return the events it must replay first (after ``since``; every
        current object as ADDED when ``since`` is None) plus the current resourceVersion.

        Raises 410 Gone when ``since`` is older than the history window."""
        with self.lock:
            if since is None:
                objs, _ = self.list(rt, ns, pred)
                replay = [Event(int(o["metadata"]["resourceVersion"]), rt.key, "ADDED", o) for o in objs]
            else:
                if since < self.oldest_rv():
                    raise errors.ApiError(
                        410, f"too old resource version: {since} ({self.oldest_rv()})", "Expired"
                    )
                start = max(0, since - self._hist[0].rv + 1) if self._hist else 0
                replay = [
                    e
                    for e in self._hist[start:]
                    if e.key == rt.key
                    and e.rv > since
                    and (not ns or e.obj["metadata"].get("namespace", "") == ns)
                    and (pred is None or pred(e.obj))
                ]
            self._watches.setdefault(rt.key, []).append(_Watch(ns, pred, sink))
            return replay, self.rv

    def unwatch(self, rt: ResourceType, sink: Watcher) -> None:
        with self.lock:
            ws = self._watches.get(rt.key, [])
            self._watches[rt.key] = [w for w in ws if w.sink is not sink]

    def watch_count(self) -> int:
        return sum(len(v) for v in self._watches.values())


def new_metadata(md: Obj, ns: str, namespaced: bool) -> Obj:
    """Fill the fields the server owns on create: uid, creationTimestamp, generation, name."""
    if not md.get("name"):
        gen = md.get("generateName")
        if not gen:
            raise errors.invalid("object", "", "metadata.name", "name or generateName is required")
        md["name"] = gen + uuid.uuid4().hex[:5]
    if namespaced:
        md["namespace"] = ns
    else:
        md.pop("namespace", None)
    md["uid"] = str(uuid.uuid4())
    md["creationTimestamp"] = now_rfc3339()
    md["generation"] = 1
    for f in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "selfLink"):
        md.pop(f, None)
    return md


def iter_objects(store: Store, keys: Iterable[str]) -> Iterable[tuple[ResourceType, Obj]]:
    for key in keys:
        rt = store.types.get(key)
        if rt is not None:
            for obj in list(store.objects[key].values()):
                yield rt, obj
