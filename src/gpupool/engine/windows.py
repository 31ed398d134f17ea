"""The one window planner: which pending workloads each engine cycle is given, proven exact.

Both windowed callers use it: the simulator (``gpupool.sim.simulator``, over its incremental
``gpupool.sim.pending.PendingSet``) and the controller (``gpupool.service.windows``, over a
backlog built for each cycle). It is pure: the engine, the backlog and the time in, decisions
out; ``Engine.cycle`` has no side effects, so a cycle can be run again with larger windows.

The window rule
---------------
The engine's cost grows with the pending list, and most of a long backlog cannot move. Pending
workloads are grouped per queue into *classes* of identical scheduling shape
(``gpupool.engine.signature.scheduling_signature``: with the exact declared duration, only its
band, or without it, ``Backlog.durations``), each class ordered by the engine's own order key.
A cycle is given:

* the workloads a caller passes ``whole`` (the controller's StrictFIFO queues and over-quota
  trees);
* for a queue in ``head_queues`` (StrictFIFO), or any queue when ``one_head`` is on: the first
  ``K`` pending workloads of the queue in order (a *queue window*);
* for any other queue: the first ``k`` members of each class (a *class window*); with
  ``blocked_heads``, a class whose head can neither be placed nor preempt at the cycle's start
  is given its head only, as ``blocked`` (capacity only shrinks until something is preempted,
  so every member would fail).

A class window whose last member is admitted grows by one during the cycle (the engine's
``more``) instead of the cycle being run again. After the cycle the planner checks that the
windows could not have changed the outcome, and otherwise enlarges them and runs the cycle again:

* StrictFIFO queue window: some member was not admitted. Everything after it was BLOCKED (or
  SKIPPED) by the engine, so members outside the window would be too.
* one-head queue window: some member was SKIPPED, i.e. the engine stopped inside the window.
* class window: some member was tried and failed (QuotaExceeded, InsufficientCapacity,
  TopologyUnsatisfiable, NoMatchingPool, Unsatisfiable) after the cycle's last preemption. A
  later member of the same class is tried later in the same cycle with the same quota vector,
  at a state that only got tighter (nothing is freed after the last preemption), so it fails
  too, and a failure changes no state. Where a pool plans more than one start, the witness must
  also have taken no hold (a failure that took a hold changed the state). A window that grew to
  its whole class needs no witness.
* wait horizon, for classes without the duration: a witness that waited for running work to end
  instead of evicting (``Decisions.waited``) proves only the members of its duration band (the
  horizon is a function of the band; a member with a shorter one might evict). The first member
  left out of each other band is given besides the window, as that band's witness, and the
  cycle runs again (``WindowPlanner._band_witnesses``). A witness that did not wait proves every
  member: its search failed (the class is marked for the cycle whatever the duration) or never
  ran.
* backfill, for classes by duration band only: while nodes are held, a member short enough to
  backfill around a hold needs a failed witness that was short enough too; otherwise such
  members are given up front. (A class of one exact duration has every member as short as its
  witness.)

If a cycle with ``blocked`` heads or grown windows preempted, it runs again without either (the
preemption freed capacity the proofs assumed taken). A caller that says what changed since the
last cycle (``Changes``) is given only the classes and queues whose head changed, the newcomers
and the last holders while the state is unchanged, and every window once the cycle admits,
preempts or moves the held nodes. The members left out of a class window get their class
witness's reason (``WindowPlanner.left_out``). ``tests/sim/test_sim.py`` and
``tests/service/test_windows.py`` check on generated traces, clusters and backlogs that all this
gives the same results as passing every pending workload to every cycle.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from gpupool.engine.backlog import Backlog, Changes, declared_duration
from gpupool.engine.core import Engine
from gpupool.engine.decisions import Decisions, Pending, PendingCode
from gpupool.engine.fragscore import add_shapes
from gpupool.engine.holds import Holds
from gpupool.engine.ordering import workload_order_key
from gpupool.engine.preemption.victim_cost import duration_band
from gpupool.model import Workload

#: the codes of a member that was tried and failed: a witness for the rest of its class
FAILED = frozenset(
    {
        PendingCode.QUOTA,
        PendingCode.CAPACITY,
        PendingCode.TOPOLOGY,
        PendingCode.NO_POOL,
        PendingCode.UNSATISFIABLE,
    }
)


class _Windows:
    """One attempt's windows: what the cycle is given, and which windows were cut short."""

    __slots__ = (
        "blocked",
        "c_trunc",
        "done",
        "given",
        "n_whole",
        "passed",
        "pend",
        "pulled",
        "q_trunc",
        "seen",
    )

    def __init__(self, pend: Backlog, whole: Sequence[Workload]) -> None:
        self.pend = pend
        #: the caller's ``whole`` workloads come first, outside the backlog
        self.passed: list[Workload] = list(whole)
        self.n_whole = len(whole)
        self.blocked: set[str] = set()
        self.seen: set[str] = set()
        self.q_trunc: dict[str, list[str]] = {}
        self.c_trunc: dict[int, list[str]] = {}
        #: cut class windows that grew to their whole class during the cycle
        self.done: set[int] = set()
        self.pulled = 0
        #: the classes given a window (cut or whole)
        self.given: list[int] = []

    def give(self, names: list[str]) -> None:
        self.seen.update(names)
        self.passed.extend(self.pend.w[n] for n in names)

    def pull(self, w: Workload) -> Workload | None:
        """The engine's ``more``: the next member of ``w``'s class, if ``w`` ends a cut window."""
        pend = self.pend
        c = pend.cls_of.get(w.name)
        names = self.c_trunc.get(c) if c is not None else None
        if names is None or names[-1] != w.name:
            return None
        lst = pend.by_class[c]  # type: ignore[index]
        seen = self.seen
        i = len(names)
        while i < len(lst) and lst[i][1] in seen:
            i += 1
        if i >= len(lst):
            self.done.add(c)  # type: ignore[arg-type]
            return None
        n = lst[i][1]
        names.append(n)
        seen.add(n)
        j = i + 1
        while j < len(lst) and lst[j][1] in seen:
            j += 1
        if j >= len(lst):
            self.done.add(c)  # type: ignore[arg-type]
        nxt = pend.w[n]
        self.passed.append(nxt)
        self.pulled += 1
        return nxt


class _Attempts:
    """What one planned cycle carries from one attempt to the next."""

    __slots__ = ("bf_horizon", "dirty", "extra", "full_classes", "memo", "use_blocked", "use_more")

    def __init__(
        self,
        dirty: bool,
        extra: set[str],
        bf_horizon: tuple[float, float],
        use_blocked: bool,
        use_more: bool,
    ) -> None:
        self.dirty = dirty
        #: workloads given besides the windows (newcomers, holders, backfill witnesses)
        self.extra = extra
        self.full_classes: set[int] = set()
        self.bf_horizon = bf_horizon
        self.memo: dict[object, Any] = {}  # the engine's blocked_at_start memo
        self.use_blocked = use_blocked
        self.use_more = use_more


class WindowPlanner:
    """Runs one engine cycle over windows of a backlog, enlarged until provably exact.

    The options are the callers' differences: ``head_queues`` and ``one_head`` (queue windows),
    ``blocked_heads`` (give a blocked class its head only), ``full_pending`` (no windows: every
    workload, a reference run), ``pull_windows`` (grow class windows inside the cycle). A planner
    kept across cycles remembers the window sizes that were enough (a hint only: every cycle is
    verified) and the last cycle's holds."""

    def __init__(
        self,
        head_queues: Collection[str] = frozenset(),
        one_head: bool = False,
        full_pending: bool = False,
        pull_windows: bool = True,
        blocked_heads: bool = True,
    ) -> None:
        self.head_queues = head_queues
        self.one_head = one_head
        self.full_pending = full_pending
        self.pull_windows = pull_windows
        self.blocked_heads = blocked_heads
        self.k_class: dict[int, int] = {}
        self.k_queue: dict[str, int] = {}
        self.engine_calls = 0
        self.holders: set[str] = set()
        #: the last cycle's holds (``Holds.key``) and their planned starts
        self.last_held: frozenset[tuple[str, frozenset[int], float]] = frozenset()
        self.last_starts: list[float] = []
        self._last: _Windows | None = None

    def decide(
        self,
        eng: Engine,
        pend: Backlog,
        now: float,
        changes: Changes | None = None,
        whole: Sequence[Workload] = (),
    ) -> tuple[Decisions, list[Workload]]:
        """The cycle's decisions and the workloads it was given. ``changes``: what changed
        since the last cycle, when the state is otherwise the same (None: anything may have);
        ``whole``: workloads given besides the backlog's windows."""
        if self.full_pending:
            everything = [*whole, *pend.w.values()]
            self.engine_calls += 1
            return eng.cycle(everything, now), everything
        dirty = changes is None
        extra = self._extra(pend, changes) if changes is not None else set()
        at = _Attempts(dirty, extra, self._bf_horizon(now), self.blocked_heads, self.pull_windows)
        touched, touched_q = (changes.classes, changes.queues) if changes is not None else (set(), set())
        while True:
            win = self._windows(eng, pend, at, touched, touched_q, whole)
            if not win.passed and not at.dirty:  # nothing changed that could move anything
                self._last = win
                return Decisions(), win.passed
            d = self._cycle(eng, pend, win, at, now)
            if (win.blocked or win.pulled) and d.preempted:
                # a preemption frees capacity: the proof behind ``blocked`` no longer holds, and
                # windows grown during the cycle may have missed work it let in
                at.use_blocked = at.use_more = False
                for c, names in win.c_trunc.items():  # the grown windows are the ones to start from
                    self.k_class[c] = max(self.k_class.get(c, 1), len(names) + 1)
                continue
            holds = eng.placer.holds
            held = frozenset(holds.key())
            if not at.dirty and (d.admitted or d.preempted or held != self.last_held):
                # the state changed mid-cycle (an admission can move the nodes held for a blocked
                # workload, a preemption frees capacity): give every class its window
                at.dirty = True
                continue
            if self._holds_open(win, at, d, holds):
                continue
            if not win.q_trunc and not win.c_trunc:
                break
            outcome: dict[str, object] = {p.workload: p.code for p in d.pending}
            for a in d.admitted:
                outcome[a.workload] = "admitted"
            queues_ok = self._queue_windows_exact(win, outcome)
            starts = [h.start for h in holds.all()]
            classes_ok = self._class_windows_exact(pend, win, at, d, starts, outcome, now)
            if queues_ok and classes_ok:
                self._learn(pend, win, d, outcome, at.use_more, holds)
                break
        self.holders = set(holds.by_workload)
        self.last_held = held
        self.last_starts = [h.start for h in holds.all()]
        self._last = win
        return d, win.passed

    def left_out(self, d: Decisions) -> dict[str, Pending]:
        """The reasons of the members the last cycle (``d``) left out of its class windows:
        their class witness's, under their own name; a witness that holds no nodes if there is
        one (a holder's reason names its own hold, which the others do not have)."""
        win = self._last
        if win is None:
            return {}
        pend, seen = win.pend, win.seen
        by_name = {p.workload: p for p in d.pending}
        out: dict[str, Pending] = {}
        for c, names in win.c_trunc.items():
            cands = [by_name[n] for n in reversed(names) if n in by_name and by_name[n].code in FAILED]
            witness = next((p for p in cands if p.workload not in self.holders), cands[0] if cands else None)
            if witness is None:
                continue
            q, code, reason = pend.w[names[0]].queue, witness.code, witness.reason  # one queue a class
            # every member before the window's end was given (in the window, or besides it)
            out.update(
                {n: Pending(n, q, code, reason) for _, n in pend.by_class[c][len(names) :] if n not in seen}
            )
        return out

    def _extra(self, pend: Backlog, changes: Changes) -> set[str]:
        """Unchanged state: newcomers (they may backfill) and the last holders, besides windows
        (a StrictFIFO or one-head queue is given as a window or not at all)."""
        extra = {
            n
            for n in changes.new
            if n in pend.w and not self.one_head and pend.w[n].queue not in self.head_queues
        }
        extra.update(n for n in self.holders if n in pend.w)
        return extra

    def _bf_horizon(self, now: float) -> tuple[float, float]:
        """How long a job may run to backfill around one of the last cycle's holds, and
        around all of them."""
        return max(self.last_starts, default=-math.inf) - now, min(self.last_starts, default=-math.inf) - now

    def _windows(
        self,
        eng: Engine,
        pend: Backlog,
        at: _Attempts,
        touched: set[int],
        touched_q: set[str],
        whole: Sequence[Workload],
    ) -> _Windows:
        win = _Windows(pend, whole)
        for q, classes in pend.by_queue.items():
            if not classes:
                continue
            if q in self.head_queues or self.one_head:
                if at.dirty or q in touched_q:
                    self._queue_window(pend, win, q, classes)
                continue
            self._class_windows(
                eng, pend, win, at, classes if at.dirty else [c for c in classes if c in touched]
            )
        win.passed.extend(pend.w[n] for n in sorted(at.extra - win.seen))
        win.seen.update(at.extra)
        return win

    def _queue_window(self, pend: Backlog, win: _Windows, q: str, classes: dict[int, None]) -> None:
        k = self.k_queue.get(q, 8)
        lists = [pend.by_class[c][:k] for c in classes]
        got = heapq.nsmallest(k, (x for lst in lists for x in lst))
        names = [n for _, n in got]
        if pend.count[q] > len(names):
            win.q_trunc[q] = names
        win.give(names)

    def _class_windows(
        self, eng: Engine, pend: Backlog, win: _Windows, at: _Attempts, classes: Iterable[int]
    ) -> None:
        """The windows of one queue's classes (one call per queue: this loop is the hot one)."""
        by_class, ws, k_class, full = pend.by_class, pend.w, self.k_class, at.full_classes
        passed, seen = win.passed, win.seen
        # backfill by exact durations: bands only
        bf, bf_all = at.bf_horizon if pend.by_band else (-math.inf, -math.inf)
        for c in classes:
            lst = by_class[c]
            if at.use_blocked and c not in full:
                head = ws[lst[0][1]]
                if eng.blocked_at_start(head, at.memo):
                    win.blocked.add(head.name)
                    seen.add(head.name)
                    passed.append(head)
                    continue
            k = len(lst) if c in full else k_class.get(c, 1)
            names = [n for _, n in lst[:k]]
            if len(lst) > k:
                win.c_trunc[c] = names
                # under a hold, a short member may backfill where the window could not: give the
                # first that could (by the last hold) up front, as the check after the cycle would
                if bf > -math.inf and pend.by_dur[c][0][0] <= bf:
                    got = pend.eligible(c, bf, set(names), 1)
                    if bf_all < bf and pend.by_dur[c][0][0] <= bf_all:  # and one that could around every hold
                        got += pend.eligible(c, bf_all, set(names), 1)
                    at.extra.update(got)
            win.given.append(c)
            seen.update(names)
            passed.extend(ws[n] for n in names)

    def _cycle(self, eng: Engine, pend: Backlog, win: _Windows, at: _Attempts, now: float) -> Decisions:
        if pend.shapes is not None:
            # the shapes left out count in the fragmentation mix, as if they had been given
            hidden = pend.shapes.copy()
            add_shapes(hidden, win.passed[win.n_whole :], sign=-1)  # type: ignore[arg-type]
            eng.mix.hidden = +hidden
        kw: dict[str, Any] = {}
        if win.blocked:
            kw["blocked"] = win.blocked
        if at.use_more and win.c_trunc:
            kw["more"] = win.pull
        try:
            d = eng.cycle(list(win.passed), now, **kw)
        finally:
            eng.mix.hidden = None
        self.engine_calls += 1
        return d

    def _holds_open(self, win: _Windows, at: _Attempts, d: Decisions, holds: Holds) -> bool:
        """Where a pool plans more than one start (``reservations`` > 1), a failed member may
        have taken a hold, and then its failure changed state: a member left out, failing as
        it did, would have taken the next hold. A cut window is exact only when one of its
        members failed and took no hold (the holds were used up when it was tried, and every
        later member of its class is tried later still). Otherwise grow the window (and give
        the blocked heads' classes as windows) and run the cycle again. With one reservation
        per pool the windows were exact already: after the first hold there is no room."""
        if not any(n > 1 for n in holds.limits.values()):
            return False
        holders = holds.by_workload
        if at.use_blocked and any(n in holders for n in win.blocked):
            at.use_blocked = False
            return True
        late = d.pending[d.pending_after_preemption :] if d.preempted else d.pending
        failed = {p.workload for p in late if p.code in FAILED}  # as the witness must be
        # a class can take at most the holds still free, and then its next member fails
        room = sum(max(0, n - len(holds.of_pool(p))) for p, n in holds.limits.items())
        grew = False
        for c, names in win.c_trunc.items():
            if c in win.done:
                continue
            if any(n in holders for n in names) and not any(n in failed and n not in holders for n in names):
                self.k_class[c] = len(names) + room + 1
                grew = True
        return grew

    def _queue_windows_exact(self, win: _Windows, outcome: dict[str, object]) -> bool:
        """Every cut queue window stopped inside itself; the others are doubled."""
        ok = True
        for q, names in win.q_trunc.items():
            if q in self.head_queues:
                good = any(outcome.get(n) != "admitted" for n in names)
            else:
                good = any(outcome.get(n) == PendingCode.SKIPPED for n in names)
            if not good:
                ok = False
                self.k_queue[q] = self.k_queue.get(q, 8) * 2
        return ok

    def _class_windows_exact(
        self,
        pend: Backlog,
        win: _Windows,
        at: _Attempts,
        d: Decisions,
        starts: list[float],
        outcome: dict[str, object],
        now: float,
    ) -> bool:
        """Every cut class window has a failed witness (for backfill, a short enough one)."""
        ok = True
        # a witness must have failed after the cycle's last preemption (capacity only shrinks
        # from then on); without preemptions every failure qualifies
        failed = {p.workload for p in d.pending[d.pending_after_preemption :]} if d.preempted else None
        # backfill: a member that may use held nodes needs a failed witness that could too
        held = bool(starts) and pend.by_band
        bf_any = max(starts, default=-math.inf) - now
        bf_all = min(starts, default=math.inf) - now
        extra, waited = at.extra, d.waited
        for c, names in win.c_trunc.items():
            if c in win.done:
                continue
            wit = [n for n in names if outcome.get(n) in FAILED and (failed is None or n in failed)]
            if not wit:
                ok = False
                self.k_class[c] = max(2 * len(names), 2 * self.k_class.get(c, 1))
                continue
            if waited and pend.durations == "none" and all(n in waited for n in wit):
                first = self._band_witnesses(
                    pend,
                    c,
                    win.seen | extra,
                    {duration_band(pend.w[n].expected_duration_s) for n in wit},
                    outcome,
                    failed,
                )
                if first:
                    extra.update(first)
                    ok = False
                    continue
            first = pend.eligible(c, bf_any, set(names) | extra, 1) if held else []
            if not first:
                continue
            # the witness must be tried before the first member left out that may use held
            # nodes (every window member is; a backfill witness given up front may not be)
            before = (workload_order_key(pend.w[first[0]]), first[0])
            if any(
                outcome.get(n) in FAILED
                and (failed is None or n in failed)
                and declared_duration(pend.w[n]) <= bf_all
                and (n in names or (workload_order_key(pend.w[n]), n) < before)
                for n in list(names) + [x for x in extra if pend.cls_of.get(x) == c]
            ):
                continue
            more = pend.eligible(c, bf_all, set(names) | extra, 2)
            if not more:  # nothing can witness for every hold: give the class whole
                at.full_classes.add(c)
            extra.update(more)
            ok = False
        return ok

    @staticmethod
    def _band_witnesses(
        pend: Backlog,
        c: int,
        given: set[str],
        covered: set[int | None],
        outcome: dict[str, object],
        failed: set[str] | None,
    ) -> list[str]:
        """Every witness of a cut class waited for running work to end: that proves only the
        members whose wait horizon (their duration's band) is a witness's. The first member
        left out of each other band, to be given besides the window (it is that band's
        witness: the rest of its band comes after it); [] when every band is covered. A
        member given besides the window that failed covers the members of its band after it."""
        left: dict[int | None, tuple[tuple[int, float, str], str]] = {}  # first left out, per band
        wit: dict[int | None, tuple[tuple[int, float, str], str]] = {}  # first given that failed
        for dur, key, n in pend.by_dur[c]:
            b = duration_band(None if dur == math.inf else dur)
            if b in covered:
                continue
            if n not in given:
                best = left
            elif outcome.get(n) in FAILED and (failed is None or n in failed):
                best = wit
            else:
                continue
            got = best.get(b)
            if got is None or (key, n) < got:
                best[b] = (key, n)
        return sorted(n for b, (key, n) in left.items() if b not in wit or (key, n) < wit[b])

    def _learn(
        self,
        pend: Backlog,
        win: _Windows,
        d: Decisions,
        outcome: dict[str, object],
        use_more: bool,
        holds: Holds,
    ) -> None:
        """Window sizes for the next cycle, from what this one admitted: every class given
        starts again at one member (windows grow during the cycle). Where a pool plans several
        starts only the cut ones do: a class whose members take holds needs a window past
        them, and starting at one reran the deep-backlog test's cycles 1.25x as often."""
        adm: dict[int, int] = {}
        for a in d.admitted:
            c = pend.cls_of.get(a.workload)
            if c is not None:
                adm[c] = adm.get(c, 0) + 1
        one_start = not any(n > 1 for n in holds.limits.values())
        for c in win.given if one_start else win.c_trunc:
            self.k_class[c] = 1 if use_more else min(64, adm.get(c, 0) + 1)
        for q, names in win.q_trunc.items():
            self.k_queue[q] = max(8, min(1024, 2 * sum(outcome.get(n) == "admitted" for n in names)))
