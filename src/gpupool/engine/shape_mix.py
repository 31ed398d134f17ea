"""The mix of pod shapes the fragmentation score weighs placements against (what runs and what
waits), kept only where a pool's scorer uses it.

Why a part of its own: the counts of running shapes change with every admission and release,
and a windowed caller sets ``hidden``, the shapes of the pending workloads it leaves out of a
cycle, counted in for that cycle so the scorer sees exactly the mix it would see with every
pending workload (gpupool.engine.windows); where
only ``auto`` scores, the mix is weighed only where fragmentation can arise (see
``fragscore.AutoScore``), and identical nodes with whole GPUs are plain binpacking.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpupool.engine.fragscore import FragContext, add_shapes, shares_gpus, varied_nodes
from gpupool.engine.placement import Placer
from gpupool.engine.state.cluster import ClusterState
from gpupool.model import Snapshot, Workload


class ShapeMix:
    """The running pod shapes (``running``) and whether and how placement weighs the mix."""

    __slots__ = ("auto_only", "hidden", "on", "running", "varied")

    def __init__(self, snapshot: Snapshot, placer: Placer) -> None:
        scores = {placer.scorer_for(p.name).name for p in snapshot.pools}
        #: does any pool's scorer weigh the mix at all
        self.on = bool(scores & {"fragmentation", "auto"})
        self.auto_only = "fragmentation" not in scores
        self.varied = False
        if self.on and self.auto_only:
            self.varied = varied_nodes(snapshot.nodes)
        self.running: Counter[object] = Counter()
        #: pod shapes of pending workloads a windowed caller left out of the next cycles
        self.hidden: Counter[object] | None = None
        self.add(r.workload for r in snapshot.running)

    def count_hidden(self, sign: int) -> bool:
        """Count ``hidden`` into the running shapes (``sign`` 1, at a cycle's start) or out
        again (-1, at its end); whether there was anything to count."""
        if not self.hidden or not self.on:
            return False
        if sign > 0:
            self.running.update(self.hidden)
        else:
            self.running.subtract(self.hidden)
        return True

    def add(self, workloads: Iterable[Workload], sign: int = 1) -> None:
        """Count the pod shapes of ``workloads`` in (``sign`` -1: out), where the mix is kept."""
        if self.on:
            add_shapes(self.running, workloads, sign=sign)  # type: ignore[arg-type]

    def weighs(self, shares_gpus: bool = False) -> bool:
        """Does placement weigh the mix of pod shapes? Where only ``auto`` would, only if the GPU
        nodes differ or (``shares_gpus``) a running or waiting pod takes a GPU fraction."""
        return self.on and (not self.auto_only or self.varied or shares_gpus)

    def prepare(self, cluster: ClusterState, queues: Iterable[list[Workload]]) -> None:
        """The cycle's fragmentation context on ``cluster``: the mix of what runs and what waits
        (``queues``: the pending work of each queue)."""
        if not self.on:
            return
        pending = [w for lst in queues for w in lst]
        if self.weighs() or shares_gpus(self.running, pending):  # type: ignore[arg-type]
            cluster.frag = FragContext(cluster, pending, self.running)  # type: ignore[arg-type]
        else:
            cluster.frag = None  # identical nodes, whole GPUs: ``auto`` is binpack
