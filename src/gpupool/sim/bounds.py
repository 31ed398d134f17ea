"""A lower bound on the makespan when one class of jobs must start the moment it arrives.

Why: on Kueue's scheduler performance baseline (``examples/sim/kueue-baseline.yaml``) the
large class arrives in waves that ask for the whole capacity for 1.0 s of every 1.2 s. If
every large job starts at its arrival, the rest of the work can only use the gaps between
waves, and a medium job (0.5 s) never fits in a 0.2 s gap: whatever runs across a wave's start
is evicted (lost) or makes the wave wait. So "at most 1.05x the physical limit" and "the large
class never waits" cannot both hold there; this module computes how far apart they are, from
the scenario's jobs alone (``docs/engine.md``, "Preemption cost").

The argument, for a protected class whose every job starts at its submission and runs
uninterrupted to its end (it is never evicted: nothing outranks it):

* its jobs fix the free capacity ``free(t) = capacity - protected use(t)``;
* ``P``, the end of the last moment the protected class holds everything (``free = 0``): any
  other job that ends by ``P`` ran wholly inside one interval where ``free > 0``, so a job of
  duration ``d`` can only be useful there if that interval lasts ``>= d``;
* ``F(d)``, the free capacity-seconds in such intervals before ``P``, bounds the useful work of
  the jobs of duration ``>= d``; so the other work done by ``P`` is at most
  ``U = min over d of (F(d) + work of the jobs shorter than d)``;
* everything else (the other work beyond ``U`` and the protected work after ``P``) runs after
  ``P`` on at most the whole capacity: ``makespan >= P + (rest) / capacity``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.sim.metrics import job_class, job_units
from gpupool.sim.sources import JobSpec

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ZeroWaitBound:
    """The bound and the figures it is made of (seconds, and capacity units x seconds)."""

    makespan_s: float
    physical_limit_s: float
    saturated_until_s: float  # P: the end of the last moment the protected class holds all
    useful_before_s: float  # U: the most other work that can be done by P
    other_work: float
    protected_after: float

    @property
    def ratio(self) -> float:
        """The bound over the physical limit (what the makespan ratio can be at best)."""
        return self.makespan_s / self.physical_limit_s if self.physical_limit_s else 0.0


def _profile(
    jobs: Sequence[JobSpec], starts: Mapping[str, float], resource: str
) -> list[tuple[float, float]]:
    """The protected use as steps: (time, use from then on), times increasing."""
    deltas: dict[float, float] = {}
    for j in jobs:
        u = job_units(j, resource)
        at = starts.get(j.name, j.submit)
        deltas[at] = deltas.get(at, 0.0) + u
        end = at + j.duration
        deltas[end] = deltas.get(end, 0.0) - u
    steps, use = [], 0.0
    for t in sorted(deltas):
        use += deltas[t]
        steps.append((t, use))
    return steps


def _free_intervals(
    steps: list[tuple[float, float]], start: float, capacity: float
) -> tuple[float, list[tuple[float, float]]]:
    """(P, the maximal intervals before P where free > 0, each as (length, free units x s))."""
    out: list[tuple[float, float]] = []
    sat_end = start
    cur_len = cur_area = 0.0
    prev_t, prev_use = start, 0.0
    for t, use in [*steps, (float("inf"), 0.0)]:
        span = max(0.0, t - max(prev_t, start))
        if span > 0:
            if prev_use >= capacity - _EPS:  # saturated: closes the free interval before it
                if cur_len > 0:
                    out.append((cur_len, cur_area))
                cur_len = cur_area = 0.0
                sat_end = t
            elif t != float("inf"):
                cur_len += span
                cur_area += span * (capacity - prev_use)
        prev_t, prev_use = t, use
    return sat_end, out


def zero_wait_bound(
    jobs: Sequence[JobSpec],
    capacity: float,
    protected: str,
    resource: str = "cpu",
    starts: Mapping[str, float] | None = None,
) -> ZeroWaitBound:
    """The least makespan of ``jobs`` on ``capacity`` units when every job of class
    ``protected`` (``metrics.job_class``: its label, else its priority class) starts at its
    submission (or at ``starts[name]``: where a run really started it) and is never evicted.
    Raises ValueError naming the argument when that is impossible (the class alone needs more
    than the capacity at some moment)."""
    if capacity <= 0:
        raise ValueError(f"capacity: must be positive, got {capacity}")
    mine = [j for j in jobs if job_class(j) == protected]
    if not mine:
        raise ValueError(f"protected: no job of class {protected!r}")
    others = [j for j in jobs if job_class(j) != protected]
    start = min(j.submit for j in jobs)
    at = starts or {}
    steps = _profile(mine, at, resource)
    peak = max(use for _, use in steps)
    if peak > capacity + _EPS:
        raise ValueError(f"protected: class {protected!r} alone needs {peak:g} > capacity {capacity:g}")
    sat_end, gaps = _free_intervals(steps, start, capacity)
    work = [(j.duration, job_units(j, resource) * j.duration) for j in others]
    other_work = sum(w for _, w in work)
    useful = other_work
    for d in sorted({0.0, *(d for d, _ in work)}):
        f = sum(area for length, area in gaps if length >= d - _EPS)
        useful = min(useful, f + sum(w for dd, w in work if dd < d - _EPS))
    after = sum(
        job_units(j, resource) * max(0.0, (t := at.get(j.name, j.submit)) + j.duration - max(t, sat_end))
        for j in mine
    )
    total = other_work + sum(job_units(j, resource) * j.duration for j in mine)
    limit = total / capacity
    bound = max(start + limit, sat_end + (other_work - useful + after) / capacity)
    return ZeroWaitBound(bound, limit, sat_end, useful, other_work, after)
