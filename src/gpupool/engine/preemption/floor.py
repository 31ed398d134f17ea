"""The guarantee floor (``spec.preemption.guaranteeFloor``): another queue's preemption never
takes a queue that sets it below its guarantee (YuniKorn's rule: a victim queue keeps its
guaranteed resources, so only what it borrows is taken back).

Why apart: the search asks it of each cross-queue candidate at the moment it would remove it
(earlier victims may have used up what the queue borrows), and the quota-only removal bound
(``reach``) is not applied when a floor is in play.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpupool.model import UNLIMITED, Vec

if TYPE_CHECKING:
    from gpupool.engine.state.quota import QuotaState


def floored(q: QuotaState, queue: str) -> bool:
    """Does any queue on ``queue``'s path set ``guaranteeFloor``?"""
    return any(q.queues[n].preemption.guarantee_floor for n in q.path[queue])


def breaks_floor(q: QuotaState, queue: str, pool: str, lca: str | None, vec: Vec) -> bool:
    """Would removing ``vec`` of ``queue``'s work leave a queue with ``guaranteeFloor`` on its
    path below ``lca`` under its guarantee in a guaranteed resource that ``vec`` takes (only
    what it borrows may go, never more)?"""
    for n in q.path[queue]:
        if n == lca:
            return False
        if not q.queues[n].preemption.guarantee_floor:
            continue
        u, g = q.U[(n, pool)], q.G[(n, pool)]
        if any(vec[d] > 0 and g[d] < UNLIMITED and u[d] - vec[d] < g[d] for d in range(len(u))):
            return True
    return False
