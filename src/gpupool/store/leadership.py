"""The leader lease: which replica may write (fenced views check it inside each write).

Why in the store: the lease lives in the same database as the state, so a write by a replica
that lost the lease fails in the same transaction instead of racing the new leader.
"""

from __future__ import annotations

from datetime import datetime

from gpupool.store import lease as leaselib
from gpupool.store.database import Database
from gpupool.store.errors import NotLeader, ValidationFailed
from gpupool.store.lease import Lease


class LeaseRepository:
    """Taking, renewing and releasing the leader lease, on the lease's own connection."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get_lease(self) -> Lease:
        """The leader lease as stored (holder empty when nobody holds it)."""
        with self.db.lease_engine.connect() as conn:
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
        now = self.db.now(at)
        with self.db.turn.first(), self.db.lease_writer().begin() as conn:
            return leaselib.take(conn, holder, url, now, ttl_s, dead_holder)

    def renew_lease(self, holder: str, epoch: int, ttl_s: float, *, at: datetime | None = None) -> Lease:
        """Extend our lease by ``ttl_s`` from now; NotLeader when someone took it over.

        On the lease's own connection, and bulk writers step aside between their batches
        meanwhile (gpupool.store.turns): no write of this process can cost it the lease."""
        now = self.db.now(at)
        with self.db.turn.first(), self.db.lease_writer().begin() as conn:
            got = leaselib.renew(conn, holder, epoch, now, ttl_s)
        if got is None:
            raise NotLeader(f"the leader lease (epoch {epoch}) was taken over")
        return got

    def release_lease(self, holder: str, epoch: int, *, at: datetime | None = None) -> bool:
        """Give our lease up (clean stop); False when it was not ours any more."""
        now = self.db.now(at)
        with self.db.lease_writer().begin() as conn:
            return leaselib.release(conn, holder, epoch, now)
