"""The cycle's passes over the pending work: which workload goes next and when a queue stops.

``QueuePasses.by_queue`` sorts the valid pending work into its leaf queues (each in queue
order, ``ordering.workload_order_key``); ``run`` is one pass: the queues' heads in fair-share
order (``ordering.FairShareOrder``), each handed to ``Attempt.run``, with the StrictFIFO and
one-head rules, the caller's window extension (``more``) and the ``blocked`` hint's skips
(``hints.BlockedHints``). ``rounds.BorrowRounds`` decides how many passes a cycle runs.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable

from gpupool.engine.attempt import Attempt
from gpupool.engine.decisions import Decisions, Pending, PendingCode
from gpupool.engine.hints import BlockedHints
from gpupool.engine.ordering import FairShareOrder, workload_order_key
from gpupool.engine.session import Session
from gpupool.model import QueueingStrategy, Workload


class QueuePasses:
    """The pending work by queue and the passes over it, handing each workload to ``attempt``."""

    __slots__ = ("attempt", "hints", "ssn")

    def __init__(self, ssn: Session, attempt: Attempt, hints: BlockedHints) -> None:
        self.ssn = ssn
        self.attempt = attempt
        self.hints = hints

    def by_queue(self, pending: list[Workload], out: Decisions) -> dict[str, list[Workload]]:
        """The valid pending work by leaf queue, each in queue order; the rest pending with why
        (a duplicate name, an unknown queue, a queue with child queues)."""
        ssn = self.ssn
        by_queue: dict[str, list[Workload]] = {}
        seen, running, quota = ssn.cs.seen, ssn.runs.by_name, ssn.quota
        for w in pending:
            if w.name in seen or w.name in running:
                out.pending.append(Pending(w.name, w.queue, PendingCode.INVALID, "duplicate workload name"))
                continue
            seen.add(w.name)
            if w.queue not in quota.queues:
                out.pending.append(
                    Pending(w.name, w.queue, PendingCode.UNKNOWN_QUEUE, f"queue {w.queue} does not exist")
                )
                continue
            if not ssn.leaf[w.queue]:
                out.pending.append(
                    Pending(
                        w.name,
                        w.queue,
                        PendingCode.INVALID,
                        f"queue {w.queue} has child queues; submit to one of {', '.join(quota.children[w.queue])}",
                    )
                )
                continue
            by_queue.setdefault(w.queue, []).append(w)
        for lst in by_queue.values():
            lst.sort(key=workload_order_key)
        return by_queue

    def run(
        self, by_queue: dict[str, list[Workload]], out: Decisions, allow_borrow: bool
    ) -> dict[str, list[Workload]]:
        """Take the pending work in fair-share order (``ordering.FairShareOrder``): the chosen
        queue's heads are taken in turn until one changes usage, the queue is done, or another
        queue's head goes first. Returns the work this round leaves to a later one."""
        ssn = self.ssn
        order = FairShareOrder(ssn.quota, by_queue, ssn.config.order == "fifo")
        pos = order.pos
        deferred: dict[str, list[Workload]] = {}
        cs = ssn.cs
        one_head = ssn.config.one_head_per_queue
        more = cs.more if not one_head else None
        queues = ssn.quota.queues
        while (q := order.next_queue()) is not None:
            lst = by_queue[q]
            strict = queues[q].strategy is QueueingStrategy.STRICT_FIFO
            hinted = bool(cs.blocked) and not strict and not one_head  # the hint may skip work
            while True:
                w = lst[pos[q]]
                pos[q] += 1
                result = self._take(w, out, allow_borrow, hinted)
                if result and more is not None and not out.preempted:
                    self._extend_window(more, w, lst, pos[q])
                if strict or one_head:
                    stop = self._queue_stops(w, result, lst, pos[q], strict, deferred, out)
                else:  # hot: the rule of any other queue, without the call
                    stop = False
                    if result is None:
                        got = deferred.get(q)
                        if got is None:
                            deferred[q] = [w]
                        else:
                            got.append(w)
                if stop:
                    pos[q] = len(lst)
                elif hinted and not out.preempted:
                    pos[q] = self.hints.skip_hinted(lst, pos[q], out)
                if stop or result or pos[q] >= len(lst) or not order.still_first(q):
                    break
            order.put_back()
        return deferred

    def _take(self, w: Workload, out: Decisions, allow_borrow: bool, hinted: bool) -> bool | None:
        """``w``'s turn: admitted (True), pending or skipped (False), or deferred to pass 2 (None)."""
        if hinted and w.name in self.ssn.cs.blocked and not out.preempted and self.hints.held_everywhere(w):
            out.skipped += 1  # it would fail again and can no longer move a hold
            return False
        if not allow_borrow and self.attempt.must_borrow(w):
            return None  # cheap deferral: the queue is already at its guarantee
        result = self.attempt.run(w, out, allow_borrow)
        if result is not None:
            out.considered += 1
        return result

    def _extend_window(
        self, more: Callable[[Workload], Workload | None], w: Workload, lst: list[Workload], lo: int
    ) -> None:
        """The caller's window grows by one workload of ``w``'s queue, queued in its place."""
        nxt = more(w)
        if nxt is None:
            return
        seen = self.ssn.cs.seen
        if nxt.queue != w.queue or nxt.name in seen or workload_order_key(nxt) < workload_order_key(w):
            raise ValueError(f"more({w.name}) returned {nxt.name}: not a later workload of queue {w.queue}")
        seen.add(nxt.name)
        insort(lst, nxt, lo=lo, key=workload_order_key)

    def _queue_stops(
        self,
        w: Workload,
        result: bool | None,
        lst: list[Workload],
        rest: int,
        strict: bool,
        deferred: dict[str, list[Workload]],
        out: Decisions,
    ) -> bool:
        """Does ``w``'s queue stop here for this pass? A deferred ``w`` waits for pass 2 (with
        the rest of a StrictFIFO or one-head queue, to keep its order); a failed StrictFIFO head
        blocks the rest; with one head per queue the rest is not considered."""
        q = w.queue
        one_head = self.ssn.config.one_head_per_queue
        if result is None:
            deferred.setdefault(q, []).append(w)
            if strict or one_head:
                deferred[q].extend(lst[rest:])
                return True
            return False
        if result is False and strict and not _hopeless(w, out):
            why = f"queue {q} is StrictFIFO and its head {w.name} cannot be admitted yet"
            out.pending.extend(Pending(r.name, q, PendingCode.BLOCKED, why) for r in lst[rest:])
            return True
        if one_head:
            why = "one head per queue per cycle; not considered yet"
            out.pending.extend(Pending(r.name, q, PendingCode.SKIPPED, why) for r in lst[rest:])
            return True
        return False


def _hopeless(w: Workload, out: Decisions) -> bool:
    """``w`` (just left pending) can never run on the inventory now: it does not block a
    StrictFIFO queue behind it (engine/feasible.py says why)."""
    last = out.pending[-1] if out.pending else None
    return last is not None and last.workload == w.name and last.code is PendingCode.UNSATISFIABLE
