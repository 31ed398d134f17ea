"""Cost-aware preemption: which victims are cheapest to evict, and when not to evict at all.

Why: eviction order by priority and age alone lets a wave of high-priority work throw away
whatever lower-priority work was admitted in the gap before it, again and again (a preemption
storm: Kueue's scheduler performance baseline lost 13% of its capacity that way). Three rules
make preemption weigh what it destroys, each a knob of ``EngineConfig`` (``docs/engine.md``,
"Preemption cost"):

* **Lost work.** Among victims of equal tier and priority (``ordering.candidate_order``), the
  one that loses the least per unit it frees goes first: elapsed run time, times one more for
  every time it was evicted before (a workload that already lost runs is dearer to evict again).
* **Wait for work about to finish.** When the running work expected to end within a horizon
  (``preemption_wait_fraction`` of the preemptor's own expected run time; at most
  ``preemption_wait_s`` where a caller declares that cap) would free enough for the preemptor (quota and placement, tried on the
  engine's own state), the preemptor waits instead of evicting: it is delayed by at most that
  horizon, and nobody's work is thrown away. A priority class's ``spec.preemptionWait``
  replaces the horizon for its workloads (``0s``: evict at once); with
  ``preemption_wait_after_evictions`` only work evicted that often before is waited for.
* **Cooldown.** A workload admitted less than ``preemption_cooldown_s`` ago is not a victim.

Pure like the rest of the engine: time is the snapshot's ``now``, expected ends come from each
workload's ``expected_duration_s``, eviction counts from ``Workload.evictions`` (the caller's).
No rule holds an absolute number of seconds (docs/engine.md, "Time-scale invariance"): the
horizon is a share of the preemptor's duration, its rounding is relative, the tie tolerance is
relative to the times compared, and the cap and the cooldown are the caller's declared settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import groupby
from typing import TYPE_CHECKING

from gpupool.engine.preemption.slots import WholeSlots
from gpupool.model import Running

if TYPE_CHECKING:
    from gpupool.engine.preemption.candidates import Candidate
    from gpupool.engine.session import Session
    from gpupool.model import EngineConfig, Vec, Workload

#: the preemptor's trial: would ``w`` fit in ``pool`` (quota, the search's rules, placement) now
FitsNow = Callable[["Workload", str, "Vec"], bool]

_INF = float("inf")
#: expected ends this close past the horizon count as within it, as a share of the times
#: compared (``tie_tolerance``): sums of float times (admitted at 2.2, runs 0.5 s; horizon 0.3 s
#: from 2.4: 2.7 > 2.6999...) otherwise land on either side of one instant, and alike workloads
#: wait or evict by rounding luck (11 of the Kueue baseline's 50 waves did). Relative, not a
#: number of seconds (it was 1e-9 s): float error grows with the times, so in other units the
#: same instants need a tolerance in those units
TIE_REL = 1e-12
#: steps of the duration bands per decade (``duration_band``): a third of a decade, about the
#: power of two it replaces (x2.15), and a band maps onto a band under any power of ten
BANDS_PER_DECADE = 3
#: a duration this close (relatively) below a band's edge is on the edge (``log10`` rounding)
_EDGE_REL = 1e-9


def tie_tolerance(now: float, horizon: float) -> float:
    """How far past ``now + horizon`` an expected end still counts as within it: a share of
    the magnitudes compared (scaling every time by k scales it by k)."""
    return TIE_REL * (abs(now) + horizon)


def expected_end(r: Running) -> float:
    """When ``r`` is expected to end (never, when it declares no duration)."""
    d = r.workload.expected_duration_s
    return _INF if d is None else r.admission.admitted_at + d


def cost_key(r: Running, now: float) -> tuple[float, float]:
    """Within a tier and priority: the least lost work *per unit freed* first (run time x (1 +
    earlier evictions): freeing a GPU from a big victim or from small ones loses the same per
    GPU, so size does not order; on Philly, ordering by total lost work evicted many small jobs
    and threw more away), then the one with the most left to run (it frees its place latest)."""
    elapsed = max(0.0, now - r.admission.admitted_at)
    return (elapsed * (1 + r.workload.evictions), -expected_end(r))


def choose_victims(cfg: EngineConfig, now: float, cands: list[Candidate]) -> list[Candidate]:
    """The candidates the cost model allows, in its order: cooled-down ones only; within each
    run of candidates of one tier and priority (as the search ordered them) the least lost work
    first. The sort is stable, so where costs tie the search's own order stands (a
    fair-sharing or name order the candidate search chose is kept)."""
    if not cfg.preemption_cost or not cands:
        return cands
    cool = cfg.preemption_cooldown_s
    if cool > 0:
        cands = [c for c in cands if now - c.running.admission.admitted_at >= cool]
    mine = cands[0].preemptor.queue if cands else ""
    out: list[Candidate] = []
    for _, run in groupby(
        cands, key=lambda c: (c.running.workload.queue == mine, c.running.workload.priority)
    ):
        out.extend(sorted(run, key=lambda c: cost_key(c.running, now)))
    return out


def duration_band(d: float | None) -> int | None:
    """The band a duration falls in: ``j`` with ``10**(j/3) <= d < 10**((j+1)/3)`` (thirds of
    a decade). The wait horizon is a function of it, so workloads alike but for a slightly
    different duration wait alike (a caller that groups interchangeable workloads, like the
    simulator, groups by it too). Why not powers of two, as before: 1 s and 1000 s fell in
    octaves 0 and 9 (512 s), so the same scenario in seconds waited 0.512x as long as in
    milliseconds; decade thirds map onto each other under any power of ten (ms, s, ks)."""
    if d is None or not d > 0:
        return None
    return math.floor(BANDS_PER_DECADE * math.log10(d) + _EDGE_REL)


def band_floor(j: int) -> float:
    """The shortest duration of band ``j``."""
    return float(10.0 ** (j / BANDS_PER_DECADE))


def wait_horizon(cfg: EngineConfig, w: Workload) -> float:
    """How long ``w`` may wait for running work to end rather than evict (0: not at all).

    Its priority class's ``preemptionWait`` when set (``Workload.preemption_wait_s``): the
    operator's choice per class, e.g. 0 for serving that must never wait; it needs no declared
    duration. Otherwise a share of its expected run time (rounded down to its band), capped
    only by ``preemption_wait_s`` where the caller declares a cap (default: none; the 600 s it
    was held day-long jobs to ten minutes): relative, so one setting fits sub-second jobs and
    day-long ones alike, in any unit of time."""
    if not cfg.preemption_cost:
        return 0.0
    if w.preemption_wait_s is not None:
        return max(0.0, w.preemption_wait_s)
    j = duration_band(w.expected_duration_s)
    if j is None:
        return 0.0
    h = cfg.preemption_wait_fraction * band_floor(j)
    cap = cfg.preemption_wait_s
    return max(0.0, h if cap is None else min(cap, h))


def should_wait(
    ssn: Session, fits_now: FitsNow, w: Workload, pool: str, vec: Vec, memo: tuple[object, ...]
) -> bool:
    """Whether ``w`` should wait for running work about to end instead of evicting anyone:
    the work of ``pool`` expected to end within the horizon, released on the engine's state,
    makes room for it (quota and a real placement trial, ``fits_now``; undone after). A yes is remembered
    for the cycle under ``memo`` and the horizon (the preemption search's memo: capacity only
    shrinks until a preemption, which clears it), so each later workload alike waits too."""
    horizon = wait_horizon(ssn.config, w)
    if horizon <= 0:
        return False
    key = (*memo, "wait", horizon)
    failed = ssn.cs.preempt_failed
    if key in failed or _room_after_ending(ssn, fits_now, w, pool, vec, horizon):
        failed.add(key)
        ssn.cs.waited.add(w.name)
        return True
    return False


def waits_again(ssn: Session, w: Workload, memo: tuple[object, ...]) -> bool:
    """Has a workload of ``w``'s class (``memo``: queue, priority, pool, shape) already waited
    in this cycle at ``w``'s horizon? Then ``w`` waits too, without a search.

    Why: the answer was already "wait" whatever the search found (a failed search waits as
    well), and on the Philly replay these repeated searches were a third of the preemption
    cost. The one thing skipped is the search's own mark when it would now fail: a later
    member of the class at another horizon then searches instead of being refused at once,
    at a state no looser (nothing is freed until a preemption, which clears every mark).
    The Philly prefix and the Kueue baseline decide identically with and without it."""
    horizon = wait_horizon(ssn.config, w)
    if horizon > 0 and (*memo, "wait", horizon) in ssn.cs.preempt_failed:
        ssn.cs.waited.add(w.name)
        return True
    return False


def _room_after_ending(
    ssn: Session, fits_now: FitsNow, w: Workload, pool: str, vec: Vec, horizon: float
) -> bool:
    """Would ``w`` fit once the work of ``pool`` expected to end within ``horizon`` has ended?"""
    now = ssn.now
    limit = now + horizon + tie_tolerance(now, horizon)
    ending = [
        r
        for (p, _), rs in ssn.runs.by_pq.items()
        if p == pool
        for r in rs.values()
        if now <= expected_end(r) <= limit  # overdue work: nobody knows when it ends
        and r.workload.evictions >= ssn.config.preemption_wait_after_evictions
    ]
    if not ending or not _could_fit_after(ssn, w, pool, vec, ending):
        return False
    stmt = ssn.stmt
    cp = stmt.checkpoint()
    try:
        for r in ending:
            ssn.free_for_trial(r)  # the trial reads cluster and quota only
        return fits_now(w, pool, vec)
    finally:
        stmt.rollback(cp)


def _could_fit_after(ssn: Session, w: Workload, pool: str, vec: Vec, ending: list[Running]) -> bool:
    """The cheap necessary conditions before the trial (the preemption search's own bounds):
    enough GPU milli free once ``ending`` is gone, and for a one-shape whole-GPU workload enough
    whole devices by count. Why: on the Philly replay most waits are refused, and the trial
    (release every ending workload, place, roll back) was a third of the replay's CPU."""
    cl = ssn.cluster
    free_gpu = cl.capacity[pool][0] - cl.pool_used[pool]
    if free_gpu + sum(r.admission.quota_vec()[0] for r in ending) < vec[0]:
        return False
    slots = WholeSlots.of(cl, w, pool)
    return slots is None or slots.could_fit_after(ending)
