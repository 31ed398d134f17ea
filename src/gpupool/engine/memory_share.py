"""A share of one GPU asked for by memory alone (KAI's ``gpu-memory`` annotation) as the
compute share the engine places and charges.

Why at the engine's door: a memory-only request (``PodRequest`` with ``gpu_memory_mib`` and
neither ``gpus`` nor ``gpu_milli``) means "this much of a device's memory", and what fraction
that is depends on the devices, which only the engine's cluster knows. Each pending workload is
turned once into an ordinary fractional request before a cycle, so quota, placement,
preemption and partial admission all read one figure:

    milli = ceil(memory x 1000 / D), at least 1,

where ``D`` is the smallest device memory of the schedulable GPU nodes (of the workload's GPU
models, if it names some) that can hold the memory at all. The pod is placed only on a device
with that memory free (``scoring.mem_for``: a request's memory is its limit), and is charged
``milli`` against quota, queued or running: on a larger device it is charged the fraction of the
smallest one (never less than it takes anywhere). When no device can hold it, it asks for a
whole device with that memory, so it stays pending with the reason that no device fits.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.model import GPU, Node, PodRequest, Workload


def memory_only(r: PodRequest) -> bool:
    """True for a share asked for by GPU memory alone."""
    return r.gpus == 0 and r.gpu_milli == 0 and r.gpu_memory_mib > 0 and r.accelerator == GPU


def share_milli(memory_mib: int, device_memory: list[int]) -> int:
    """The milli-GPU a ``memory_mib`` share counts as, given the devices' memory (MiB)."""
    fit = [d for d in device_memory if d >= memory_mib]
    if not fit:
        return 1000
    return max(1, -(-memory_mib * 1000 // min(fit)))


class MemoryShares:
    """Resolves memory-only requests against one cluster's devices (memoized per workload
    object, so the engine's per-object caches keep hitting across cycles)."""

    __slots__ = ("_memo", "nodes")

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self._memo: dict[str, tuple[Workload, Workload]] = {}

    def resolve(self, w: Workload) -> Workload:
        """``w`` with each memory-only pod group turned into a fractional one (``w`` itself when
        it has none)."""
        for g in w.pod_groups:  # hot (every pending workload, every cycle): a plain loop
            r = g.request
            if r.gpu_memory_mib and not r.gpu_milli and not r.gpus:
                break
        else:
            return w
        got = self._memo.get(w.name)
        if got is not None and got[0] is w:
            return got[1]
        models = set(w.gpu_models)
        mems = [
            n.gpu_memory_mib
            for n in self.nodes
            if n.schedulable
            and n.accelerator == GPU
            and n.gpu_count
            and (not models or n.gpu_model in models)
        ]
        groups = tuple(
            replace(g, request=replace(g.request, gpu_milli=share_milli(g.request.gpu_memory_mib, mems)))
            if memory_only(g.request)
            else g
            for g in w.pod_groups
        )
        out = replace(w, pod_groups=groups)
        self._memo[w.name] = (w, out)
        return out
