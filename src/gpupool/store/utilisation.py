"""Hourly GPU utilisation rollups (利用率 / 显存): what allocated GPUs computed, per workload,
queue, pool and hour, kept for a retention period.

Why hourly rollups and not samples: a sample every few seconds per device is too much to keep
for weeks, and every question asked of it (allocated vs used per team, a week's idle
allocations) is a sum over hours. Each row holds sums, so hours add up exactly and a pass that
writes the same hour again adds to it (``add``), never overwrites it.

Why a repository of its own, not another ``Store`` mixin: it owns one table and a narrow
interface (add, read a period, prune), and is given the ``Database`` whose transactions it uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from gpupool.store.database import Database
from gpupool.store.schema import Base


class UtilisationRow(Base):
    __tablename__ = "gpu_utilisation_hourly"

    hour: Mapped[datetime] = mapped_column(primary_key=True)
    workload: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    queue: Mapped[str] = mapped_column(sa.String(253))
    pool: Mapped[str] = mapped_column(sa.String(253))
    #: seconds of this hour with at least one sample of the workload's devices
    sampled_s: Mapped[float] = mapped_column(sa.Float())
    #: GPU-seconds allocated over the sampled time (GPUs held x seconds)
    gpu_s: Mapped[float] = mapped_column(sa.Float())
    #: GPU-seconds used: allocated GPU-seconds x measured SM utilisation (0-1)
    used_gpu_s: Mapped[float] = mapped_column(sa.Float())
    #: byte-seconds of GPU memory in use (divide by sampled_s for the mean)
    memory_byte_s: Mapped[float] = mapped_column(sa.Float())
    memory_max_bytes: Mapped[int] = mapped_column(sa.BigInteger())
    #: seconds and GPU-seconds held idle: in a below-threshold stretch that lasted its idleFor
    idle_s: Mapped[float] = mapped_column(sa.Float())
    idle_gpu_s: Mapped[float] = mapped_column(sa.Float())


@dataclass(frozen=True, slots=True)
class Rollup:
    """One workload's hour (see :class:`UtilisationRow` for the fields)."""

    hour: datetime
    workload: str
    queue: str
    pool: str
    sampled_s: float = 0.0
    gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    memory_byte_s: float = 0.0
    memory_max_bytes: int = 0
    idle_s: float = 0.0
    idle_gpu_s: float = 0.0


#: the fields that add up when two rollups of one hour and workload meet
SUMS = ("sampled_s", "gpu_s", "used_gpu_s", "memory_byte_s", "idle_s", "idle_gpu_s")
_FIELDS = tuple(f.name for f in fields(Rollup))


class UtilisationRollups:
    """Add to, read and prune the hourly rollups, in the given store's transactions."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, rollups: Sequence[Rollup]) -> None:
        """Add each rollup's sums to its (hour, workload) row, creating it when new; the
        memory maximum is the larger of the two. One transaction (a leader's fenced write)."""
        if not rollups:
            return
        with self.db.write() as s:
            for r in rollups:
                row = s.get(UtilisationRow, (r.hour, r.workload), with_for_update=True)
                if row is None:
                    s.add(UtilisationRow(**{f: getattr(r, f) for f in _FIELDS}))
                    continue
                for f in SUMS:
                    setattr(row, f, getattr(row, f) + getattr(r, f))
                row.memory_max_bytes = max(row.memory_max_bytes, r.memory_max_bytes)
                row.queue, row.pool = r.queue, r.pool

    def between(self, start: datetime, end: datetime) -> list[Rollup]:
        """Every rollup whose hour starts in ``[start, end)``, by hour then workload."""
        q = (
            sa.select(UtilisationRow)
            .where(UtilisationRow.hour >= start, UtilisationRow.hour < end)
            .order_by(UtilisationRow.hour, UtilisationRow.workload)
        )
        with self.db.read() as s:
            return [Rollup(**{f: getattr(r, f) for f in _FIELDS}) for r in s.execute(q).scalars()]

    def prune(self, before: datetime) -> int:
        """Drop the hours that start before ``before`` (the retention); how many rows went."""
        with self.db.write() as s:
            res = s.execute(sa.delete(UtilisationRow).where(UtilisationRow.hour < before))
            return int(getattr(res, "rowcount", 0) or 0)


__all__ = ["SUMS", "Rollup", "UtilisationRollups", "UtilisationRow"]
