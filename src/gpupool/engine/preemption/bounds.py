"""The cheap bounds before a preemption search's placement trials: when even evicting every
candidate could not make room (by free GPU milli, then by whole free devices), no order of
them can, and the search is not run.

``SEARCH_SHORTCUTS``: the bounds that only save work (the property tests switch them off to
show that they change no decision): the device bounds before the candidates are sorted, and
``reach.reachable``'s bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from gpupool.engine.preemption.reach import reachable
from gpupool.engine.preemption.slots import WholeSlots
from gpupool.model import Vec, Workload

if TYPE_CHECKING:
    from gpupool.engine.preemption.candidates import Candidate
    from gpupool.engine.state.cluster import ClusterState
    from gpupool.engine.state.quota import QuotaState

SEARCH_SHORTCUTS = True


def device_bounds(
    cluster: ClusterState, w: Workload, pool: str, vec: Vec, cands: list[Candidate]
) -> WholeSlots | Literal[False] | None:
    """False when even evicting every candidate (in any order) could not make room, by free
    GPU milli, then by whole free devices; else the device count (None where it does not
    apply)."""
    if not cands:
        return False
    free_gpu = cluster.capacity[pool][0] - cluster.pool_used[pool]
    if free_gpu + sum(c.running.admission.quota_vec()[0] for c in cands) < vec[0]:
        return False
    slots = WholeSlots.of(cluster, w, pool)
    if slots is not None and not slots.could_fit_without(cands):
        return False
    return slots


def bounded_slots(
    cluster: ClusterState, quota: QuotaState, w: Workload, pool: str, vec: Vec, cands: list[Candidate]
) -> WholeSlots | Literal[False] | None:
    """The bounds before any trial: ``device_bounds``, then (with the shortcuts) the same
    bounds on what the search would remove at most (``reach.reachable``); False when they
    fail, else the device count to keep during the search (None where it does not apply)."""
    slots = device_bounds(cluster, w, pool, vec, cands)
    if slots is False:
        return False
    if SEARCH_SHORTCUTS:
        free_gpu = cluster.capacity[pool][0] - cluster.pool_used[pool]
        gone = reachable(quota, pool, cands)
        if gone is not None and (
            free_gpu + sum(r.admission.quota_vec()[0] for r in gone) < vec[0]
            or (slots is not None and not slots.could_fit_after(gone))
        ):
            return False
    return slots
