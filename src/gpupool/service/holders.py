"""Why not yet, and when: who holds what a pending workload needs, and when it should start.

Why in the service and not the engine: the engine is pure and keeps nothing between cycles; its
reason names the scope (pool, queue or cohort) and the figures, but it knows no owners and no
wall clock. This module reads the engine's state between cycles (under the controller's lock)
and answers two questions ``explain`` adds to the reason:

- **holders**: for a quota wait, the running work of the blocking queue's subtree in that pool
  (for the cohort: the queues that borrow, else all of it); for a capacity or topology wait, the
  running work on the nodes it would be held (``holds.plan_hold``), else on the pool's nodes;
  largest first.
- **estimated start** (Slurm's ``squeue --start``): the earliest time the running work is
  expected to free enough, from declared durations. For capacity, the engine's own hold plan
  over expected device ends; for quota, the holders' ends in order until the quota check (the
  engine's ``QuotaState.check``, inside a rolled-back change) passes. Work ahead of it in the
  queue is not simulated: the estimate is a lower bound, as Slurm's is without backfill.

Time: the engine's clock is the controller's (epoch seconds) and a declared duration is in the
backend's time, which the virtual backend runs ``time_scale`` times faster; so an expected end
is ``admitted_at + duration / time_scale`` (what the virtual backend itself does). Scaling every
time by the same factor scales every end alike: the same workloads are named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from gpupool.engine import Engine
from gpupool.engine.holds import Holds, plan_hold
from gpupool.engine.reasons import workload_kind
from gpupool.engine.state.running import RunningSet
from gpupool.model import Running, Workload, device_noun
from gpupool.quantity import format_gpu

#: the holders shown (the rest are counted)
TOP = 5
#: what a caller may not read is shown as (as ``get node`` shows another team's work)
HIDDEN = "(another team)"
NO_DURATION = "no estimate: running work declares no duration"
QUOTA_CODES = frozenset({"QuotaExceeded"})
CAPACITY_CODES = frozenset({"InsufficientCapacity", "TopologyUnsatisfiable"})
CODES = QUOTA_CODES | CAPACITY_CODES


@dataclass(frozen=True, slots=True)
class Holder:
    """A running workload holding part of what a pending one needs."""

    name: str
    queue: str
    #: what it holds in the scope (device milli): its charge to the quota, or its devices there
    gpu_milli: int
    #: expected end, epoch seconds (None: it declares no duration)
    end: float | None


@dataclass(slots=True)
class Wait:
    """What a pending workload waits for: the scope, its holders, the usage and the estimate."""

    scope: dict[str, Any]
    holders: list[Holder]
    usage: str
    now: float
    start: float | None = None
    after: list[Holder] = field(default_factory=list)
    #: why there is no estimate (empty when there is one)
    why_none: str = ""


class WaitReader:
    """Reads one pending workload's wait from the engine's state (call under the controller's
    lock, between cycles; the quota estimate changes the quota state and rolls it back)."""

    def __init__(self, engine: Engine, time_scale: float = 1.0) -> None:
        self.eng = engine
        self.scale = time_scale if time_scale > 0 else 1.0

    def end(self, r: Running) -> float | None:
        d = r.workload.expected_duration_s
        return None if d is None else r.admission.admitted_at + d / self.scale

    def read(self, w: Workload, code: str, now: float) -> Wait | None:
        """The wait of ``w`` pending with ``code`` (None for codes no running work explains)."""
        q = self.eng.quota
        if w.queue not in q.path:
            return None
        vec = w.quota_vec()
        for pool in self.eng.candidate_pools(w):
            fits, _, blk, dim = q.check(w.queue, pool, vec)
            if code in QUOTA_CODES and not fits:
                assert blk is not None and dim is not None
                return self._quota(w, pool, blk, now, False)
            if code in CAPACITY_CODES and fits:
                return self._capacity(w, pool, now)
        pools = self.eng.candidate_pools(w)
        if code in QUOTA_CODES and pools:  # non-preemptible work: admitted only within guarantee
            return self._quota(w, pools[0], w.queue, now, True)
        return None

    # -- quota --------------------------------------------------------------------------------
    def _quota(self, w: Workload, pool: str, blk: str, now: float, guarantee_only: bool) -> Wait:
        q = self.eng.quota
        root = q.root[w.queue]
        inside = [
            r
            for r in self.eng.running.values()
            if r.admission.pool == pool and blk in q.path.get(r.workload.queue, ())
        ]
        shown = inside
        if blk == root:  # the cohort: the queues that use more than their guarantee
            shown = [r for r in inside if q.is_borrowing(r.workload.queue, pool, stop_at=root)] or inside
        kind = "cohort" if blk == root else "queue"
        holders = _largest(
            [Holder(r.name, r.workload.queue, r.admission.quota_vec()[0], self.end(r)) for r in shown]
        )
        wait = Wait({"kind": kind, "name": blk, "pool": pool}, holders, self._usage(w, pool, blk), now)
        self._quota_start(wait, w, inside, pool, guarantee_only)
        return wait

    def _quota_start(
        self, wait: Wait, w: Workload, inside: list[Running], pool: str, guarantee_only: bool
    ) -> None:
        """Take the blocking subtree's work away in order of expected end until the quota check
        passes (within guarantee, for work that may not borrow): the end of the last one taken
        is the estimate (rolled back afterwards)."""
        q = self.eng.quota
        vec = w.quota_vec()

        def fits() -> bool:
            if guarantee_only:
                return q.within_guarantee(w.queue, pool, vec)
            return q.check(w.queue, pool, vec)[0]

        order = sorted(inside, key=lambda r: (_inf(self.end(r)), r.name))
        cp = q.checkpoint()
        try:
            taken: list[Holder] = []
            for r in order:
                end = self.end(r)
                if end is None:
                    wait.why_none = NO_DURATION
                    return
                q.remove(r.workload.queue, pool, r.admission.quota_vec())
                taken.append(Holder(r.name, r.workload.queue, r.admission.quota_vec()[0], end))
                if fits():
                    wait.start = max(end, wait.now)
                    wait.after = sorted(taken, key=lambda h: (-_inf(h.end), h.name))
                    return
            wait.why_none = "no estimate: it would not fit the quota even when all of this work ends"
        finally:
            q.rollback(cp)

    # -- capacity -----------------------------------------------------------------------------
    def _capacity(self, w: Workload, pool: str, now: float) -> Wait:
        eng = self.eng
        st = eng.cluster
        ahead = _ahead(eng.placer.holds, w, pool)
        plan = plan_hold(w, pool, st, eng.placer.node_filter, self._scaled_runs(), now, ahead)
        if plan is not None:
            nodes = {st.nodes[i].name for i in plan.nodes}
        else:
            nodes = {n.name for i, n in enumerate(st.nodes) if st.pool_of[i] == pool}
        on = [(r, _milli_on(r, nodes)) for r in eng.running.values()]
        holders = _largest([Holder(r.name, r.workload.queue, m, self.end(r)) for r, m in on if m])
        scope: dict[str, Any] = {"kind": "pool", "name": pool, "pool": pool}
        if plan is not None:
            scope["nodes"] = sorted(nodes)
        wait = Wait(scope, holders, self._usage(w, pool, w.queue), now)
        if plan is None and any(pg.request.gpus == 0 for pg in w.pod_groups):
            wait.why_none = "no estimate: only whole-GPU requests are estimated"
        elif plan is None:  # the devices are free or overdue (plan_hold), or no domain is large enough
            wait.why_none = (
                "no estimate: the GPUs it needs are free or past their expected end, or no group of"
                " the pool's nodes is large enough; CPU, memory, topology or late work holds it"
            )
        elif plan.start == float("inf"):
            wait.why_none = NO_DURATION
        else:
            wait.start = start = plan.start
            ended = [h for h in holders if h.end is not None and h.end <= start]
            wait.after = sorted(ended, key=lambda h: (-_inf(h.end), h.name))
            first = ahead.by_workload.get(plan.after)
            if first is not None:  # it waits for a job planned to start before it
                wait.after.insert(0, Holder(first.workload, first.queue, 0, first.end))
        return wait

    def _scaled_runs(self) -> RunningSet:
        """The running set's expected device ends on the controller's clock (see the module's
        doc). ``plan_hold`` reads only ``busy_ends``, so at another time scale it gets an object
        that answers that from the engine's index, per node asked: rebuilding the set took
        about 200 ms for 2,000 running workloads under the controller's lock, this about 60."""
        if self.scale == 1.0:
            return self.eng.runs
        return cast(RunningSet, _ScaledEnds(self.eng.runs, self.scale))

    # -- usage --------------------------------------------------------------------------------
    def _usage(self, w: Workload, pool: str, blk: str) -> str:
        """Per pool and per queue, both: people think of the pool, quota counts per queue."""
        st, q = self.eng.cluster, self.eng.quota
        noun = device_noun(workload_kind(w)) + "s"
        ix = [i for i in range(len(st.nodes)) if st.pool_of[i] == pool]
        total = sum(st.nodes[i].gpu_count for i in ix) * 1000
        bad = sum(len(st.withheld.get(i, ())) for i in ix) * 1000
        text = f"pool {pool}: {format_gpu(st.used_gpu_milli(pool) - bad)} of {format_gpu(total)} {noun} allocated"
        if bad:
            text += f" ({format_gpu(bad)} unhealthy)"
        f = q.figures(blk, pool)
        if f is None:  # not in the tree (it always is: blk was found on it)
            return text
        used, g = format_gpu(f.used[0]), format_gpu(f.guarantee[0])
        if blk == q.root[w.queue]:
            return f"{text}; cohort {blk}: in use {used} of {g}"
        return f"{text}; queue {blk}: in use {used} of guarantee {g}"


def _ahead(holds: Holds, w: Workload, pool: str) -> Holds:
    """The last cycle's holds in ``pool`` ranked before ``w`` (all of them when it holds none):
    its planned start comes after theirs, as the engine planned it (Slurm's ``--start``)."""
    out = Holds()
    for h in holds.of_pool(pool):
        if h.workload == w.name:
            break
        out.add(h)
    return out


class _ScaledEnds:
    """``RunningSet.busy_ends`` and ``ending_at`` with each duration divided by the time scale."""

    __slots__ = ("runs", "scale")

    def __init__(self, runs: RunningSet, scale: float) -> None:
        self.runs = runs
        self.scale = scale

    def busy_ends(self, node: str) -> list[float]:
        ends = self.runs.dev_ends.get(node, {}).values()
        return sorted(max([0.0, *(self._scaled(n, e) for n, e in dev.items())]) for dev in ends)

    def ending_at(self, node: str, t: float) -> str:
        """``RunningSet.ending_at`` on the scaled ends."""
        for dev in self.runs.dev_ends.get(node, {}).values():
            for name, end in dev.items():
                if self._scaled(name, end) == t:
                    return name
        return ""

    def _scaled(self, name: str, end: float) -> float:
        """``name``'s expected end with its run time divided by the scale (never: stays never)."""
        if end == float("inf"):
            return end
        at = self.runs.by_name[name].admission.admitted_at
        return at + (end - at) / self.scale


def _inf(t: float | None) -> float:
    return float("inf") if t is None else t


def _largest(hs: Iterable[Holder]) -> list[Holder]:
    return sorted(hs, key=lambda h: (-h.gpu_milli, h.name))


def _milli_on(r: Running, nodes: set[str]) -> int:
    return sum(p.gpu_milli * len(p.devices) for p in r.admission.pods if p.node in nodes)


# ---------------------------------------------------------------------- what the caller sees
def iso(t: float | None) -> str | None:
    return (
        None
        if t is None or t == float("inf")
        else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")
    )


def present(
    wait: Wait, readable: Callable[[str], bool], owner_of: Callable[[str], str | None]
) -> dict[str, Any]:
    """``explain``'s fields for ``wait``: a holder the caller may not read is "(another team)",
    without its owner (``readable(queue)``; ``owner_of(name)`` for the rest)."""

    def one(h: Holder) -> dict[str, Any]:
        ok = readable(h.queue)
        v: dict[str, Any] = {"name": h.name if ok else HIDDEN, "queue": h.queue}
        if ok:
            v["owner"] = owner_of(h.name)
        v["gpus"] = h.gpu_milli / 1000
        v["expectedEnd"] = iso(h.end)
        return v

    after = [one(h) for h in wait.after]
    return {
        "scope": wait.scope,
        "holders": [one(h) for h in wait.holders[:TOP]],
        "holdersNotShown": max(0, len(wait.holders) - TOP),
        "usage": wait.usage,
        "estimatedStart": iso(wait.start),
        "after": after,
        "estimate": _sentence(wait, after),
    }


def _sentence(wait: Wait, after: list[dict[str, Any]]) -> str:
    """ "estimated start 14:20 UTC, after llama-70b ends", or why there is none."""
    if wait.start is None:
        return wait.why_none
    at = datetime.fromtimestamp(wait.start, UTC)
    same_day = at.date() == datetime.fromtimestamp(wait.now, UTC).date()
    text = "estimated start " + at.strftime("%H:%M UTC" if same_day else "%Y-%m-%d %H:%M UTC")
    if not after:
        return text
    first = after[0]["name"]
    more = f" and {len(after) - 1} more end" if len(after) > 1 else " ends"
    return f"{text}, after {first}{more}"


__all__ = ["CODES", "HIDDEN", "NO_DURATION", "TOP", "Holder", "Wait", "WaitReader", "iso", "present"]
