"""The running set: admitted workloads and the indexes a cycle reads instead of walking them all.

Part of the state layer, beside ``ClusterState`` and ``QuotaState``: while a cycle is open every
change is logged so the cycle can be undone (``Statement`` drives the three logs together).
Indexes: by (pool, queue) for preemption, the priorities of the preemptible work there (for the
lowest), and per node and device the expected end of each workload on it (for node holds).

Work admitted inside the open cycle (``fresh``) stays out of the indexes: it is never a
preemption candidate, holds see it through ``fresh_ends``, and undoing it is then free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpupool.model import Running, Vec

_INF = float("inf")


class RunningSet:
    """Running workloads by name, their indexes, and the undo log of the open cycle."""

    __slots__ = ("_fresh_cache", "_log", "by_name", "by_pq", "dev_ends", "fresh", "node_ends", "prio_pq")

    def __init__(self) -> None:
        #: the running workloads (``Engine.running`` is this dict)
        self.by_name: dict[str, Running] = {}
        self.by_pq: dict[tuple[str, str], dict[str, Running]] = {}
        #: priorities of the preemptible work indexed in ``by_pq``, counted (for the lowest)
        self.prio_pq: dict[tuple[str, str], Counter[int]] = {}
        self.dev_ends: dict[str, dict[int, dict[str, float]]] = {}
        self.node_ends: dict[str, list[float]] = {}
        #: names admitted in the open cycle (never indexed)
        self.fresh: set[str] = set()
        self._fresh_cache: tuple[int, dict[str, list[tuple[int, float]]]] | None = None
        self._log: list[tuple[str, Running | None]] | None = None

    # -- changes ------------------------------------------------------------------------------
    def set(self, name: str, r: Running | None) -> None:
        """Run ``r`` under ``name`` (None: nothing); inside a cycle, log how to undo it."""
        log = self._log
        prev = self.by_name.get(name)
        if log is not None:
            log.append((name, prev))
        if prev is not None and not (log is not None and name in self.fresh):
            self._unindex(prev)
        if r is None:
            del self.by_name[name]
        else:
            self.by_name[name] = r
            if log is None or name not in self.fresh:
                self._index(r)

    def admit(self, r: Running) -> None:
        """Run ``r``, admitted in the open cycle (so it stays out of the indexes)."""
        self.fresh.add(r.name)
        self.set(r.name, r)

    # -- transactions -------------------------------------------------------------------------
    def open(self) -> None:
        """Start logging (a cycle begins); nothing is fresh yet."""
        self._log = []
        self.fresh = set()
        self._fresh_cache = None

    def checkpoint(self) -> int:
        assert self._log is not None
        return len(self._log)

    def rollback(self, cp: int) -> None:
        """Give every workload touched since ``cp`` back the value it had then, in the order
        they were first touched, as logged changes: the running dict then lists them in the
        order a later ``discard`` and the callers that build snapshots from it expect."""
        assert self._log is not None
        first: dict[str, Running | None] = {}
        for name, prev in self._log[cp:]:
            if name not in first:
                first[name] = prev
        for name, prev in first.items():
            if self.by_name.get(name) is not prev:
                self.set(name, prev)

    def discard(self) -> None:
        """Undo everything since ``open`` and stop logging."""
        log, fresh, by_name = self._log, self.fresh, self.by_name
        assert log is not None
        for name, prev in reversed(log):
            cur = by_name.get(name)
            if cur is not None and name not in fresh:
                self._unindex(cur)
            if prev is None:
                by_name.pop(name, None)
            else:
                by_name[name] = prev
                self._index(prev)
        self._log = None

    def close(self) -> None:
        """Stop logging and keep what the cycle did (a caller that discards the engine)."""
        self._log = None

    # -- reads --------------------------------------------------------------------------------
    def lowest_priority(self, pool: str, queue: str) -> float:
        """Lowest priority of the preemptible work the queue runs in the pool (as indexed: work
        admitted in this cycle is never a victim)."""
        prios = self.prio_pq.get((pool, queue))
        return min(prios) if prios else _INF

    def busy_ends(self, node: str) -> list[float]:
        """When each busy device of ``node`` frees (the end of the last workload on it; unknown
        duration: never), sorted; kept per node until something on it changes."""
        got = self.node_ends.get(node)
        if got is None:
            per_dev = self.dev_ends.get(node)
            got = sorted(max(e.values()) for e in per_dev.values()) if per_dev else []
            self.node_ends[node] = got
        if self._log is not None and self.fresh:
            extra = self._fresh_ends().get(node)
            if extra:  # devices taken in this cycle (never shared with earlier work: whole GPUs)
                merged: dict[int, float] = {}
                per_dev = self.dev_ends.get(node, {})
                for dev, end in extra:
                    base = max(per_dev[dev].values()) if dev in per_dev else 0.0
                    merged[dev] = max(merged.get(dev, 0.0), end, base)
                others = [max(e.values()) for d, e in per_dev.items() if d not in merged]
                got = sorted(others + list(merged.values()))
        return got

    def ending_at(self, node: str, t: float) -> str:
        """A workload on ``node`` expected to end at ``t`` ("" if none): whose end a planned
        start waits for (``holds.plan_hold``)."""
        for ends in self.dev_ends.get(node, {}).values():
            for name, end in ends.items():
                if end == t:
                    return name
        return ""

    def _fresh_ends(self) -> dict[str, list[tuple[int, float]]]:
        """Per node, (device, expected end) of the work admitted in this cycle (rebuilt when
        more has been admitted since the last call)."""
        n = len(self.fresh)
        if self._fresh_cache is None or self._fresh_cache[0] != n:
            out: dict[str, list[tuple[int, float]]] = {}
            for name in self.fresh:
                r = self.by_name.get(name)
                if r is None:
                    continue
                d = r.workload.expected_duration_s
                end = _INF if d is None else r.admission.admitted_at + d
                for p in r.admission.pods:
                    for dev in p.devices:
                        out.setdefault(p.node, []).append((dev, end))
            self._fresh_cache = (n, out)
        return self._fresh_cache[1]

    # -- indexes ------------------------------------------------------------------------------
    def _index(self, r: Running) -> None:
        a = r.admission
        w = r.workload
        self.by_pq.setdefault((a.pool, w.queue), {})[r.name] = r
        if w.preemptible:
            self.prio_pq.setdefault((a.pool, w.queue), Counter())[w.priority] += 1
        d = w.expected_duration_s
        end = _INF if d is None else a.admitted_at + d
        dev_ends, node_ends = self.dev_ends, self.node_ends
        for p in a.pods:
            if not p.devices:
                continue
            per_dev = dev_ends.setdefault(p.node, {})
            for dev in p.devices:
                per_dev.setdefault(dev, {})[r.name] = end
            node_ends.pop(p.node, None)

    def _unindex(self, r: Running) -> None:
        a = r.admission
        key = (a.pool, r.workload.queue)
        pq = self.by_pq[key]
        del pq[r.name]
        if not pq:
            del self.by_pq[key]
        if r.workload.preemptible:
            prios = self.prio_pq[key]
            prios[r.workload.priority] -= 1
            if not prios[r.workload.priority]:
                del prios[r.workload.priority]
        dev_ends, node_ends = self.dev_ends, self.node_ends
        for p in a.pods:
            if not p.devices:
                continue
            per_dev = dev_ends[p.node]
            for dev in p.devices:
                ends = per_dev.get(dev)  # absent: two pods of this workload shared the device
                if ends is not None:
                    ends.pop(r.name, None)
                    if not ends:
                        del per_dev[dev]
            node_ends.pop(p.node, None)


def vec_of(pods: Iterable[object]) -> Vec:
    """The quota vector (device milli, CPU milli, memory MiB, storage MiB, Mbit/s) placed pods charge."""
    g = c = m = s = b = 0
    for p in pods:
        g += p.gpu_milli * len(p.devices)  # type: ignore[attr-defined]
        c += p.cpu_milli  # type: ignore[attr-defined]
        m += p.memory_mib  # type: ignore[attr-defined]
        s += p.storage_mib  # type: ignore[attr-defined]
        b += p.network_mbps  # type: ignore[attr-defined]
    return (g, c, m, s, b)
