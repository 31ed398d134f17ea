"""Workload status mirrors: one ``gpupool.io/v1alpha1 Workload`` per workload from Kubernetes.

Why a mirror object: a pod's ``PodScheduled`` condition and the owner's Events say why *one*
object waits, but a platform user asks "what is waiting in my namespace, in which queue, at
which position, and why" — ``kubectl get workloads.gpupool.io`` answers that with the columns
the CRD declares (queue, phase, position, reason, pool, age), as Kueue's Workload objects do.

How it stays cheap: the mirror is written by the status writer's pass (at most one a second),
from one store query for all the source's workloads and the controller's pending reasons; a
status is written only when it changed (the digest of the last status written is kept per
object), and at most ``max_writes`` objects per pass. The object is owned by the Kubernetes
object it mirrors (``ownerReferences``), so deleting the Job deletes its mirror on a real
cluster; the mirror also deletes it itself when the source forgets the workload.

A cluster without the CRD (installed from files without it, or an older chart) is not an
error: the mirror logs once and writes nothing until the CRD is served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpupool.kube.adapters.waiting import Waiting
from gpupool.kube.client import ApiError, Resource

log = logging.getLogger("gpupool.kube.mirror")

MIRROR = Resource("gpupool.io", "v1alpha1", "workloads", "Workload")
#: the annotation on a mirror naming the gpupool workload it mirrors
MIRRORS = "gpupool.io/workload"
#: how often a cluster without the CRD is asked again whether it serves it now
RECHECK_S = 60.0


def mirror_name(workload: str, namespace: str) -> str:
    """The mirror's name in the object's namespace: the workload's name without the namespace
    prefix (``team-a.job.train`` -> ``job.train``), which is already a DNS subdomain."""
    prefix = f"{namespace}."
    return workload[len(prefix) :] if workload.startswith(prefix) else workload


def mirror_status(record: Any, waiting: Waiting | None) -> dict[str, Any]:
    """The status a mirror shows for one stored workload (and its pending reason, if waiting)."""
    status: dict[str, Any] = {"phase": str(record.phase), "queue": str(record.queue)}
    if waiting is not None:
        status["reason"] = waiting.reason
        status["reasonCode"] = waiting.code
        if waiting.position is not None:
            status["position"] = waiting.position
    elif record.reason:
        status["reason"] = str(record.reason)
    placement = record.placement or {}
    if placement:
        nodes = sorted({str(p.get("node")) for p in placement.get("pods") or () if p.get("node")})
        status["admission"] = {
            "pool": str(placement.get("pool") or ""),
            "nodes": nodes,
            "borrowing": bool(placement.get("borrowing")),
        }
    return status


def _digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _owner_ref(owner: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    md = (owner or {}).get("metadata") or {}
    if not owner or not md.get("uid"):
        return []
    return [
        {
            "apiVersion": str(owner.get("apiVersion") or "v1"),
            "kind": str(owner.get("kind") or "Pod"),
            "name": str(md.get("name") or ""),
            "uid": str(md["uid"]),
        }
    ]


class WorkloadMirror:
    """Creates, updates (status on change only) and deletes the Workload mirror objects."""

    def __init__(
        self, api: Any, *, max_writes: int = 200, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.api = api
        self.max_writes = max_writes
        self.clock = clock
        #: (namespace, mirror name) -> digest of the status last written
        self._written: dict[tuple[str, str], str] = {}
        self._served: bool | None = None
        self._checked_at = float("-inf")
        self.stats = {"created": 0, "status": 0, "deleted": 0, "errors": 0}

    def served(self) -> bool:
        """Whether the cluster serves the Workload CRD (asked again every RECHECK_S when not)."""
        if self._served or self.clock() - self._checked_at < RECHECK_S:
            return bool(self._served)
        self._checked_at = self.clock()
        try:
            self._served = bool(self.api.served(MIRROR))
        except Exception as exc:
            log.debug("asking whether workloads.gpupool.io is served: %s", exc)
            self._served = False
        if not self._served:
            log.warning("the cluster does not serve workloads.gpupool.io: no Workload mirrors written")
        return self._served

    def sync(
        self,
        records: Sequence[Any],
        waiting: Mapping[str, Waiting],
        namespace_of: Mapping[str, str],
        owner_of: Callable[[str], Mapping[str, Any] | None],
    ) -> int:
        """Bring the mirrors of ``records`` (stored workloads of the source, with their
        namespaces in ``namespace_of``) up to date; delete those of workloads no longer given.
        Returns the writes made."""
        if not self.served():
            return 0
        writes = 0
        want: set[tuple[str, str]] = set()
        for rec in records:
            ns = namespace_of.get(rec.name)
            if not ns:
                continue
            key = (ns, mirror_name(rec.name, ns))
            want.add(key)
            status = mirror_status(rec, waiting.get(rec.name))
            digest = _digest(status)
            if self._written.get(key) == digest or writes >= self.max_writes:
                continue
            writes += 1
            if self._write(key, rec, status, owner_of):
                self._written[key] = digest
        for key in [k for k in self._written if k not in want]:
            writes += self._delete(key)
        return writes

    def _write(
        self,
        key: tuple[str, str],
        rec: Any,
        status: dict[str, Any],
        owner_of: Callable[[str], Mapping[str, Any] | None],
    ) -> bool:
        """Create the mirror if this run has not written it yet, then patch its status; False
        when the API refused (the next pass creates it again and retries)."""
        ns, name = key
        try:
            if key not in self._written:
                self._create(ns, name, rec, owner_of(rec.name))
            self.api.patch(MIRROR, ns, name, {"status": status}, sub="status")
        except ApiError as exc:
            self.stats["errors"] += 1
            self._written.pop(key, None)
            log.debug("mirror %s/%s: %s", ns, name, exc)
            return False
        self.stats["status"] += 1
        return True

    def _create(self, ns: str, name: str, rec: Any, owner: Mapping[str, Any] | None) -> None:
        manifest = rec.manifest or {}
        body = {
            "apiVersion": MIRROR.api_version,
            "kind": MIRROR.kind,
            "metadata": {
                "name": name,
                "namespace": ns,
                "annotations": {MIRRORS: rec.name},
                "labels": {"app.kubernetes.io/managed-by": "gpupool"},
                "ownerReferences": _owner_ref(owner),
            },
            "spec": dict(manifest.get("spec") or {}),
        }
        try:
            self.api.create(MIRROR, ns, body)
            self.stats["created"] += 1
        except ApiError as exc:
            if exc.code != 409:  # it exists already (an earlier run made it): patch its status
                raise

    def _delete(self, key: tuple[str, str]) -> int:
        self._written.pop(key, None)
        try:
            self.api.delete(MIRROR, *key)
            self.stats["deleted"] += 1
        except ApiError as exc:
            if exc.code != 404:
                self.stats["errors"] += 1
                log.debug("deleting mirror %s/%s: %s", *key, exc)
        return 1


__all__ = ["MIRROR", "MIRRORS", "WorkloadMirror", "mirror_name", "mirror_status"]
