"""The leader lease: one row saying which replica may decide, and the fencing check.

Why a row and not only a lock: a lock says who holds it now, but not whether a write in flight
was decided under the current holder. The row carries a fencing token (``epoch``), incremented
on every takeover; every decision transaction of the leader re-reads it inside the same
transaction (on PostgreSQL under ``FOR SHARE``, so a takeover's UPDATE waits for it, and vice
versa), so a deposed leader that wakes up after its lease was taken cannot commit a decision.
Every statement here is a single conditional UPDATE, atomic on SQLite and PostgreSQL alike.
Expiry uses the store's clock: replicas' clocks should agree (NTP); a skew only moves the
takeover time, never lets two writers commit (the token does that).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from gpupool.store.errors import NotLeader
from gpupool.store.schema import LeaderLeaseRow


def _table() -> sa.Table:
    t: sa.Table = LeaderLeaseRow.__table__  # type: ignore[assignment]
    return t


_LT = _table()


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease as stored: who holds it (empty: nobody), their advertised URL, the fencing token."""

    holder: str
    url: str
    epoch: int
    acquired_at: datetime
    expires_at: datetime

    def held_at(self, now: datetime) -> bool:
        """Is someone holding it at ``now`` (a holder, not yet expired)?"""
        return bool(self.holder) and self.expires_at > now


def _lease(row: Any) -> Lease:
    return Lease(row.holder, row.url, int(row.epoch), row.acquired_at, row.expires_at)


def read(conn: sa.Connection) -> Lease:
    """The current lease (the row always exists: the migration creates it)."""
    return _lease(conn.execute(sa.select(_LT).where(_LT.c.id == 1)).one())


def take(
    conn: sa.Connection, holder: str, url: str, now: datetime, ttl_s: float, dead_holder: str | None
) -> Lease | None:
    """Take the lease with a new epoch if nobody holds it, it expired, it is ours already, or it
    is held by ``dead_holder`` (a holder known to be gone); None when another holder keeps it."""
    free = sa.or_(_LT.c.holder == "", _LT.c.expires_at <= now, _LT.c.holder == holder)
    if dead_holder:
        free = sa.or_(free, _LT.c.holder == dead_holder)
    stmt = (
        sa.update(_LT)
        .where(_LT.c.id == 1, free)
        .values(
            holder=holder,
            url=url,
            epoch=_LT.c.epoch + 1,
            acquired_at=now,
            expires_at=now + timedelta(seconds=ttl_s),
        )
        .returning(*_LT.c)
    )
    row = conn.execute(stmt).first()
    return None if row is None else _lease(row)


def renew(conn: sa.Connection, holder: str, epoch: int, now: datetime, ttl_s: float) -> Lease | None:
    """Extend our lease; None when it is no longer ours under ``epoch`` (someone took it over).

    An expired lease nobody took yet is still ours: no other writer can have committed since.
    """
    stmt = (
        sa.update(_LT)
        .where(_LT.c.id == 1, _LT.c.holder == holder, _LT.c.epoch == epoch)
        .values(expires_at=now + timedelta(seconds=ttl_s))
        .returning(*_LT.c)
    )
    row = conn.execute(stmt).first()
    return None if row is None else _lease(row)


def release(conn: sa.Connection, holder: str, epoch: int, now: datetime) -> bool:
    """Give the lease up (clean shutdown) so a standby takes over at its next try; keeps the epoch."""
    stmt = (
        sa.update(_LT)
        .where(_LT.c.id == 1, _LT.c.holder == holder, _LT.c.epoch == epoch)
        .values(holder="", expires_at=now)
    )
    return bool(conn.execute(stmt).rowcount)


def check_fence(conn: sa.Connection, epoch: int, idle_timeout_ms: int) -> None:
    """Raise NotLeader unless the lease still carries ``epoch``; call inside the write transaction.

    PostgreSQL: the row is read ``FOR SHARE`` (a takeover's UPDATE then waits for this
    transaction, so it commits before the takeover or not at all), and the transaction gets an
    idle timeout: a leader stopped mid-transaction (SIGSTOP, a frozen VM) must not hold the lease
    row, and with it the takeover, hostage. SQLite's writer lock already serialises them.
    """
    q: Any
    if conn.dialect.name == "postgresql":
        q = (
            sa.select(
                _LT.c.epoch,
                sa.func.set_config("idle_in_transaction_session_timeout", str(idle_timeout_ms), True),
            )
            .where(_LT.c.id == 1)
            .with_for_update(read=True)
        )
    else:
        q = sa.select(_LT.c.epoch).where(_LT.c.id == 1)
    current = int(conn.execute(q).one()[0])
    if current != epoch:
        raise NotLeader(
            f"this process no longer holds the leader lease (its epoch {epoch}, the lease is at {current}); "
            "nothing was written",
            current,
        )
