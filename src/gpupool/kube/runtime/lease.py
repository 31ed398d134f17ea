"""Leader election on a ``coordination.k8s.io/v1`` Lease: only its holder binds or evicts.

Why a Kubernetes Lease on top of the store's lease (``gpupool.service.leader``): the store lease
and its fencing epoch guard every store write, but binds and evictions go to the cluster, which
knows nothing of that epoch. Two replicas pointed at one cluster with two stores (a
misconfiguration), or a replica whose store view lags, must still not both bind. The Lease is
the cluster's own arbiter (what kube-scheduler and Kueue use), so a replica acts only while it
holds both; losing either stops its controller loop at once.

The protocol is client-go's ``tryAcquireOrRenew``:

* read the Lease; absent -> create it naming us (``acquireTime = renewTime = now``);
* held by another -> wait until ``leaseDurationSeconds`` have passed *by our own clock* since we
  last saw the record change (never trusting the holder's clock), or take it at once when it was
  released (empty ``holderIdentity``) or its holder is a dead process on this host (kill -9 and
  a restart: the restart must not wait a whole lease);
* take over or renew with an update carrying the ``resourceVersion`` read: a 409 means another
  replica wrote first and we did not get it (optimistic concurrency, no lock service needed);
* a takeover increments ``leaseTransitions``; a clean stop releases (empty holder, duration 1 s).

A holder stops acting ``SKEW_S`` before its lease could expire for the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpupool.kube.client import RESOURCES, ApiError, KubeApi
from gpupool.service.leader import dead_here, holder_id

log = logging.getLogger("gpupool.kube.lease")

#: stop acting this long before the lease could expire for another replica (clock rate, latency)
SKEW_S = 1.0


class LeaseConflict(Exception):
    """The Lease changed since it was read (409), or already exists on create."""


class LeaseApi(Protocol):
    """The three calls leader election needs, on plain dicts (so tests need no cluster)."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None when it does not exist."""

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create it; raises LeaseConflict when it exists."""

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Update it (``metadata.resourceVersion`` is the precondition); raises LeaseConflict."""


class KubeApiLeases:
    """``LeaseApi`` over ``gpupool.kube.client.KubeApi`` (plain dicts, one shared connection pool)."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get(RESOURCES["leases"], namespace, name)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.api.create(RESOURCES["leases"], obj["metadata"]["namespace"], obj)
        except ApiError as exc:
            if exc.code == 409:
                raise LeaseConflict(str(exc)) from exc
            raise

    def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        path = RESOURCES["leases"].path(meta["namespace"], meta["name"])
        try:
            return self.api.request("PUT", path, body=obj)
        except ApiError as exc:
            if exc.code == 409:
                raise LeaseConflict(str(exc)) from exc
            raise


@dataclass(frozen=True, slots=True)
class KubeLeaseSettings:
    """Where the Lease lives and its timing (kube-scheduler's defaults: 15 s / 10 s / 2 s)."""

    namespace: str = "default"
    name: str = "gpupool-scheduler"
    duration_s: float = 15.0
    renew_s: float = 10.0
    retry_s: float = 2.0
    #: take the Lease at once when its holder is a dead process on this host
    reclaim_local: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.renew_s < self.duration_s - SKEW_S:
            raise ValueError(f"kube lease renew interval must be > 0 and < duration - {SKEW_S:g}s")
        if self.retry_s <= 0:
            raise ValueError("kube lease retry interval must be > 0")


def _micro_time(ts: float) -> str:
    """A MicroTime as the API server writes it (RFC 3339, microseconds, Z)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeLease:
    """Holds (or waits for) one Lease; ``held()`` says whether this process may act now."""

    def __init__(
        self,
        api: LeaseApi,
        settings: KubeLeaseSettings | None = None,
        *,
        identity: str | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.settings = settings or KubeLeaseSettings()
        self.identity = identity or holder_id()
        self.on_change = on_change or (lambda held: None)
        self.clock = clock
        self.monotonic = monotonic
        self._leading = False
        self._deadline = 0.0
        #: the other holder's record as last seen (holder, renewTime, resourceVersion) and when
        self._seen: tuple[str, str, str] = ("", "", "")
        self._seen_at = 0.0
        self.holder = ""  # the holder as last read ('' when none)
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ state
    def held(self) -> bool:
        """Holding the Lease, and it cannot have expired for the other replicas yet."""
        return self._leading and self.monotonic() < self._deadline

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {"lease": f"{s.namespace}/{s.name}", "holder": self.holder or None, "held": self.held()}

    # ------------------------------------------------------------------ one step
    def step(self) -> bool:
        """client-go's tryAcquireOrRenew: one read and at most one write. Returns ``held()``."""
        t0 = self.monotonic()
        try:
            got = self._acquire_or_renew(t0)
        except LeaseConflict:
            got = False  # another replica wrote first
        except Exception as exc:  # the API server is unreachable: keep the lease until its deadline
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("kube lease %s: %s", self.settings.name, self.last_error)
            self._set_leading(self.held(), None)
            return self.held()
        self.last_error = ""
        self._set_leading(got, t0 if got else None)
        return self.held()

    def _acquire_or_renew(self, t0: float) -> bool:
        s = self.settings
        cur = self.api.get(s.namespace, s.name)
        if cur is None:
            self.api.create(self._record(None, transitions=0))
            self.holder = self.identity
            return True
        spec = cur.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self.holder = holder
        if holder and holder != self.identity and not self._expired(cur, holder, t0):
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder != self.identity:
            transitions += 1
        self.api.replace(self._record(cur, transitions=transitions))
        self.holder = self.identity
        return True

    def _expired(self, cur: dict[str, Any], holder: str, now: float) -> bool:
        """Another's lease is expired once it has not changed for its duration by our clock."""
        spec = cur.get("spec") or {}
        meta = cur.get("metadata") or {}
        key = (holder, str(spec.get("renewTime") or ""), str(meta.get("resourceVersion") or ""))
        if key != self._seen:
            self._seen, self._seen_at = key, now
        if self.settings.reclaim_local and dead_here(holder):
            log.warning(
                "kube lease %s: holder %s is a dead process here; taking over", self.settings.name, holder
            )
            return True
        duration = float(spec.get("leaseDurationSeconds") or self.settings.duration_s)
        return now - self._seen_at >= duration

    def _record(self, cur: dict[str, Any] | None, *, transitions: int) -> dict[str, Any]:
        s = self.settings
        now = _micro_time(self.clock())
        spec = dict((cur or {}).get("spec") or {})
        taking = spec.get("holderIdentity") != self.identity
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(s.duration_s),
            renewTime=now,
            leaseTransitions=transitions,
        )
        if taking or not spec.get("acquireTime"):
            spec["acquireTime"] = now
        meta: dict[str, Any] = {"name": s.name, "namespace": s.namespace}
        if cur is not None:
            meta["resourceVersion"] = (cur.get("metadata") or {}).get("resourceVersion")
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _set_leading(self, got: bool, t0: float | None) -> None:
        was = self._leading
        if got and t0 is not None:
            self._deadline = t0 + self.settings.duration_s - SKEW_S
        self._leading = got
        if got != was:
            log.warning(
                "kube lease %s/%s %s",
                self.settings.namespace,
                self.settings.name,
                "acquired" if got else "lost",
            )
            self.on_change(got)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Try once now (a lone replica leads before it serves), then keep at it in a thread."""
        got = self.step()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpupool-kube-lease", daemon=True)
        self._thread.start()
        return got

    def _run(self) -> None:
        while not self._stop.wait(self._interval()):
            self.step()

    def _interval(self) -> float:
        """Renew every ``renew_s``; retry every ``retry_s`` while standing by or after a failure."""
        s = self.settings
        return s.renew_s if self._leading and not self.last_error else s.retry_s

    def stop(self, release: bool = True) -> None:
        """Stop renewing; release the Lease (empty holder) so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        leading = self._leading
        self._set_leading(False, None)
        if release and leading:
            self._release()

    def _release(self) -> None:
        s = self.settings
        try:
            cur = self.api.get(s.namespace, s.name)
            if cur is None or (cur.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            rec = self._record(cur, transitions=int((cur.get("spec") or {}).get("leaseTransitions") or 0))
            rec["spec"].update(holderIdentity="", leaseDurationSeconds=1)
            self.api.replace(rec)
        except Exception as exc:  # the lease then expires by itself
            log.warning("could not release kube lease %s: %s", s.name, exc)
