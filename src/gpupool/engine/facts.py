"""Facts about a pending workload that no change of state alters: its quota vector, the pools
it may use, and the fail-cache keys of its placement shape in each (``signature.placement_signature``).

Why a part of its own: every attempt and every hint reads them, many times per workload over
a long backlog; they are computed once per workload object and kept across cycles (checked by
object identity, so a new workload under an old name is looked at afresh).
"""

from __future__ import annotations

from gpupool.engine.signature import placement_signature
from gpupool.engine.state.cluster import ClusterState
from gpupool.engine.state.quota import QuotaState
from gpupool.model import ResourcePool, Vec, Workload

#: cached workload facts before the cache starts afresh
_STATICS_MAX = 200_000

#: (quota vector, candidate pools, one fail-cache key per pool)
Facts = tuple[Vec, list[str], list[tuple[object, ...]]]


class WorkloadFacts:
    """Per-workload facts and the pool orders they come from, kept across cycles."""

    __slots__ = ("_by_name", "_model_pools", "_pool_order", "_shape_ids", "cluster", "pools", "quota")

    def __init__(self, quota: QuotaState, pools: dict[str, ResourcePool], cluster: ClusterState) -> None:
        self.quota = quota
        self.pools = pools
        self.cluster = cluster
        #: queue -> (its pools in order, does any of them take only some task types)
        self._pool_order: dict[str, tuple[list[str], bool]] = {}
        self._model_pools: dict[tuple[str, ...], set[str]] = {}
        self._by_name: dict[str, tuple[Workload, Facts]] = {}
        self._shape_ids: dict[tuple[object, ...], int] = {}

    def of(self, w: Workload) -> Facts:
        """``w``'s facts (computed on first sight of this workload object)."""
        got = self._by_name.get(w.name)
        if got is not None and got[0] is w:
            return got[1]
        pools = self.candidate_pools(w)
        shape = placement_signature(w)
        sid = self._shape_ids.setdefault(shape, len(self._shape_ids))
        ckeys: list[tuple[object, ...]] = [(p, sid) for p in pools]
        st = (w.quota_vec(), pools, ckeys)
        self._by_name[w.name] = (w, st)
        return st

    def trim(self) -> None:
        """Start afresh once the cache holds more workloads than a cycle should ever need."""
        if len(self._by_name) > _STATICS_MAX:
            self._by_name.clear()

    def candidate_pools(self, w: Workload) -> list[str]:
        """Pools a workload may use: its own choice, else its queue's pools in the order they are
        listed, its preferred pools (``Workload.preferred_pools``) moved to the front."""
        got = self._pool_order.get(w.queue)
        if got is None:
            listed: list[str] = []
            for n in self.quota.path[w.queue]:  # the nearest queue that lists quotas decides
                listed = [pq.pool for pq in self.quota.queues[n].quotas if pq.pool in self.pools]
                if listed:
                    break
            got = self._pool_order[w.queue] = (listed, any(self.pools[p].allowed_types for p in listed))
        order, typed = got
        if typed:  # pools that take only some types
            order = [p for p in order if self.pools[p].takes_type(w.type)]
        if w.pool is not None:
            return [w.pool] if w.pool in order else []
        if w.preferred_pools:  # its task type's pools first, in their order (docs/engine.md)
            first = self._preferred(w.preferred_pools, order)
            order = first + [p for p in order if p not in first]
        if not w.gpu_models:
            return order
        ok = self._model_pools.get(w.gpu_models)
        if ok is None:
            ok = {p for p in self.pools if self.cluster.pool_indexes(p, w.gpu_models)}
            self._model_pools[w.gpu_models] = ok
        return [p for p in order if p in ok]

    def _preferred(self, prefs: tuple[str, ...], order: list[str]) -> list[str]:
        """The pools of ``order`` that ``prefs`` name (by pool name or environment), in the
        preferences' order, each once."""
        first: list[str] = []
        for pref in prefs:
            first += [p for p in order if p not in first and self.pools[p].answers_to(pref)]
        return first
