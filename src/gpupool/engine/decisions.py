"""What one scheduling cycle decides. Every decision carries a reason a person can read."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.model import PodPlacement


class PreemptRule(StrEnum):
    WITHIN_QUEUE = "WithinQueueLowerPriority"
    RECLAIM = "ReclaimWithinCohort"
    BORROW = "BorrowWithinCohortLowerPriority"
    #: fair-sharing preemption (a cohort root's ``spec.fairSharing.preemption``)
    FAIR_SHARE = "FairSharing"


class PendingCode(StrEnum):
    QUOTA = "QuotaExceeded"
    CAPACITY = "InsufficientCapacity"
    TOPOLOGY = "TopologyUnsatisfiable"
    NO_POOL = "NoMatchingPool"
    BLOCKED = "BlockedByHead"
    INVALID = "Invalid"
    UNKNOWN_QUEUE = "UnknownQueue"
    SKIPPED = "NotConsidered"
    #: cannot run on the pool's inventory now even with nothing else running (engine/feasible.py)
    UNSATISFIABLE = "Unsatisfiable"


@dataclass(frozen=True, slots=True)
class Admit:
    workload: str
    queue: str
    pool: str
    pods: tuple[PodPlacement, ...]
    borrowing: bool
    reason: str
    #: Victims that must be evicted before the pods start (empty when nothing is preempted).
    after_evicting: tuple[str, ...] = ()
    #: Elastic gangs whose extra pods must be removed before the pods start (``Shrink``).
    after_shrinking: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Victim:
    workload: str
    queue: str
    priority: int
    rule: PreemptRule
    reason: str


@dataclass(frozen=True, slots=True)
class Shrink:
    """A running elastic gang (``gang.minMember`` below its pod count) that loses only the pods
    above its minimum, as Volcano and KAI preempt elastic jobs: cheaper than evicting the whole
    job when those pods free enough. It keeps running with ``replicas`` pods (never below its
    ``gang_min``); ``pods`` are the removed placements, each recorded with ``reason``."""

    workload: str
    queue: str
    priority: int
    rule: PreemptRule
    reason: str
    pods: tuple[PodPlacement, ...]
    replicas: int


@dataclass(frozen=True, slots=True)
class Preempt:
    preemptor: str
    queue: str
    victims: tuple[Victim, ...]
    #: elastic gangs that lose only their extra pods for this preemptor
    shrinks: tuple[Shrink, ...] = ()


@dataclass(frozen=True, slots=True)
class Move:
    """A running preemptible workload moved so that ``for_workload`` can start (KAI's
    consolidation, ``engine/consolidation.py``): it is stopped on ``from_nodes`` and restarts at
    once on ``pods`` (reserved for it: nothing else was placed there), losing its progress."""

    workload: str
    queue: str
    pool: str
    from_nodes: tuple[str, ...]
    pods: tuple[PodPlacement, ...]
    for_workload: str
    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    workload: str
    queue: str
    code: PendingCode
    reason: str


@dataclass(slots=True)
class Decisions:
    admitted: list[Admit] = field(default_factory=list)
    preempted: list[Preempt] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    #: running work moved elsewhere so a blocked workload starts (consolidation)
    moved: list[Move] = field(default_factory=list)
    #: Workloads looked at in this cycle (for throughput figures).
    considered: int = 0
    #: Workloads passed as ``blocked`` that the cycle skipped (no pending entry for them).
    skipped: int = 0
    #: ``len(pending)`` when the cycle's last preemption was made: the entries from here on were
    #: decided after it, when capacity could only shrink (an incremental caller relies on that).
    pending_after_preemption: int = 0
    #: Workloads that waited for running work about to end rather than evict (their outcome
    #: depends on their own wait horizon, i.e. their declared duration).
    waited: set[str] = field(default_factory=set)

    def admitted_names(self) -> list[str]:
        return [a.workload for a in self.admitted]

    def victims(self) -> list[str]:
        return [v.workload for p in self.preempted for v in p.victims]

    def shrinks(self) -> list[Shrink]:
        """Every shrink of the cycle (running gangs that keep running with fewer pods)."""
        return [s for p in self.preempted for s in p.shrinks]

    def by_workload(self) -> dict[str, Admit | Pending]:
        out: dict[str, Admit | Pending] = {p.workload: p for p in self.pending}
        out.update({a.workload: a for a in self.admitted})
        return out

    def summary(self) -> dict[str, int]:
        return {
            "admitted": len(self.admitted),
            "preemptions": len(self.preempted),
            "victims": len(self.victims()),
            "shrinks": len(self.shrinks()),
            "pending": len(self.pending),
            "moves": len(self.moved),
            "considered": self.considered,
        }
