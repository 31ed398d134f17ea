"""Who a preemption evicts first, and who may evict whom within a queue or when borrowing.

The order is one function, ``candidate_order``, as in Kueue's
``pkg/scheduler/preemption/common/ordering.go`` (``CandidatesOrdering``): the candidate finder
(``candidates.CandidateFinder``) collects the legal victims and sorts them by it; nothing else
decides who goes first.
"""

from __future__ import annotations

from gpupool.engine.preemption.victim_cost import cost_key
from gpupool.model import PreemptionPolicy, ReclaimPolicy, Running, Workload


def candidate_order(
    victim: Running, preemptor_queue: str, now: float | None = None
) -> tuple[int, int, float, float, float, float, str]:
    """Sort key of a preemption candidate: the smallest key is evicted first.

    1. Work of *other* queues (reclaimed or borrowed capacity) before work of the preemptor's own
       queue: taking back what others borrow leaves the preemptor's queue its own work (Kueue's
       criterion "other ClusterQueues first").
    2. Lower priority first: the least important work goes.
    3. With ``now`` (the cost model, ``victim_cost.cost_key``): the least lost work per unit
       freed first (run time x (1 + earlier evictions)), then the most left to run.
    4. Most recently admitted first: it has lost the least progress.
    5. Among work admitted at the same time (the same cycle), the latest arrival first (Kueue
       and Volcano break this tie by creation order, the UID-like sequence; gpupool's is
       ``arrival``): the last submitted is the least entitled to stay.
    6. The name: a total order, so the choice never depends on how the candidates were found.
    """
    v = victim.workload
    cost = (0.0, 0.0) if now is None else cost_key(victim, now)
    tier = int(v.queue == preemptor_queue)
    return (tier, v.priority, *cost, -victim.admission.admitted_at, -v.arrival, v.name)


def within_queue_victim(w: Workload, v: Workload, newer_equal: bool) -> bool:
    """May ``w`` evict ``v`` of its own queue: lower priority, or, with ``withinQueue:
    LowerOrNewerEqualPriority``, equal priority and queued after ``w`` (Kueue's rule: the victim
    cannot evict ``w`` back, since ``w`` is older)."""
    if v.priority != w.priority:
        return v.priority < w.priority
    return newer_equal and (v.arrival, v.name) > (w.arrival, w.name)


def within_threshold(pol: PreemptionPolicy, v: Workload) -> bool:
    """May a borrowing preemptor evict ``v`` under ``borrowWithinCohort.maxPriorityThreshold``?
    Kueue's guard: borrowing may displace only work at or below a set priority, so a team that
    borrows never evicts another team's important work however high its own priority."""
    return pol.borrow_max_priority is None or v.priority <= pol.borrow_max_priority


def reclaimable(policy: ReclaimPolicy, w: Workload, v: Workload) -> bool:
    """May ``w`` take back borrowed capacity from ``v`` under ``reclaimWithinCohort``: ``Any``,
    ``LowerOrEqualPriority`` (not higher than ``w``: a borrower of equal importance gives way
    to the guarantee's owner, a more important one does not) or ``LowerPriority``."""
    if policy is ReclaimPolicy.ANY:
        return True
    if policy is ReclaimPolicy.LOWER_OR_EQUAL_PRIORITY:
        return v.priority <= w.priority
    return policy is ReclaimPolicy.LOWER_PRIORITY and v.priority < w.priority
