"""Admission checks at submission: is a workload's request one the cluster could ever hold?

Why here and not only in the engine: a request larger than any node (``cpu: 10000`` where the
biggest node has 224 cores) would wait forever with a capacity reason that suggests it might
still start. Refusing it when it is submitted, naming the field and the largest offer, tells the
user at once what to fix. The check is deliberately loose (it ignores taints, selectors and what
runs now): it only refuses what no node of any pool the workload may use could ever hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.manifests import Bundle
from gpupool.model import Node, PodRequest, Workload
from gpupool.quantity import format_cpu, format_mib


@dataclass(frozen=True, slots=True)
class _Shape:
    """What one kind of node offers to a single pod."""

    model: str
    gpus: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    rdma: int

    @classmethod
    def of(cls, n: Node) -> _Shape:
        return cls(n.gpu_model, n.gpu_count, n.gpu_memory_mib, n.cpu_milli, n.memory_mib, n.rdma)

    def holds(self, r: PodRequest) -> bool:
        if r.gpus > self.gpus or r.cpu_milli > self.cpu_milli or r.memory_mib > self.memory_mib:
            return False
        if r.rdma > self.rdma:
            return False
        if r.fractional:
            return self.gpus >= 1 and r.gpu_memory_mib <= self.gpu_memory_mib
        return True


#: node shapes per pool of the current configuration (a bundle is replaced, never changed)
_cache: list[tuple[Bundle, dict[str, frozenset[_Shape]]]] = []


def _shapes(bundle: Bundle) -> dict[str, frozenset[_Shape]]:
    if _cache and _cache[0][0] is bundle:
        return _cache[0][1]
    out = {p.name: frozenset(_Shape.of(n) for n in bundle.nodes if p.selects(n)) for p in bundle.pools}
    _cache[:] = [(bundle, out)]
    return out


def _largest(shapes: list[_Shape]) -> str:
    if not shapes:
        return "the pools it may use have no nodes"
    return (
        f"the largest node offers {max(s.gpus for s in shapes)} GPUs, "
        f"{format_cpu(max(s.cpu_milli for s in shapes))} CPUs, "
        f"{format_mib(max(s.memory_mib for s in shapes))} memory, {max(s.rdma for s in shapes)} rdma"
    )


def unfit(w: Workload, bundle: Bundle, pools: list[str]) -> tuple[str, str] | None:
    """``(field, problem)`` when a pod of ``w`` fits no node of ``pools``; None when all could fit."""
    by_pool = _shapes(bundle)
    shapes = [s for p in pools for s in by_pool.get(p, ()) if not w.gpu_models or s.model in w.gpu_models]
    for i, g in enumerate(w.pod_groups):
        if not any(s.holds(g.request) for s in shapes):
            return (
                f"spec.podGroups[{i}].resources",
                f"a pod of group {g.name!r} fits no node of {', '.join(pools) or 'any pool'}: "
                f"{_largest(shapes)}",
            )
    return None


__all__ = ["unfit"]
