"""Informer caches: one list, then a watch from the list's resourceVersion, kept in memory.

Why: a scheduling cycle must never LIST the cluster (at 1,000 nodes and 10,000 pods a list costs
more than the cycle); it reads these caches, which the watch keeps current. The loop follows the
API's contract: bookmarks advance the resourceVersion without an object, a ``410 Gone`` (the
version fell out of the server's history window) means list again, and a relist is diffed
against the cache so listeners see every change exactly once (no object lost, none repeated).
A dropped connection or a server error is retried from the last version with backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import lightkube

from gpupool.kube.client import RESOURCES, ApiError, KubeApi, Resource

log = logging.getLogger("gpupool.kube.informer")

Listener = Callable[[str, dict[str, Any]], None]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    """A watched cache of one kind. ``resource``: a ``Resource`` or a name of ``RESOURCES``."""

    def __init__(
        self,
        client: KubeApi | lightkube.Client,
        resource: Resource | str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout_s: int = 300,
        backoff_s: tuple[float, float] = (0.1, 5.0),
        absent_retry_s: float = 10.0,
    ) -> None:
        self.api = KubeApi.of(client)
        self.resource = RESOURCES[resource] if isinstance(resource, str) else resource
        self.namespace = namespace
        self.selectors = {
            k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        }
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        #: how often a kind the server does not serve (a CRD not installed) is looked for again
        self.absent_retry_s = absent_retry_s
        self._lock = threading.Lock()
        self._cache: dict[Key, dict[str, Any]] = {}
        self._listeners: list[Listener] = []
        self._rv = ""
        self._synced = threading.Event()
        self._decided = threading.Event()  # synced, or known not served
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        #: whether the server serves the kind (False until a list succeeds or a 404 says no)
        self.served: bool | None = None
        #: counters for tests and health: lists, watches opened, 410s, errors, events, bookmarks
        self.stats: dict[str, int] = dict.fromkeys(
            ("lists", "watches", "gone", "errors", "events", "bookmarks"), 0
        )

    # -- reading ----------------------------------------------------------------------------
    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._cache.get((namespace or "", name))

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._cache.values())

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def resource_version(self) -> str:
        return self._rv

    def add_listener(self, fn: Listener) -> None:
        """``fn(type, obj)`` after each change (ADDED, MODIFIED, DELETED), on the watch thread:
        keep it short (set a flag, wake a loop)."""
        self._listeners.append(fn)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        name = f"informer-{self.resource.plural}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        resp = self._response
        if resp is not None:
            try:
                resp.close()  # unblocks the watch thread's read
            except Exception:  # closing a stream another thread reads may race; the flag ends it
                log.debug("closing the %s watch", self.resource.plural, exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wait_synced(self, timeout: float | None = None) -> bool:
        """True once the first list is in the cache (False at the timeout, or when not served)."""
        self._decided.wait(timeout)
        return self._synced.is_set()

    def wait_decided(self, timeout: float | None = None) -> bool:
        """True once the cache is synced or the kind is known not to be served."""
        return self._decided.wait(timeout)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list:
                    if not self._relist():
                        self._stop.wait(self.absent_retry_s)
                        continue
                    need_list = False
                self._watch_once()
                failures = 0
            except ApiError as exc:
                if self._stop.is_set():
                    break
                if exc.code == 410:
                    self.stats["gone"] += 1
                    need_list = True
                    self._stop.wait(self.backoff_s[0])  # never a tight list loop
                    continue
                failures += 1
                self.stats["errors"] += 1
                log.info("informer %s: %s (retry %d)", self.resource.plural, exc, failures)
                lo, hi = self.backoff_s
                self._stop.wait(min(hi, lo * 2 ** min(failures - 1, 10)))
            except Exception:  # a listener or a decode bug must not kill the cache
                if self._stop.is_set():
                    break
                failures += 1
                self.stats["errors"] += 1
                log.exception("informer %s failed; retrying", self.resource.plural)
                self._stop.wait(self.backoff_s[1])
                need_list = True

    def _relist(self) -> bool:
        """List and replace the cache, telling listeners what differs; False when not served."""
        try:
            items, rv = self.api.list(self.resource, self.namespace, params=self.selectors)
        except ApiError as exc:
            if exc.code != 404:
                raise
            if self.served is not False:
                log.info("%s not served by the API server; watching for it later", self.resource.plural)
            self.served = False
            self._decided.set()
            return False
        self.stats["lists"] += 1
        if self.served is False:
            log.info("%s is now served; caching it", self.resource.plural)
        self.served = True
        fresh = {object_key(o): o for o in items}
        with self._lock:
            old = self._cache
            self._cache = fresh
            self._rv = rv
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None:
                self._notify("ADDED", obj)
            elif _rv(prev) != _rv(obj):
                self._notify("MODIFIED", obj)
        for key, obj in old.items():
            if key not in fresh:
                self._notify("DELETED", obj)
        self._synced.set()
        self._decided.set()
        return True

    def _watch_once(self) -> None:
        """One watch request from the cached version, applied event by event until it ends."""
        self.stats["watches"] += 1
        params = {
            **self.selectors,
            "resourceVersion": self._rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": self.watch_timeout_s,
        }
        try:
            for ev in self.api.watch(self.resource, self.namespace, params, on_open=self._opened):
                if self._stop.is_set():
                    return
                self._apply(ev)
        finally:
            self._response = None

    def _opened(self, resp: Any) -> None:
        self._response = resp

    def _apply(self, ev: Mapping[str, Any]) -> None:
        kind = str(ev.get("type", ""))
        obj = ev.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 500)
            raise ApiError(code, str(obj.get("reason", "")), str(obj.get("message", "watch error")))
        rv = _rv(obj)
        if kind == "BOOKMARK":
            self.stats["bookmarks"] += 1
            if rv:
                self._rv = rv
            return
        key = object_key(obj)
        with self._lock:
            prev = self._cache.get(key)
            if kind == "DELETED":
                if prev is None:
                    self._rv = rv or self._rv
                    return  # already gone (a relist saw it first)
                del self._cache[key]
            else:
                if prev is not None and _rv(prev) == rv:
                    self._rv = rv or self._rv
                    return  # the same version again (replayed after a reconnect)
                self._cache[key] = dict(obj)
                kind = "ADDED" if prev is None else "MODIFIED"
            if rv:
                self._rv = rv
        self.stats["events"] += 1
        self._notify(kind, dict(obj))

    def _notify(self, kind: str, obj: dict[str, Any]) -> None:
        for fn in list(self._listeners):
            try:
                fn(kind, obj)
            except Exception:
                log.exception("informer %s listener failed on %s", self.resource.plural, kind)


#: the kinds the backend watches, by attribute of ``Informers``
WATCHED = ("nodes", "pods", "jobs", "pytorchjobs", "jobsets", "deployments", "statefulsets", "leases")


class Informers:
    """One cache per kind the backend watches. A kind the server does not serve (a CRD that is
    not installed) is skipped with a log line; its informer looks again every
    ``absent_retry_s`` and starts caching when the CRD appears."""

    nodes: Informer
    pods: Informer
    jobs: Informer
    pytorchjobs: Informer
    jobsets: Informer
    deployments: Informer
    statefulsets: Informer
    leases: Informer

    def __init__(
        self,
        client: KubeApi | lightkube.Client,
        *,
        namespace: str | None = None,
        kinds: Iterable[str] = WATCHED,
        **informer_options: Any,
    ) -> None:
        self.api = KubeApi.of(client)
        self.kinds = tuple(kinds)
        self.by_kind: dict[str, Informer] = {}
        for k in WATCHED:
            inf = Informer(self.api, k, namespace=None if k == "nodes" else namespace, **informer_options)
            setattr(self, k, inf)
            if k in self.kinds:
                self.by_kind[k] = inf

    def start(self) -> None:
        for inf in self.by_kind.values():
            inf.start()

    def stop(self) -> None:
        for inf in self.by_kind.values():
            inf.stop()

    def wait_synced(self, timeout: float = 30.0) -> bool:
        """True once every served kind is cached (kinds that are not served do not count)."""
        deadline = time.monotonic() + timeout
        for inf in self.by_kind.values():
            if not inf.wait_decided(max(0.0, deadline - time.monotonic())):
                return False
        return all(inf.served is False or inf.wait_synced(0) for inf in self.by_kind.values())

    def add_listener(self, fn: Listener, kinds: Iterable[str] | None = None) -> None:
        for k in kinds or self.by_kind:
            self.by_kind[k].add_listener(fn)

    def stats(self) -> dict[str, dict[str, Any]]:
        return {
            k: {**inf.stats, "objects": len(inf), "served": inf.served} for k, inf in self.by_kind.items()
        }


__all__ = ["WATCHED", "Informer", "Informers", "Listener", "object_key"]
