"""Fragmentation-aware Score plugin: place each GPU pod where the cluster's usefulness drops least.

The measure is the one ``gpupool bench fragmentation`` validated on the Alibaba openb traces
(FGD's expected unusable free GPU capacity, blended with a capacity-aware term): for the pod
shapes that are waiting, how much free GPU capacity on a node no pod could use. A candidate's
score is how much a placement grows that measure.

To keep a cycle's cost independent of cluster size, candidates come from the bucket indexes in
best-fit order (at most ``MAX_CANDIDATES`` distinct node states), and measures are memoised by
node state for the cycle: a homogeneous fleet has few distinct states.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from gpupool.engine.state import FRAC_BUCKET, N_FRAC_BUCKETS, ClusterState, PoolIndex
from gpupool.fragbench.fgd import PodShape, ShapeDistribution, node_fragmentation_batch
from gpupool.model import PodRequest, Workload

MAX_CANDIDATES = 8
MAX_SCANNED = 32
PER_BUCKET = 3
Sig = tuple[int, tuple[int, ...], int]  # (model index, sorted free milli per device, free cpu)


class FragContext:
    """Per-cycle scoring context: the waiting pod shapes and a memo of node measures."""

    def __init__(self, st: ClusterState, pending: Iterable[Workload], running: Counter[PodShape]) -> None:
        counts: Counter[PodShape] = Counter(running)
        add_shapes(counts, pending)
        counts = +counts
        self.active = bool(counts)
        models = sorted({n.gpu_model for n in st.nodes})
        self.model_ix = {m: i for i, m in enumerate(models)}
        self.max_gpus = max((n.gpu_count for n in st.nodes), default=1) or 1
        if self.active:
            dist = ShapeDistribution.from_counts(counts)
            self.shapes = dist.compile(models)
        self.memo: dict[Sig, float] = {}

    def measure(self, sigs: list[Sig]) -> list[float]:
        """Measures of node states, computing the unknown ones in one vectorised call."""
        memo = self.memo
        missing = [s for s in dict.fromkeys(sigs) if s not in memo]
        if missing:
            fm = np.zeros((len(missing), self.max_gpus), dtype=np.int64)
            for row, s in enumerate(missing):
                fm[row, : len(s[1])] = s[1]
            vals = node_fragmentation_batch(
                fm,
                np.array([s[2] for s in missing], dtype=np.int64),
                np.zeros(len(missing), dtype=np.int64),
                np.array([s[0] for s in missing], dtype=np.int64),
                self.shapes,
                "gpupool",
            )
            for s, v in zip(missing, vals.tolist(), strict=True):
                memo[s] = v
        return [memo[s] for s in sigs]


def add_shapes(counts: Counter[PodShape], workloads: Iterable[Workload], sign: int = 1) -> None:
    """Count the GPU pod shapes of workloads: the mix the measure is taken against."""
    for w in workloads:
        spec = frozenset(w.gpu_models)
        for g in w.pod_groups:
            r = g.request
            if r.gpus:
                counts[PodShape(r.cpu_milli, 0, r.gpus, 1000, spec)] += sign * g.replicas
            elif r.gpu_milli:
                counts[PodShape(r.cpu_milli, 0, 1, r.gpu_milli, spec)] += sign * g.replicas


def _band(delta: float) -> int:
    """Quantised preference (the validated gpupool policy): smaller growth, higher band."""
    x = max(-50.0, min(50.0, delta / 1000.0))
    return math.floor(100.0 / (1.0 + math.exp(x)))


def _fits(st: ClusterState, i: int, req: PodRequest) -> bool:
    return (
        st.free_cpu[i] >= req.cpu_milli and st.free_mem[i] >= req.memory_mib and st.free_rdma[i] >= req.rdma
    )


class FragAware:
    """Score plugin ``fragmentation``: least growth of unusable GPU capacity, best fit on ties."""

    name = "fragmentation"

    def _sig(self, st: ClusterState, ctx: FragContext, i: int, dev: list[int], cpu: int) -> Sig:
        return (ctx.model_ix[st.nodes[i].gpu_model], tuple(sorted(dev)), cpu)

    def _node_candidates(
        self,
        st: ClusterState,
        ctx: FragContext,
        idxs: list[PoolIndex],
        first: int,
        req: PodRequest,
        ok: object,
    ) -> list[int]:
        """Feasible nodes with distinct states, in best-fit order from ``first`` free GPUs up:
        a few per bucket (nodes in one bucket mostly look alike), a bounded number in all."""
        cands: list[int] = []
        seen: set[Sig] = set()
        scanned = 0
        top = max((ix.max_gpus for ix in idxs), default=0)
        for j in range(first, top + 1):
            for ix in idxs:
                if j > ix.max_gpus:
                    continue
                in_bucket = 0
                for i in ix.whole[j]:
                    scanned += 1
                    if not (_fits(st, i, req) and ok(i)):  # type: ignore[operator]
                        continue
                    sig = self._sig(st, ctx, i, st.dev_milli[i], st.free_cpu[i])
                    if sig not in seen:
                        seen.add(sig)
                        cands.append(i)
                    in_bucket += 1
                    if (
                        in_bucket >= PER_BUCKET
                        or len(cands) >= MAX_CANDIDATES
                        or (scanned >= MAX_SCANNED and cands)
                    ):
                        break
                if len(cands) >= MAX_CANDIDATES or (scanned >= MAX_SCANNED and cands):
                    return cands
        return cands

    def pick_whole(
        self, st: ClusterState, idxs: list[PoolIndex], k: int, req: PodRequest, ok: object
    ) -> int | None:
        ctx: FragContext | None = st.frag
        if ctx is None or not ctx.active:
            from gpupool.engine.placement import SCORERS

            return SCORERS["binpack"].pick_whole(st, idxs, k, req, ok)  # type: ignore[arg-type]
        cands = self._node_candidates(st, ctx, idxs, k, req, ok)
        if len(cands) <= 1:
            return cands[0] if cands else None
        before, after = [], []
        for i in cands:
            dev = st.dev_milli[i]
            before.append(self._sig(st, ctx, i, dev, st.free_cpu[i]))
            left = list(dev)
            taken = 0
            for d, free in enumerate(left):
                if free == 1000 and taken < k:
                    left[d] = 0
                    taken += 1
            after.append(self._sig(st, ctx, i, left, st.free_cpu[i] - req.cpu_milli))
        vals = ctx.measure(before + after)
        n = len(cands)
        best = min(range(n), key=lambda c: (-_band(vals[n + c] - vals[c]), c))
        return cands[best]

    def pick_fraction(
        self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: object
    ) -> tuple[int, int] | None:
        from gpupool.engine.placement import _mem_for, _with_device_memory

        ctx: FragContext | None = st.frag
        m = req.gpu_milli
        cands: list[tuple[int, int]] = []
        seen: set[tuple[Sig, int]] = set()
        scanned = 0
        for b in range(m // FRAC_BUCKET, N_FRAC_BUCKETS):
            for ix in idxs:
                in_bucket = 0
                for i, d in ix.partial[b]:
                    scanned += 1
                    if not (
                        st.dev_milli[i][d] >= m
                        and st.dev_mem[i][d] >= _mem_for(st, i, req)
                        and _fits(st, i, req)
                        and ok(i)  # type: ignore[operator]
                    ):
                        continue
                    if ctx is None or not ctx.active:
                        return i, d
                    key = (self._sig(st, ctx, i, st.dev_milli[i], st.free_cpu[i]), st.dev_milli[i][d])
                    if key not in seen:
                        seen.add(key)
                        cands.append((i, d))
                    in_bucket += 1
                    if (
                        in_bucket >= PER_BUCKET
                        or len(cands) >= MAX_CANDIDATES
                        or (scanned >= MAX_SCANNED and cands)
                    ):
                        break
                if len(cands) >= MAX_CANDIDATES or (scanned >= MAX_SCANNED and cands):
                    break
            if len(cands) >= MAX_CANDIDATES or (scanned >= MAX_SCANNED and cands):
                break
        # a fresh device too: on the fullest node that has one (and the emptiest, for contrast)
        fresh_ok = _with_device_memory(st, req, ok)  # type: ignore[arg-type]
        top = max((ix.max_gpus for ix in idxs), default=0)
        fresh: list[int] = []
        for j in range(1, top + 1):
            for ix in idxs:
                if j > ix.max_gpus:
                    continue
                for i in ix.whole[j]:
                    if _fits(st, i, req) and fresh_ok(i):
                        fresh.append(i)
                        break
                if fresh:
                    break
            if fresh:
                break
        for i in fresh:
            cands.append((i, next(d for d, f in enumerate(st.dev_milli[i]) if f == 1000)))
        if not cands:
            return None
        if len(cands) == 1 or ctx is None or not ctx.active:
            return cands[0]
        before, after = [], []
        for i, d in cands:
            dev = st.dev_milli[i]
            before.append(self._sig(st, ctx, i, dev, st.free_cpu[i]))
            left = list(dev)
            left[d] -= m
            after.append(self._sig(st, ctx, i, left, st.free_cpu[i] - req.cpu_milli))
        vals = ctx.measure(before + after)
        n = len(cands)
        # best band; then the device with the least free milli (pack shared GPUs); then order
        best = min(
            range(n), key=lambda c: (-_band(vals[n + c] - vals[c]), st.dev_milli[cands[c][0]][cands[c][1]], c)
        )
        return cands[best]

    def pick_cpu(self, st: ClusterState, idxs: list[PoolIndex], req: PodRequest, ok: object) -> int | None:
        """A pod without GPUs goes where taking its CPU strands the least GPU capacity."""
        from gpupool.engine.placement import pick_cpu_only

        ctx: FragContext | None = st.frag
        if ctx is None or not ctx.active:
            return pick_cpu_only(st, idxs, req, ok)  # type: ignore[arg-type]
        cands = self._node_candidates(st, ctx, idxs, 0, req, ok)
        if len(cands) <= 1:
            return cands[0] if cands else None
        before = [self._sig(st, ctx, i, st.dev_milli[i], st.free_cpu[i]) for i in cands]
        after = [self._sig(st, ctx, i, st.dev_milli[i], st.free_cpu[i] - req.cpu_milli) for i in cands]
        vals = ctx.measure(before + after)
        n = len(cands)
        return cands[min(range(n), key=lambda c: (-_band(vals[n + c] - vals[c]), c))]
