"""Event-free placement simulator for the FGD "allocation ratio at 100% arrival" experiment.

Why a separate, numpy-vectorised simulator: the experiment places ~9,000 pods
per seed on 1,213 nodes and is repeated for 10 seeds x 5 traces x 6 policies;
scoring every feasible (node, GPU) candidate of a pod in one array pass keeps a
10-seed run of one policy on one trace at seconds (baselines) to a few minutes
(gpupool on gpuspec10, whose 70+ pinned shapes widen every score array).

GPUs of a node are interchangeable for every policy here, so a fractional pod
only considers one GPU per distinct free amount on a node (the lowest index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpupool.engine.fgd import GPUPOOL_CAPACITY_WEIGHT, CompiledShapes, NodeKind, node_kinds
from gpupool.fragbench.trace import MILLI, Node, Pod

__all__ = ["POLICIES", "Cluster", "PodTable", "pick", "sample_arrivals", "simulate_seed"]

POLICIES: tuple[str, ...] = ("random", "dotprod", "packing", "bestfit", "fgd", "gpupool")

MAX_SPEC_CPU = 128_000  # normalisation constants of the paper's artifact
MAX_SPEC_GPU = 8 * MILLI
ARRIVAL_INFLATION = 1.3  # pods sampled until their GPU request is 1.3x capacity

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Cluster:
    """Static node arrays; ``model_ix`` indexes ``models`` (``len(models)`` = no GPU)."""

    names: tuple[str, ...]
    models: tuple[str, ...]
    cpu: I64
    mem: I64
    num_gpu: I64
    model_ix: I64
    max_gpus: int

    @classmethod
    def from_nodes(cls, nodes: Sequence[Node]) -> Cluster:
        """Build arrays from parsed nodes."""
        models = tuple(sorted({n.model for n in nodes if n.num_gpu > 0}))
        mix = {m: i for i, m in enumerate(models)}
        return cls(
            names=tuple(n.name for n in nodes),
            models=models,
            cpu=np.array([n.cpu_milli for n in nodes], dtype=np.int64),
            mem=np.array([n.memory_mib for n in nodes], dtype=np.int64),
            num_gpu=np.array([n.num_gpu for n in nodes], dtype=np.int64),
            model_ix=np.array([mix.get(n.model, len(models)) for n in nodes], dtype=np.int64),
            max_gpus=max(1, max(n.num_gpu for n in nodes)),
        )

    @property
    def kinds(self) -> tuple[NodeKind, ...]:
        """The GPU node kinds (the supply ``gpupool`` weighs shapes by, ``engine.fgd.per_gpu_weights``)."""
        return node_kinds(
            (self.models[m] if m < len(self.models) else "", int(g), int(c), int(mem))
            for m, g, c, mem in zip(self.model_ix, self.num_gpu, self.cpu, self.mem, strict=True)
        )

    @property
    def gpu_capacity_milli(self) -> int:
        """Total GPU milli of the cluster."""
        return int(self.num_gpu.sum()) * MILLI


@dataclass(frozen=True)
class PodTable:
    """Trace pods as arrays plus per-pod model access ``(P, n_models + 1)``."""

    cpu: I64
    mem: I64
    k: I64  # GPUs requested
    d: I64  # milli per GPU
    access: NDArray[np.bool_]
    request: I64  # k * d
    unknown_model: NDArray[np.bool_]  # gpu_spec names a model absent from the cluster
    impossible: NDArray[np.bool_]  # fits no node of the empty cluster

    @classmethod
    def build(cls, pods: Sequence[Pod], cluster: Cluster) -> PodTable:
        """Encode ``pods`` against ``cluster``'s model list and capacities."""
        n_models = len(cluster.models)
        access = np.zeros((len(pods), n_models + 1), dtype=bool)
        unknown = np.zeros(len(pods), dtype=bool)
        known = set(cluster.models)
        for i, p in enumerate(pods):
            if p.gpu_spec:
                unknown[i] = not p.gpu_spec <= known
                for j, m in enumerate(cluster.models):
                    access[i, j] = m in p.gpu_spec
            else:
                access[i, :n_models] = True
            if p.num_gpu == 0:
                access[i, :] = True  # CPU-only pods run anywhere
        cpu = np.array([p.cpu_milli for p in pods], dtype=np.int64)
        mem = np.array([p.memory_mib for p in pods], dtype=np.int64)
        k = np.array([p.num_gpu for p in pods], dtype=np.int64)
        d = np.array([p.gpu_milli for p in pods], dtype=np.int64)
        fits = (
            (cpu[:, None] <= cluster.cpu[None, :])
            & (mem[:, None] <= cluster.mem[None, :])
            & (k[:, None] <= cluster.num_gpu[None, :])
            & access[:, cluster.model_ix]
        )
        impossible = np.asarray(~fits.any(axis=1), dtype=bool)
        return cls(cpu, mem, k, d, access, k * d, unknown, impossible)


def sample_arrivals(pods: PodTable, capacity_milli: int, rng: np.random.Generator) -> I64:
    """Indices of pods drawn with replacement until 1.3x capacity is requested, shuffled."""
    target = ARRIVAL_INFLATION * capacity_milli
    mean = max(float(pods.request.mean()), 1.0)
    chunks: list[I64] = []
    total = 0.0
    while total < target:
        idx = rng.integers(0, len(pods.request), size=int(target / mean * 0.2) + 64)
        cum = total + np.cumsum(pods.request[idx])
        stop = int(np.searchsorted(cum, target))  # first index reaching the target
        if stop < len(idx):
            chunks.append(idx[: stop + 1])
            total = float(cum[stop])
            break
        chunks.append(idx)
        total = float(cum[-1]) if len(cum) else total
    arrivals = np.concatenate(chunks)
    return np.asarray(rng.permutation(arrivals), dtype=np.int64)


class _State:
    """Mutable free resources; fragmentation statistics are kept per node when needed."""

    def __init__(
        self,
        cluster: Cluster,
        shapes: CompiledShapes | None,
        free: I64 | None = None,
        cpu: I64 | None = None,
        mem: I64 | None = None,
    ) -> None:
        self.c = cluster
        g = cluster.max_gpus
        if free is None:
            gpu_ix = np.arange(g)[None, :]
            free = np.where(gpu_ix < cluster.num_gpu[:, None], MILLI, 0)
        self.free = np.array(free, dtype=np.int64).reshape(len(cluster.cpu), g)
        self.cpu = np.array(cluster.cpu if cpu is None else cpu, dtype=np.int64)
        self.mem = np.array(cluster.mem if mem is None else mem, dtype=np.int64)
        self.lower = np.tril(np.ones((g, g), dtype=bool), k=-1)[None, :, :]
        self.shapes = shapes
        if shapes is not None:
            mix = cluster.model_ix
            self.total, self.cnt, self.big = shapes.gpu_stats(self.free)
            self.frag = shapes.frag_from_stats(self.total, self.cnt, self.big, self.cpu, self.mem, mix)
            self.slots = shapes.slot_stats(self.free)
            self.cfrag = shapes.capacity_frag_from_stats(self.total, self.slots, self.cpu, self.mem, mix)
        self._sig_ids: dict[tuple[int, ...], int] = {}
        self.sig = np.array([self._signature(n) for n in range(len(self.cpu))], dtype=np.int64)

    def _signature(self, node: int) -> int:
        """Id of everything a score depends on (exact, no hashing): identical nodes score identically."""
        c = self.c
        key = (
            int(c.model_ix[node]),
            int(c.num_gpu[node]),
            int(self.cpu[node]),
            int(self.mem[node]),
            *sorted(self.free[node].tolist()),
        )
        return self._sig_ids.setdefault(key, len(self._sig_ids))

    def distinct(self, cn: I64, v: I64) -> I64:
        """Indices of the first candidate of each group of identical (node state, GPU free) ones.

        Identical candidates get identical scores and every tie-break here prefers
        the lowest index, so scoring only these representatives changes nothing
        but the run time (many nodes are still untouched, or equally full).
        """
        idx = np.arange(len(cn))
        h = self.sig[cn]
        order = np.lexsort((idx, v, h))
        hs, vs = h[order], v[order]
        starts = np.ones(len(order), dtype=bool)
        starts[1:] = (hs[1:] != hs[:-1]) | (vs[1:] != vs[:-1])
        return np.sort(order[starts])

    def refresh(self, node: int) -> None:
        self.sig[node] = self._signature(node)
        if self.shapes is None:
            return
        sl = slice(node, node + 1)
        t, cnt, big = self.shapes.gpu_stats(self.free[sl])
        self.total[sl], self.cnt[sl], self.big[sl] = t, cnt, big
        self.frag[sl] = self.shapes.frag_from_stats(
            t, cnt, big, self.cpu[sl], self.mem[sl], self.c.model_ix[sl]
        )
        self.slots[sl] = self.shapes.slot_stats(self.free[sl])
        self.cfrag[sl] = self.shapes.capacity_frag_from_stats(
            t, self.slots[sl], self.cpu[sl], self.mem[sl], self.c.model_ix[sl]
        )

    def frag_delta(self, cn: I64, v: I64, k: int, d: int, cpu: int, mem: int) -> F64:
        """Growth of node fragmentation if the pod takes ``d`` milli on ``k`` GPUs holding ``v`` each."""
        assert self.shapes is not None
        th = self.shapes.thresholds[None, :]
        ge_old = (v[:, None] >= th).astype(np.int64)
        ge_new = ((v - d)[:, None] >= th).astype(np.int64)
        cnt = self.cnt[cn] + k * (ge_new - ge_old)
        big = self.big[cn] + k * ((v - d)[:, None] * ge_new - v[:, None] * ge_old)
        new = self.shapes.frag_from_stats(
            self.total[cn] - k * d, cnt, big, self.cpu[cn] - cpu, self.mem[cn] - mem, self.c.model_ix[cn]
        )
        return new - self.frag[cn]

    def capacity_delta(self, cn: I64, v: I64, k: int, d: int, cpu: int, mem: int) -> F64:
        """Growth of capacity-aware fragmentation for the same candidate placements."""
        assert self.shapes is not None
        th = self.shapes.thresholds[None, :]
        slots = self.slots[cn] + k * ((v - d)[:, None] // th - v[:, None] // th)
        new = self.shapes.capacity_frag_from_stats(
            self.total[cn] - k * d, slots, self.cpu[cn] - cpu, self.mem[cn] - mem, self.c.model_ix[cn]
        )
        return new - self.cfrag[cn]


def _first_max(score: F64) -> int:
    """Highest score; ties go to the lowest node index, then the lowest GPU index.

    Candidates are ordered by (node, GPU), so this is the paper artifact's
    deterministic tie-break (its reported figures are reproduced with it, not
    with random tie-breaking).
    """
    return int(np.flatnonzero(score == score.max())[0])


def simulate_seed(
    cluster: Cluster,
    pods: PodTable,
    policy: str,
    seed: int,
    shapes: CompiledShapes | None,
) -> tuple[float, int]:
    """Run one seed; return (allocated / capacity in percent at 100% arrival, skipped pods)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    rng = np.random.default_rng(seed)
    capacity = cluster.gpu_capacity_milli
    arrivals = sample_arrivals(pods, capacity, rng)
    uses_frag = policy in ("fgd", "gpupool")
    if uses_frag and shapes is None:
        raise ValueError(f"policy {policy!r} needs a shape distribution")
    st = _State(cluster, shapes if uses_frag else None)
    per_value = policy in ("fgd", "gpupool", "dotprod")  # consider every distinct GPU free amount
    arrived = allocated = skipped = 0
    for p in arrivals:
        cpu, mem, k, d = int(pods.cpu[p]), int(pods.mem[p]), int(pods.k[p]), int(pods.d[p])
        arrived += k * d
        feas = (st.cpu >= cpu) & (st.mem >= mem) & pods.access[p][cluster.model_ix]
        if k > 0:
            feas &= (st.free >= d).sum(axis=1) >= k
        nodes = np.flatnonzero(feas)
        if len(nodes) == 0:
            skipped += 1
        else:
            cn, gpu, v = _candidates(st, nodes, k, d, per_value)
            if uses_frag:
                keep = st.distinct(cn, v)
                cn, gpu, v = cn[keep], gpu[keep], v[keep]
            choice = _choose(policy, st, cn, gpu, v, k, d, cpu, mem, rng)
            n = int(cn[choice])
            if k == 1 and d < MILLI:
                st.free[n, gpu[choice]] -= d
            elif k > 0:
                full = np.flatnonzero(st.free[n] == MILLI)[:k]
                st.free[n, full] = 0
            st.cpu[n] -= cpu
            st.mem[n] -= mem
            allocated += k * d
            st.refresh(n)
        if arrived >= capacity:
            break
    return 100.0 * allocated / capacity, skipped


def _candidates(st: _State, nodes: I64, k: int, d: int, per_value: bool) -> tuple[I64, I64, I64]:
    """Candidate (node, first GPU index, free milli on that GPU) triples for a pod."""
    if k == 0:
        zero = np.zeros(len(nodes), dtype=np.int64)
        return nodes, zero - 1, zero
    if k > 1 or d >= MILLI:
        return nodes, np.full(len(nodes), -1, dtype=np.int64), np.full(len(nodes), MILLI, dtype=np.int64)
    sub = st.free[nodes]
    fits = sub >= d
    if per_value:
        dup = ((sub[:, :, None] == sub[:, None, :]) & st.lower).any(axis=2)
        rows, cols = np.nonzero(fits & ~dup)
        return nodes[rows], cols.astype(np.int64), sub[rows, cols]
    # one candidate per node: the best-fit GPU (least free that still fits; lowest index on ties)
    masked = np.where(fits, sub, MILLI + 1)
    cols = masked.argmin(axis=1).astype(np.int64)
    return nodes, cols, sub[np.arange(len(nodes)), cols]


def _choose(
    policy: str,
    st: _State,
    cn: I64,
    gpu: I64,
    v: I64,
    k: int,
    d: int,
    cpu: int,
    mem: int,
    rng: np.random.Generator,
) -> int:
    """Index of the winning candidate under ``policy``."""
    if policy == "random":
        return int(rng.integers(len(cn)))
    if policy == "bestfit":
        # Paper artifact: 100 * (1 - 0.5*cpu_left/128 cores - 0.5*gpu_left/8 GPUs), truncated.
        gpu_left = st.free[cn].sum(axis=1) - k * d
        raw = 0.5 * (st.cpu[cn] - cpu) / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU
        q = np.floor((1.0 - raw) * 100.0)
        return _first_max(q)
    if policy == "packing":
        q = _packing_score(st, cn, v, k, d)
        return _first_max(q)
    if policy == "dotprod":
        dot = (st.cpu[cn] / MAX_SPEC_CPU) * (cpu / MAX_SPEC_CPU) + (k * v / MAX_SPEC_GPU) * (
            k * d / MAX_SPEC_GPU
        )
        q = np.floor(100.0 * (1.0 - dot / 2.0))
        return _first_max(q)
    if policy == "fgd":
        # Paper artifact: int(100 * sigmoid(-delta / 1000)), i.e. ~40-milli bands near 0.
        return _first_max(_sigmoid_score(st.frag_delta(cn, v, k, d, cpu, mem)))
    return _gpupool_choice(st, cn, v, k, d, cpu, mem)


def _sigmoid_score(delta: F64) -> F64:
    return np.floor(100.0 / (1.0 + np.exp(np.clip(delta / 1000.0, -50.0, 50.0))))


def _packing_score(st: _State, cn: I64, v: I64, k: int, d: int) -> F64:
    """Paper artifact's GPU packing: shared GPU > free GPU on a used node > empty node."""
    sub = st.free[cn]
    n_gpu = st.c.num_gpu[cn]
    fully_free = (sub == MILLI).sum(axis=1)
    empty = fully_free == n_gpu
    if k == 0:
        return np.zeros(len(cn))
    score_empty = np.maximum(100 // 3 - fully_free, fully_free)
    if k == 1 and d < MILLI:
        uses_free = v == MILLI
        shared = np.maximum(100 - (v * 100 // MILLI) // 10, 50)
        score_used = np.where(uses_free, np.maximum(50 - 1, 100 // 3), shared)
    else:
        score_used = np.full(len(cn), max(50 - k, 100 // 3))
    return np.where(empty, score_empty, score_used).astype(np.float64)


def _gpupool_choice(st: _State, cn: I64, v: I64, k: int, d: int, cpu: int, mem: int) -> int:
    """The ``gpupool`` policy.

    1. growth of the blended fragmentation ``(1 - w) * FGD + w * capacity-aware``
       (``w = GPUPOOL_CAPACITY_WEIGHT``),
       banded like the paper (``floor(100 * sigmoid(-delta / 1000))``): placements
       within a band are equally good fragmentation-wise;
    2. within the band, the tightest GPU (least free milli before placing):
       fill partly used GPUs before opening whole ones;
    3. then the node with the fewest GPUs: keep big nodes whole for multi-GPU pods;
    4. then the lowest node index (deterministic consolidation).
    """
    w = GPUPOOL_CAPACITY_WEIGHT
    delta = (1.0 - w) * st.frag_delta(cn, v, k, d, cpu, mem) + w * st.capacity_delta(cn, v, k, d, cpu, mem)
    band = _sigmoid_score(delta)
    order = np.lexsort((cn, st.c.num_gpu[cn], v, -band))
    return int(order[0])


def pick(
    policy: str,
    cluster: Cluster,
    free_milli: I64,
    free_cpu: I64,
    free_mem: I64,
    pod: Pod,
    shapes: CompiledShapes | None = None,
    seed: int = 0,
) -> tuple[int, int] | None:
    """Where ``policy`` would put ``pod`` given the free resources: ``(node, gpu)``.

    ``gpu`` is the chosen GPU index for a fractional pod and -1 otherwise; None
    when nothing fits.  Used by tests and for one-off what-if questions.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")
    if policy in ("fgd", "gpupool") and shapes is None:
        raise ValueError(f"policy {policy!r} needs a shape distribution")
    table = PodTable.build([pod], cluster)
    st = _State(cluster, shapes if policy in ("fgd", "gpupool") else None, free_milli, free_cpu, free_mem)
    k, d = pod.num_gpu, pod.gpu_milli
    feas = (st.cpu >= pod.cpu_milli) & (st.mem >= pod.memory_mib) & table.access[0][cluster.model_ix]
    if k > 0:
        feas &= (st.free >= d).sum(axis=1) >= k
    nodes = np.flatnonzero(feas)
    if len(nodes) == 0:
        return None
    cn, gpu, v = _candidates(st, nodes, k, d, policy in ("fgd", "gpupool", "dotprod"))
    i = _choose(policy, st, cn, gpu, v, k, d, pod.cpu_milli, pod.memory_mib, np.random.default_rng(seed))
    return int(cn[i]), int(gpu[i]) if (k == 1 and d < MILLI) else -1
