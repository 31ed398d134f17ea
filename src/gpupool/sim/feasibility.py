"""Jobs that can never run on a variant's cluster, and why: reported, never silently dropped.

Why before the run: the engine would leave such a job pending forever (it has no reason to give
up), which would read as an endless wait in the metrics instead of as a trace/cluster mismatch.
"""

from __future__ import annotations

from gpupool.engine.signature import scheduling_signature
from gpupool.model import Node, Queue, Workload
from gpupool.sim.sources import JobSpec


class Feasibility:
    """Why a job cannot run at all on fixed nodes and queues ("" when it can), cached per shape."""

    def __init__(self, nodes: list[Node], queues: tuple[Queue, ...]) -> None:
        self.nodes = nodes
        self.queues = queues
        self._cache: dict[tuple[object, ...], str] = {}

    def reject_reason(self, w: Workload, j: JobSpec) -> str:
        # the answer depends on the trace's queue and the workload's shape only (under the single
        # FIFO queue ``w.queue`` is not the trace's queue)
        key = (j.queue, scheduling_signature(w, duration="band"))
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._reason(j)
        return got

    def _reason(self, j: JobSpec) -> str:
        known = {n.gpu_model for n in self.nodes}
        if j.gpu_models and not set(j.gpu_models) & known:
            return (
                f"unknown GPU model(s) {', '.join(j.gpu_models)}; the cluster has {', '.join(sorted(known))}"
            )
        qn = {q.name for q in self.queues}
        if j.queue not in qn:
            return f"queue {j.queue!r} does not exist; known: {', '.join(sorted(qn)) or 'none'}"
        if any(q.parent == j.queue for q in self.queues):
            return f"queue {j.queue!r} has child queues; jobs go to leaf queues"
        ok_nodes = [n for n in self.nodes if not j.gpu_models or n.gpu_model in j.gpu_models]
        per = j.gpus if j.gpus else (1 if j.gpu_milli else 0)
        fit = [
            n
            for n in ok_nodes
            if n.gpu_count >= per and n.cpu_milli >= j.cpu_milli and n.memory_mib >= j.memory_mib
        ]
        if not fit:
            return f"no node can host one pod ({per} GPU, {j.cpu_milli}m CPU, {j.memory_mib}Mi)"
        if j.gpus and sum(n.gpu_count // j.gpus for n in fit) < j.replicas:
            return (
                f"needs {j.gpus * j.replicas} GPUs in {j.replicas} pods; the cluster cannot hold them at once"
            )
        return ""
