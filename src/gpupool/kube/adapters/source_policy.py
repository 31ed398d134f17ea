"""The Kubernetes source's policy: which queue a namespace's objects go to, which queues it may
use, and whether ``gpupool.io/min-replicas`` objects are split elastically.

Why apart from the source: the options (``--namespace-queue``, ``--restrict-namespace-queues``)
are parsed at start-up by the wiring, long before a source exists, and read by tests alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpupool.kube.workloads import WorkloadDefaults


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """Which queue a namespace's objects go to, and (optionally) which queues it may use.

    ``allowed``: namespace -> the queues its objects may name; None lets every namespace use
    every queue (the queue's own access rules still apply). With an allow-list, a namespace not
    in it may use no queue at all: the operator maps each tenant namespace explicitly."""

    defaults: WorkloadDefaults = field(default_factory=WorkloadDefaults)
    allowed: Mapping[str, frozenset[str]] | None = None
    #: split ``gpupool.io/min-replicas`` objects into a base and per-replica extras
    #: (``gpupool.kube.adapters.elastic``); off: such an object is one workload with that gang
    #: minimum
    elastic: bool = False

    def refusal(self, namespace: str, queue: str) -> str | None:
        """Why ``namespace`` may not submit to ``queue``, or None."""
        if self.allowed is None:
            return None
        ok = self.allowed.get(namespace, frozenset())
        if queue in ok:
            return None
        names = ", ".join(sorted(ok)) or "none"
        return f"queue {queue!r} is not mapped to namespace {namespace!r} (allowed: {names})"


def parse_namespace_queues(items: Iterable[str]) -> dict[str, list[str]]:
    """``NS=QUEUE`` options (repeatable; a namespace's first queue is its default).
    Raises ValueError naming the bad item."""
    out: dict[str, list[str]] = {}
    for item in items:
        ns, sep, queue = item.partition("=")
        ns, queue = ns.strip(), queue.strip()
        if not sep or not ns or not queue:
            raise ValueError(f"--namespace-queue {item!r}: expected NAMESPACE=QUEUE")
        out.setdefault(ns, [])
        if queue not in out[ns]:
            out[ns].append(queue)
    return out


def policy_from_options(
    items: Iterable[str], restrict: bool, scheduler_name: str = "gpupool"
) -> SourcePolicy:
    """The policy of ``--namespace-queue NS=QUEUE ...`` and ``--restrict-namespace-queues``."""
    mapping = parse_namespace_queues(items)
    defaults = WorkloadDefaults({ns: qs[0] for ns, qs in mapping.items()}, scheduler_name)
    allowed = {ns: frozenset(qs) for ns, qs in mapping.items()} if restrict else None
    return SourcePolicy(defaults, allowed)
