"""The leader lease and fenced views: which replica may write, checked inside each write.

Why in the store: the lease lives in the same database as the state, so a write by a replica
that lost the lease fails in the same transaction instead of racing the new leader.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Self

import sqlalchemy as sa

from gpupool.store import lease as leaselib
from gpupool.store.base import StoreBase
from gpupool.store.errors import NotLeader, ValidationFailed
from gpupool.store.lease import Lease


class LeaseMethods(StoreBase):
    """Taking, renewing and releasing the leader lease, and the fenced view of the store."""

    def fenced(self, epoch: int, *, idle_timeout_s: float = 4.0) -> Self:
        """A view of this store whose every write transaction first checks the lease's epoch.

        Why a view: the controller's decisions go through many methods; handing it a fenced
        view guards them all (NotLeader, nothing written, once the lease moved on) while the
        API's own writes keep the plain store. The view shares the engine: do not ``close`` it.
        ``idle_timeout_s``: PostgreSQL aborts a fenced transaction left idle that long.
        """
        view = copy.copy(self)
        view._compose(self.db.fenced(epoch, idle_timeout_s))
        return view

    @property
    def fence(self) -> int | None:
        """The fencing token this view checks (None for the plain store)."""
        return self.db.fence

    def _lease_writer(self) -> sa.Engine:
        """The lease's own connection, writing as the store's writers do (SQLite: BEGIN IMMEDIATE)."""
        return self.db.lease_writer()

    def get_lease(self) -> Lease:
        """The leader lease as stored (holder empty when nobody holds it)."""
        with self._lease_engine.connect() as conn:
            return leaselib.read(conn)

    def acquire_lease(
        self,
        holder: str,
        url: str,
        ttl_s: float,
        *,
        dead_holder: str | None = None,
        at: datetime | None = None,
    ) -> Lease | None:
        """Take the lease with a new epoch when it is free, expired, already ours or held by
        ``dead_holder``; None when another holder keeps it. One conditional UPDATE (atomic)."""
        if not holder:
            raise ValidationFailed("holder", "required")
        if ttl_s <= 0:
            raise ValidationFailed("ttl_s", "must be > 0")
        now = self._now(at)
        with self.turn.first(), self._lease_writer().begin() as conn:
            return leaselib.take(conn, holder, url, now, ttl_s, dead_holder)

    def renew_lease(self, holder: str, epoch: int, ttl_s: float, *, at: datetime | None = None) -> Lease:
        """Extend our lease by ``ttl_s`` from now; NotLeader when someone took it over.

        On the lease's own connection, and bulk writers step aside between their batches
        meanwhile (gpupool.store.turns): no write of this process can cost it the lease."""
        now = self._now(at)
        with self.turn.first(), self._lease_writer().begin() as conn:
            got = leaselib.renew(conn, holder, epoch, now, ttl_s)
        if got is None:
            raise NotLeader(f"the leader lease (epoch {epoch}) was taken over")
        return got

    def release_lease(self, holder: str, epoch: int, *, at: datetime | None = None) -> bool:
        """Give our lease up (clean stop); False when it was not ours any more."""
        now = self._now(at)
        with self._lease_writer().begin() as conn:
            return leaselib.release(conn, holder, epoch, now)
