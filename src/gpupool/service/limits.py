"""Fair to everyone: pending limits per queue and per user, and a submit rate per token.

Why: one tenant's backlog costs every cycle and can delay every other team's work, and nothing
bounded it: two accepted gangs of 100,000 pods kept every cycle busy, and one token could submit
as fast as the API answers. Two parts, each with its own state:

* ``PendingCounter`` counts what waits (the controller's pending set and its inbox of committed
  submissions, plus submissions checked but not yet committed: reservations, so a burst or a
  bulk apply checked before any of it is committed cannot pass a limit together) and says which
  limit a new submission would pass (``over``). A queue's ``spec.limits`` bound its whole
  subtree; the server's defaults (``TenantLimits.default``) bound each leaf that sets none.
  Only Pending work counts (not AwaitingApproval, not running), as Slurm's pending job limits.
* ``TokenBuckets``: a token bucket per API token (``--submit-rate``, ``--submit-burst``), so
  one token's flood is answered 429 with ``Retry-After`` while every other token submits.

The refusal itself is ``admission.pending_refusal``, on the one submit path the API, apply and
the Kubernetes source share (``usecases.submit.prepare``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpupool.model import PendingLimits, Queue, Workload

#: the limits' manifest names, in the order they are checked
FIELDS = (
    ("workloads", "maxPendingWorkloads"),
    ("pods", "maxPendingPods"),
    ("workloads_per_user", "maxPendingWorkloadsPerUser"),
    ("pods_per_user", "maxPendingPodsPerUser"),
)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """The server's settings: default pending limits of a leaf queue, and the submit rate."""

    default: PendingLimits = field(default_factory=PendingLimits)
    #: submits per second per token (None: unlimited), and the bucket's size (None: the rate,
    #: at least 1)
    submit_rate: float | None = None
    submit_burst: int | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """One pending (or reserved) workload as the limits count it."""

    queue: str
    owner: str
    pods: int


class QueueTree(Protocol):
    """What the counter reads of the configuration: the queues and each queue's path up."""

    @property
    def queues_by_name(self) -> Mapping[str, Queue]: ...

    def queue_path(self, queue: str) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Over:
    """A limit a submission would pass: where it is declared and what it counts now."""

    queue: str  # the queue whose limit it is
    field: str  # its manifest name, e.g. maxPendingPods
    limit: int
    current: int  # pending now, in that queue's subtree (of the user, for a per-user limit)
    adds: int  # what the submission adds (1 workload, or its pods)
    user: str | None  # the user a per-user limit counts
    default: bool  # the server's default, not the queue's spec.limits

    @property
    def never(self) -> bool:
        """The submission alone passes the limit: it can never be accepted while it stands."""
        return self.adds > self.limit


def limits_of(queue: Queue | None) -> PendingLimits:
    """A queue's ``spec.limits`` (none for a queue the tree does not know)."""
    return queue.pending_limits if queue is not None else PendingLimits()


class PendingCounter:
    """Counts pending work per leaf queue and user, and checks a submission against the limits.

    ``waiting`` reads the controller's pending work (called once per checked submission, and
    only where some limit applies: with no limits configured a submit costs nothing here).
    ``cycles`` counts the controller's cycles. A reservation lapses ``LAPSE_CYCLES`` cycles
    after it was made or handed to the controller (``handed``): a cycle takes its inbox into the
    pending set at its start, and a workload is in neither for that moment, so the reservation
    covers it until a whole cycle has run since. One no caller ended (a checked set refused as a
    whole, a commit that failed) lapses the same way. While it and the pending entry overlap,
    the name is counted once."""

    LAPSE_CYCLES = 2

    def __init__(
        self,
        default: PendingLimits,
        waiting: Callable[[], Iterable[tuple[str, Waiting]]],
        cycles: Callable[[], int],
    ) -> None:
        self.default = default
        self._waiting = waiting
        self._cycles = cycles
        self._reserved: dict[str, tuple[Waiting, int]] = {}
        self._lock = threading.Lock()

    def _limited(self, leaf: str, tree: QueueTree) -> list[tuple[str, PendingLimits, bool]]:
        """(queue, its limits, is the default) on ``leaf``'s path that set some limit."""
        out = []
        queues = tree.queues_by_name
        for i, name in enumerate(tree.queue_path(leaf)):
            lim = limits_of(queues.get(name))
            if i == 0:  # the leaf: the server's default fills what it does not set
                own = lim
                lim = PendingLimits(
                    *(
                        getattr(own, a) if getattr(own, a) is not None else getattr(self.default, a)
                        for a, _ in FIELDS
                    )
                )
                if any(getattr(lim, a) is not None for a, _ in FIELDS):
                    out.append((name, lim, own != lim))
                continue
            if any(getattr(lim, a) is not None for a, _ in FIELDS):
                out.append((name, lim, False))
        return out

    def over(self, name: str, model: Workload, owner: str, tree: QueueTree) -> Over | None:
        """The first limit ``model`` (by ``owner``) would pass; None when it passes none (then it
        is reserved until ``release``: checked submissions count before they are committed)."""
        limited = self._limited(model.queue, tree)
        if not limited:
            return None
        with self._lock:
            now = self._cycles()
            lapsed = [n for n, (_, at) in self._reserved.items() if now - at >= self.LAPSE_CYCLES]
            for n in lapsed:
                del self._reserved[n]
            counted = dict(self._waiting())
            if name in counted or name in self._reserved:
                return None  # already waiting: a resubmission changes nothing
            counted.update((n, w) for n, (w, _) in self._reserved.items())
            hit = _first_over(limited, counted.values(), model, owner, tree)
            if hit is None:
                self._reserved[name] = (Waiting(model.queue, owner, model.pod_count), now)
            return hit

    def handed(self, name: str) -> None:
        """The submission was committed and handed to the controller's inbox."""
        with self._lock:
            got = self._reserved.get(name)
            if got is not None:
                self._reserved[name] = (got[0], self._cycles())

    def release(self, name: str) -> None:
        """The submission failed, changed nothing, or is not Pending (it awaits approval)."""
        with self._lock:
            self._reserved.pop(name, None)


def _first_over(
    limited: list[tuple[str, PendingLimits, bool]],
    waiting: Iterable[Waiting],
    model: Workload,
    owner: str,
    tree: QueueTree,
) -> Over | None:
    """Count the waiting work under each limited queue (and of ``owner``) and compare."""
    under = {q for q, _, _ in limited}
    wl: Counter[str] = Counter()
    pods: Counter[str] = Counter()
    wl_u: Counter[str] = Counter()
    pods_u: Counter[str] = Counter()
    paths: dict[str, set[str]] = {}
    for w in waiting:
        path = paths.get(w.queue)
        if path is None:
            path = paths[w.queue] = under.intersection(tree.queue_path(w.queue))
        for q in path:
            wl[q] += 1
            pods[q] += w.pods
            if w.owner == owner:
                wl_u[q] += 1
                pods_u[q] += w.pods
    counts = {"workloads": wl, "pods": pods, "workloads_per_user": wl_u, "pods_per_user": pods_u}
    adds = {"workloads": 1, "pods": model.pod_count}
    for q, lim, default in limited:
        for attr, manifest_name in FIELDS:
            limit = getattr(lim, attr)
            add = adds[attr.removesuffix("_per_user")]
            if limit is not None and counts[attr][q] + add > limit:
                user = owner if attr.endswith("_per_user") else None
                return Over(q, manifest_name, limit, counts[attr][q], add, user, default)
    return None


class Holds(Protocol):
    """The controller's pending set and its inbox of committed submissions (both read as a
    copy: a ``list`` of a dict or deque is taken whole under the interpreter lock)."""

    @property
    def pending(self) -> Mapping[str, _Held]: ...

    @property
    def inbox(self) -> Iterable[_Held]: ...


class _Held(Protocol):
    name: str
    queue: str
    owner: str
    model: Workload


def controller_waiting(ctl: Holds) -> Callable[[], list[tuple[str, Waiting]]]:
    """``PendingCounter``'s view of a controller's pending work."""

    def waiting() -> list[tuple[str, Waiting]]:
        held = [*list(ctl.inbox), *list(ctl.pending.values())]
        return [(q.name, Waiting(q.queue, q.owner, q.model.pod_count)) for q in held]

    return waiting


class TokenBuckets:
    """A token bucket per key (an API token): ``take`` answers None (go) or the seconds to wait.

    Why per token: a flood from one tenant must not refuse another's submit. The bucket holds
    ``burst`` submits and refills at ``rate`` a second; idle buckets are dropped once full."""

    def __init__(
        self, rate: float, burst: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not rate > 0:
            raise ValueError("the submit rate must be above 0 per second")
        self.rate = rate
        self.burst = max(1, burst if burst is not None else math.ceil(rate))
        self.clock = clock
        self._buckets: dict[object, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: object) -> float | None:
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0 - 1e-9:  # a caller that waited the time it was told is let in
                self._buckets[key] = (max(0.0, tokens - 1.0), now)
                if len(self._buckets) > 10_000:
                    self._prune(now)
                return None
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def _prune(self, now: float) -> None:
        full = [k for k, (t, at) in self._buckets.items() if t + (now - at) * self.rate >= self.burst]
        for k in full:
            del self._buckets[k]


def parse_rate(text: str) -> float:
    """``--submit-rate``: ``N/s``, ``N/m`` or a plain number a second."""
    t = text.strip().lower().replace(" ", "")
    num, _, unit = t.partition("/")
    per = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}.get(unit)
    try:
        n = float(num)
    except ValueError:
        n = float("nan")
    if per is None or not math.isfinite(n) or n <= 0:
        raise ValueError(f"{text!r} is not a rate; write e.g. 10/s, 600/m or 10 (a second), above 0")
    return n / per


def parse_pending_limits(items: Iterable[str]) -> PendingLimits:
    """``--pending-limit NAME=N`` (repeatable): the server's default limits of a leaf queue,
    by their ``spec.limits`` names."""
    names = dict((m, a) for a, m in FIELDS)
    vals: dict[str, int] = {}
    for item in items:
        name, eq, num = item.partition("=")
        attr = names.get(name.strip())
        if attr is None or not eq:
            raise ValueError(f"--pending-limit {item!r}: write NAME=N with NAME one of {', '.join(names)}")
        try:
            n = int(num)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"--pending-limit {item!r}: N must be a whole number, 0 or more")
        vals[attr] = n
    return PendingLimits(**vals)


__all__ = [
    "FIELDS",
    "Over",
    "PendingCounter",
    "TenantLimits",
    "TokenBuckets",
    "Waiting",
    "controller_waiting",
    "limits_of",
    "parse_pending_limits",
    "parse_rate",
]
