"""GPU fragmentation of a node, measured against a workload (FGD, USENIX ATC'23).

Why: a node's free GPU capacity is only worth something if the tasks that will
actually arrive can use it.  Following "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", the fragmentation of
a node for one task shape is the free GPU milli that shape cannot use:

* the whole free amount when the shape cannot run on the node at all (it wants
  no GPU, wants another GPU model, lacks CPU/memory, or too few GPUs have its
  per-GPU milli free);
* otherwise the free milli sitting on GPUs with less than its per-GPU request.

The node fragmentation is the expectation of that quantity over the workload's
popularity-weighted shape distribution.  FGD places each task where this
expectation grows least.  The engine's ``fragmentation`` score plugin
(``engine/fragscore.py``) calls :func:`node_fragmentation_batch` with the shape
distribution of the pods it expects, before and after a candidate placement, and
prefers the smallest growth; the benchmark (``gpupool.fragbench``) imports this
module to run the paper's policies, so the measure it validates is the one the
engine ships (the benchmark imports the engine, never the reverse).

``measure="capacity"`` extends the idea to *repeated* pods of a shape (CPU that
runs out after a few pods strands the remaining GPUs), and ``measure="gpupool"``
blends it with FGD: that blend is what the project's default ``gpupool`` policy
minimises, against the mix of :func:`per_gpu_weights` (each shape weighed by its demand per GPU
it can run on, not by its share of pods as in the paper).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "GPUPOOL_CAPACITY_WEIGHT",
    "MEASURES",
    "CompiledShapes",
    "Measure",
    "NodeKind",
    "PodLike",
    "PodShape",
    "ShapeDistribution",
    "node_fragmentation",
    "node_fragmentation_batch",
    "node_kinds",
    "per_gpu_weights",
]

Measure = Literal["fgd", "capacity", "gpupool"]
# Share of the capacity-aware measure in the gpupool blend (the rest is the paper's FGD).
GPUPOOL_CAPACITY_WEIGHT = 0.5
MEASURES: tuple[str, ...] = ("fgd", "capacity", "gpupool")
FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


class PodLike(Protocol):
    """What a shape is read from: a trace pod (``gpupool.fragbench.trace.Pod``) has these fields.

    A protocol, so that the engine does not depend on the benchmark's trace types."""

    @property
    def cpu_milli(self) -> int: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def num_gpu(self) -> int: ...
    @property
    def gpu_milli(self) -> int: ...
    @property
    def gpu_spec(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class PodShape:
    """A task's request: CPU, memory (0 = ignored), GPU count, per-GPU milli, acceptable models."""

    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ShapeDistribution:
    """Popularity-weighted task shapes of a workload (weights sum to 1)."""

    shapes: tuple[PodShape, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights) or not self.shapes:
            raise ValueError("ShapeDistribution needs one weight per shape and at least one shape")
        if any(w < 0 for w in self.weights):
            raise ValueError("shape weights must be non-negative")

    @classmethod
    def from_pods(
        cls,
        pods: Iterable[PodLike],
        popularity: float = 0.95,
        include_memory: bool = False,
        weight_by: str = "count",
    ) -> ShapeDistribution:
        """Most popular shapes covering ``popularity`` of the pods, renormalised.

        Defaults follow the paper's artifact (95% coverage by pod count, CPU-only
        pods included, memory not part of the shape).  ``weight_by="request"``
        weights each shape by the GPU milli its pods request instead, which is
        what the allocation ratio counts.
        """
        if weight_by not in ("count", "request"):
            raise ValueError(f"weight_by must be 'count' or 'request', not {weight_by!r}")
        counts: Counter[PodShape] = Counter()
        for p in pods:
            shape = PodShape(
                p.cpu_milli, p.memory_mib if include_memory else 0, p.num_gpu, p.gpu_milli, p.gpu_spec
            )
            counts[shape] += 1 if weight_by == "count" else p.num_gpu * p.gpu_milli
        return cls.from_counts(counts, popularity)

    @classmethod
    def from_counts(cls, counts: Mapping[PodShape, float], popularity: float = 0.95) -> ShapeDistribution:
        """Most popular shapes covering ``popularity`` of the total weight, renormalised."""
        total = sum(counts.values())
        if total == 0:
            raise ValueError("no pods to build a shape distribution from")
        # Deterministic order: by count, then by the shape's fields.
        ranked = sorted(
            counts.items(),
            key=lambda kv: (-kv[1], kv[0].num_gpu, kv[0].gpu_milli, kv[0].cpu_milli, sorted(kv[0].gpu_spec)),
        )
        chosen: list[tuple[PodShape, float]] = []
        cum = 0.0
        for shape, n in ranked:
            chosen.append((shape, n))
            cum += n
            if cum >= popularity * total:
                break
        return cls(tuple(s for s, _ in chosen), tuple(n / cum for _, n in chosen))

    def compile(self, models: Sequence[str]) -> CompiledShapes:
        """Numpy form for a cluster whose GPU models are ``models`` (index order)."""
        return CompiledShapes.build(self, models)


class NodeKind(NamedTuple):
    """``nodes`` GPU nodes alike in what decides whether a shape can run there at all."""

    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    nodes: int


def node_kinds(nodes: Iterable[tuple[str, int, int, int]]) -> tuple[NodeKind, ...]:
    """Group ``(model, gpus, cpu_milli, memory_mib)`` of each node into kinds (GPU nodes only)."""
    counts = Counter(n for n in nodes if n[1] > 0)
    return tuple(NodeKind(*k, c) for k, c in sorted(counts.items()))


def per_gpu_weights(
    dist: ShapeDistribution, supply: Sequence[NodeKind], popularity: float = 0.95
) -> ShapeDistribution:
    """The mix with each GPU shape's weight divided by the share of the cluster's GPUs it can use,
    cut to the shapes covering ``popularity`` of the new weights (pass ``dist`` uncut).

    Why: FGD weighs a shape by its share of the coming pods, as if every shape could draw on the
    whole cluster. A shape that runs only on some nodes (pinned to a model, or too big in GPUs,
    CPU or memory for the others) puts all its demand there: a shape pinned to T4, 14% of the
    GPUs, wants a free T4 GPU about 7 times as much as a shape that runs anywhere does. With the
    pod-share weights, pods that could run anywhere filled the small models first and the pods
    pinned there were turned away; 8-GPU pods asking 120 cores, which fit only the G3 nodes (5%
    of the GPUs), were too rare to survive the popularity cut and lost those nodes to smaller
    pods (bench/README.md, issue 11). Weighing each shape by its demand per GPU it can run on
    (the GPUs of the empty nodes it fits), and cutting after weighing, makes taking those GPUs
    cost what it costs. Shapes that fit every GPU node, and pods without GPUs, keep their weight;
    a shape that fits no node is left as it is; the weights are renormalised."""
    kinds = np.array([(k.gpus, k.cpu_milli, k.memory_mib) for k in supply], dtype=np.int64).reshape(-1, 3)
    gpus = kinds[:, 0] * np.array([k.nodes for k in supply], dtype=np.int64)
    total = float(gpus.sum())
    shapes = dist.shapes
    if total == 0:  # no GPU node: nothing to weigh by
        return ShapeDistribution.from_counts(dict(zip(shapes, dist.weights, strict=True)), popularity)
    req = np.array([(s.num_gpu, s.cpu_milli, s.memory_mib) for s in shapes], dtype=np.int64)
    models = sorted({k.model for k in supply})  # few: the shapes x kinds test is vectorised
    access = np.array([[not s.gpu_spec or m in s.gpu_spec for m in models] for s in shapes], dtype=bool)
    of_kind = np.searchsorted(np.array(models), np.array([k.model for k in supply]))
    fits = np.all(req[:, None, :] <= kinds[None, :, :], axis=2) & access.reshape(len(shapes), -1)[:, of_kind]
    usable = fits.astype(np.int64) @ gpus
    factor = np.where((req[:, 0] > 0) & (usable > 0), total / np.maximum(usable, 1), 1.0)
    weighted: dict[PodShape, float] = {}
    for s, w, f in zip(shapes, dist.weights, factor.tolist(), strict=True):
        weighted[s] = weighted.get(s, 0.0) + w * f
    return ShapeDistribution.from_counts(weighted, popularity)


@dataclass(frozen=True)
class CompiledShapes:
    """Array form of a :class:`ShapeDistribution` for vectorised scoring.

    Only GPU-requesting shapes are kept explicitly; CPU-only shapes contribute
    their weight times the node's whole free GPU milli and are folded into
    ``w_total``.  ``thresholds`` are the distinct per-GPU milli requests and
    ``thr_ix[s]`` maps a shape to its threshold.  Model index ``len(models)`` is
    "no / unknown GPU model" (accessible to no GPU shape).
    """

    models: tuple[str, ...]
    thresholds: IntArray  # (M,)
    thr_ix: IntArray  # (S,)
    num_gpu: IntArray  # (S,)
    cpu: IntArray  # (S,)
    mem: IntArray  # (S,)
    weight: FloatArray  # (S,)
    access: NDArray[np.bool_]  # (S, n_models + 1)
    w_total: float

    @classmethod
    def build(cls, dist: ShapeDistribution, models: Sequence[str]) -> CompiledShapes:
        """Compile ``dist`` against the cluster's GPU model list."""
        models_t = tuple(models)
        gpu = [(s, w) for s, w in zip(dist.shapes, dist.weights, strict=True) if s.num_gpu > 0]
        thresholds = np.array(sorted({s.gpu_milli for s, _ in gpu}), dtype=np.int64)
        access = np.zeros((len(gpu), len(models_t) + 1), dtype=bool)
        for i, (s, _) in enumerate(gpu):
            for j, m in enumerate(models_t):
                access[i, j] = not s.gpu_spec or m in s.gpu_spec
        return cls(
            models=models_t,
            thresholds=thresholds,
            thr_ix=np.searchsorted(thresholds, [s.gpu_milli for s, _ in gpu]).astype(np.int64),
            num_gpu=np.array([s.num_gpu for s, _ in gpu], dtype=np.int64),
            cpu=np.array([s.cpu_milli for s, _ in gpu], dtype=np.int64),
            mem=np.array([s.memory_mib for s, _ in gpu], dtype=np.int64),
            weight=np.array([w for _, w in gpu], dtype=np.float64),
            access=access,
            w_total=float(sum(dist.weights)),
        )

    def model_index(self, model: str) -> int:
        """Index of ``model`` in the access table (unknown / CPU-only -> last column)."""
        try:
            return self.models.index(model)
        except ValueError:
            return len(self.models)

    def gpu_stats(self, free_milli: NDArray[np.int64]) -> tuple[IntArray, IntArray, IntArray]:
        """Per node: total free milli ``(R,)``, and per threshold the number of GPUs
        with at least that much free ``(R, M)`` and the free milli on them ``(R, M)``."""
        fm = np.asarray(free_milli, dtype=np.int64)
        ge = fm[:, :, None] >= self.thresholds[None, None, :]
        cnt = ge.sum(axis=1)
        big = (fm[:, :, None] * ge).sum(axis=1)
        return fm.sum(axis=1), cnt, big

    def frag_from_stats(
        self,
        total: IntArray,
        cnt: IntArray,
        big: IntArray,
        free_cpu: IntArray,
        free_mem: IntArray,
        model_ix: IntArray,
    ) -> FloatArray:
        """Fragmentation from :meth:`gpu_stats` output (lets callers patch stats cheaply)."""
        ok = self.access[:, model_ix].T
        ok = ok & (cnt[:, self.thr_ix] >= self.num_gpu[None, :])
        ok &= free_cpu[:, None] >= self.cpu[None, :]
        ok &= free_mem[:, None] >= self.mem[None, :]
        usable = (ok * big[:, self.thr_ix]) @ self.weight
        return np.asarray(total * self.w_total - usable, dtype=np.float64)

    def slot_stats(self, free_milli: NDArray[np.int64]) -> IntArray:
        """Per node and threshold: how many slots of that many milli the free GPUs hold ``(R, M)``."""
        fm = np.asarray(free_milli, dtype=np.int64)
        return np.asarray((fm[:, :, None] // self.thresholds[None, None, :]).sum(axis=1), dtype=np.int64)

    def capacity_frag_from_stats(
        self,
        total: IntArray,
        slots: IntArray,
        free_cpu: IntArray,
        free_mem: IntArray,
        model_ix: IntArray,
    ) -> FloatArray:
        """Capacity-aware fragmentation from :meth:`slot_stats` output.

        For each shape that fits the node once (its model, and ``num_gpu`` devices with its
        per-GPU milli free, as FGD's test): the free milli beyond what as many pods of that
        shape as the node's free CPU and memory can feed would take. GPUs stranded by CPU
        running out after a few pods count as fragments, which FGD's one-pod test misses.

        Per-GPU remainders of repeated pods (1000 milli hold one 810-milli pod and 190 more)
        are deliberately not fragments here: a node fills with the mix, not one shape, and
        smaller shapes take those remainders; FGD's part of the blend already counts, shape
        by shape, the GPUs a pod cannot use. Counting them again (this measure did until
        issue 11) steered pods away from partly used nodes and multi-GPU pods off nodes with
        an odd number of free GPUs, which lost to plain FGD on the variants with more pinned
        or multi-GPU pods (bench/README.md).
        """
        fits = slots[:, self.thr_ix] >= self.num_gpu[None, :]  # whole or shared, as FGD's test
        n = free_cpu[:, None] // np.maximum(self.cpu, 1)[None, :]
        has_mem = self.mem > 0
        if has_mem.any():
            by_mem = free_mem[:, None] // np.maximum(self.mem, 1)[None, :]
            n = np.where(has_mem[None, :], np.minimum(n, by_mem), n)
        n = np.maximum(n, 0) * (fits & self.access[:, model_ix].T)
        per_pod = self.num_gpu * self.thresholds[self.thr_ix]
        usable = np.minimum(n * per_pod[None, :], total[:, None])
        return np.asarray(total * self.w_total - usable @ self.weight, dtype=np.float64)


def node_fragmentation_batch(
    free_milli: NDArray[np.int64],
    free_cpu_milli: NDArray[np.int64],
    free_mem_mib: NDArray[np.int64],
    model_ix: NDArray[np.int64],
    shapes: CompiledShapes,
    measure: Measure = "fgd",
) -> FloatArray:
    """Expected unusable free GPU milli of each node (vectorised over nodes).

    ``free_milli`` is ``(nodes, max_gpus)`` with 0 for missing GPUs; ``model_ix``
    indexes ``shapes.models`` (use :meth:`CompiledShapes.model_index`).
    ``measure``: ``"fgd"`` (the paper), ``"capacity"`` (capacity-aware, see
    :meth:`CompiledShapes.capacity_frag_from_stats`) or ``"gpupool"`` (their blend
    with :data:`GPUPOOL_CAPACITY_WEIGHT`, the project's default placement score).
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)}, not {measure!r}")
    cpu = np.asarray(free_cpu_milli, dtype=np.int64)
    mem = np.asarray(free_mem_mib, dtype=np.int64)
    mix = np.asarray(model_ix, dtype=np.int64)
    total, cnt, big = shapes.gpu_stats(free_milli)
    fgd = shapes.frag_from_stats(total, cnt, big, cpu, mem, mix)
    if measure == "fgd":
        return fgd
    cap = shapes.capacity_frag_from_stats(total, shapes.slot_stats(free_milli), cpu, mem, mix)
    if measure == "capacity":
        return cap
    return (1.0 - GPUPOOL_CAPACITY_WEIGHT) * fgd + GPUPOOL_CAPACITY_WEIGHT * cap


def node_fragmentation(
    free_milli_per_gpu: Sequence[int],
    free_cpu_milli: int,
    free_mem_mib: int,
    gpu_model: str,
    shapes: ShapeDistribution | CompiledShapes,
    measure: Measure = "fgd",
) -> float:
    """Expected free GPU milli on one node that a task drawn from ``shapes`` cannot use.

    Pure function of the node's free resources; a scheduler minimises the growth
    of this value when placing a task (FGD).  ``free_mem_mib`` only matters for
    shapes built with memory.  ``measure="gpupool"`` is what the ``gpupool``
    policy minimises (see :func:`node_fragmentation_batch`).
    """
    compiled = shapes if isinstance(shapes, CompiledShapes) else shapes.compile([gpu_model])
    fm = np.asarray([list(free_milli_per_gpu) or [0]], dtype=np.int64)
    out = node_fragmentation_batch(
        fm,
        np.array([free_cpu_milli], dtype=np.int64),
        np.array([free_mem_mib], dtype=np.int64),
        np.array([compiled.model_index(gpu_model)], dtype=np.int64),
        compiled,
        measure,
    )
    return float(out[0])
