"""What one cycle knows and remembers while it runs, in one object (the Kubernetes scheduler
framework's ``CycleState``): made afresh by ``Session.begin`` for every cycle, read by the
passes, the attempts and the preemption search, and dropped with the cycle. Nothing in it
outlives the cycle; facts that do (per-workload facts, pool orders) are ``facts.WorkloadFacts``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpupool.engine.decisions import PendingCode
from gpupool.model import Vec, Workload


@dataclass(slots=True, eq=False)
class CycleState:
    """Per-cycle memos and the caller's hints.

    The memos rely on one fact: within a cycle capacity only shrinks and candidates only leave
    until a preemption succeeds (which clears them), so a failure seen once holds until then.
    """

    #: the caller's hint: workloads shown unable to move in the starting state (see ``Engine.cycle``)
    blocked: frozenset[str] | set[str]
    #: the caller's window extension (see ``Engine.cycle``)
    more: Callable[[Workload], Workload | None] | None
    #: names admitted in this cycle (the running set's ``fresh``: never preemption candidates)
    admitted_now: set[str]
    #: quota use when the cycle started: victims must have been borrowing already then
    usage_at_start: dict[tuple[str, str], Vec]
    #: names taken into this cycle (pending names and those ``more`` added)
    seen: set[str] = field(default_factory=set)
    #: (pool, shape[, "backfill"]) -> why it did not fit: capacity only shrinks within a cycle
    fail_cache: dict[tuple[object, ...], tuple[PendingCode, str]] = field(default_factory=dict)
    #: (pool, shape) -> why it asks for more devices than the pool has healthy (None: it does
    #: not): the shape fixes the request and no device changes health within a cycle
    beyond_pool: dict[tuple[object, ...], str | None] = field(default_factory=dict)
    #: formatted quota reasons, by what they depend on
    reason_memo: dict[tuple[object, ...], str] = field(default_factory=dict)
    #: (queue, priority, pool, shape) whose preemption search failed
    preempt_failed: set[tuple[object, ...]] = field(default_factory=set)
    #: workloads that waited for running work to end instead of evicting (``victim_cost``)
    waited: set[str] = field(default_factory=set)
    #: victims chosen in this cycle
    evicted: set[str] = field(default_factory=set)
    #: (queue, pool, common ancestor) -> was that queue borrowing when the cycle started
    borrowing_at_start: dict[tuple[str, str, str | None], bool] = field(default_factory=dict)
