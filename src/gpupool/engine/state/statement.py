"""One transaction over the engine's three pieces of state: cluster, quota and running set.

A cycle tries admissions and preemptions on the live state and undoes what it does not keep
(KAI's ``framework/statement.go``): ``checkpoint`` marks a point, ``rollback`` returns to it,
``discard`` undoes the whole cycle, ``close`` keeps it. The undo logs themselves stay inside
the state classes (``ClusterState``, ``QuotaState``, ``RunningSet``), where their performance
idioms live; the control flow only ever names the statement, so the three can never drift apart.
"""

from __future__ import annotations

from gpupool.engine.state.cluster import ClusterState
from gpupool.engine.state.quota import QuotaState
from gpupool.engine.state.running import RunningSet

#: positions in the cluster, quota and running-set logs
Checkpoint = tuple[int, int, int]


class Statement:
    """Checkpoint, rollback and commit over cluster, quota and running set together."""

    __slots__ = ("_start", "cluster", "quota", "runs")

    def __init__(self, cluster: ClusterState, quota: QuotaState, runs: RunningSet) -> None:
        self.cluster = cluster
        self.quota = quota
        self.runs = runs
        self._start: tuple[int, int] = (0, 0)

    def open(self) -> None:
        """A cycle begins: from here on every change can be undone."""
        self._start = (self.cluster.checkpoint(), self.quota.checkpoint())
        self.runs.open()

    def checkpoint(self) -> Checkpoint:
        return (self.cluster.checkpoint(), self.quota.checkpoint(), self.runs.checkpoint())

    def rollback(self, cp: Checkpoint) -> None:
        """Undo a trial: the state is again what it was at ``cp``."""
        self.cluster.rollback(cp[0])
        self.quota.rollback(cp[1])
        self.runs.rollback(cp[2])

    def discard(self) -> None:
        """Undo the whole cycle and stop logging the running set."""
        self.cluster.rollback(self._start[0])
        self.quota.rollback(self._start[1])
        self.runs.discard()

    def close(self) -> None:
        """Keep what the cycle did (a caller that discards the engine afterwards)."""
        self.runs.close()

    def commit(self) -> None:
        """Outside a cycle: make the changes so far permanent (forget the undo logs)."""
        self.cluster.commit()
        self.quota.commit()
