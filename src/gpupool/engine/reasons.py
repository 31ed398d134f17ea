"""The texts of pending reasons that name a quota or pool constraint.

Reasons are formatted only for workloads that end up pending (most attempts never need one),
and quota reasons are memoised per cycle by what they depend on (``Engine._quota_reason``).
Placement reasons come from the placer, victims' reasons from ``preemption.Candidate``.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpupool.engine.state.quota import QuotaState
from gpupool.model import GPU, UNLIMITED, ResourcePool, Vec, Workload, device_noun
from gpupool.quantity import format_cpu, format_gpu, format_mbps, format_mib

_DIM_NAMES = ("GPU", "CPU", "memory", "ephemeral-storage", "network bandwidth")
_DIM_FMT = (format_gpu, format_cpu, format_mib, format_mib, format_mbps)


def _fmt(d: int, v: int) -> str:
    return "unlimited" if v >= UNLIMITED else _DIM_FMT[d](v)


def quota_reason(q: QuotaState, w: Workload, pool: str, vec: Vec, d: int, blk: str) -> str:
    """Why ``w`` does not fit the quota of ``blk`` (its queue, an ancestor, or the cohort root)
    in dimension ``d``: the limit, the use, the request and what the cohort has idle."""
    key = (blk, pool)
    root = q.root[w.queue]
    rk = (root, pool)
    free = max(0, q.G[rk][d] - q.E[rk][d])
    name = _DIM_NAMES[d] if d else device_noun(workload_kind(w))
    if blk == root:
        return (
            f"cohort {root}: pool {pool} {name} capacity {_fmt(d, q.G[key][d])}, {_in_use(q, key, d)}, "
            f"requested {_fmt(d, vec[d])}; {_fmt(d, free)} free"
        )
    lim = q.limit[key][d]
    borrow = "unlimited" if lim >= UNLIMITED else _fmt(d, lim - q.G[key][d])
    return (
        f"queue {blk}: pool {pool} {name} guarantee {_fmt(d, q.G[key][d])}, borrowing limit {borrow}, "
        f"{_in_use(q, key, d)}, requested {_fmt(d, vec[d])}; cohort {root} has {_fmt(d, free)} free"
    )


def _in_use(q: QuotaState, key: tuple[str, str], d: int) -> str:
    """What the subtree really uses (the figure ``get quota`` shows), and apart from it the
    guarantee its queues keep for themselves (lending limits): the quota check counts both, so
    a reason that called their sum "in use" showed more than the cluster ran."""
    used, counted = q.U[key][d], q.E[key][d]
    kept = f" (+{_fmt(d, counted - used)} kept by queues that lend only part of their guarantee)"
    return f"in use {_fmt(d, used)}" + (kept if counted > used else "")


def workload_kind(w: Workload) -> str:
    """The accelerator kind a workload's devices are of (its first pod group that asks for any;
    a pool counts one kind, so that is the kind its quota's device dimension counts)."""
    for g in w.pod_groups:
        r = g.request
        if r.gpus or r.gpu_milli:
            return r.accelerator
    return GPU


def no_pool_reason(w: Workload, pools: Mapping[str, ResourcePool]) -> str:
    """Why ``w`` has no pool to try: the one it names is unknown, not in its queue's quota or
    refuses its task type, or no pool its queue may use offers its GPU models and takes its type."""
    if w.pool is not None:
        if w.pool not in pools:
            return f"pool {w.pool} does not exist"
        if not pools[w.pool].takes_type(w.type):
            return (
                f"pool {w.pool} takes task types {', '.join(pools[w.pool].allowed_types)} only, not {w.type}"
            )
        return f"queue {w.queue} has no quota in pool {w.pool}"
    models = ", ".join(w.gpu_models) or "any GPU model"
    refusing = sorted(p.name for p in pools.values() if not p.takes_type(w.type))
    if refusing:
        return (
            f"queue {w.queue} has no quota in any pool offering {models} that takes task type {w.type} "
            f"({', '.join(refusing)} take other types only)"
        )
    return f"queue {w.queue} has no quota in any pool offering {models}"


def non_preemptible_reason(q: QuotaState, w: Workload, pool: str, vec: Vec) -> str:
    """Why non-preemptible work waits although the cohort has idle quota: it is admitted only
    within guarantee (what it borrowed could never be reclaimed)."""
    key = (w.queue, pool)
    # the model keeps the outcome, not who set it (the class, the task type's defaults or the
    # spec): name each, never one of them as the cause
    why = (
        f"priority class {w.priority_class or '(none)'}, task type {w.type.value} or its spec"
        if not w.preemptible
        else f"pool {pool}"
    )
    return (
        f"queue {w.queue}: non-preemptible work ({why}) is admitted only within guarantee, never by "
        f"borrowing: pool {pool} GPU guarantee {_fmt(0, q.G[key][0])}, in use {_fmt(0, q.E[key][0])}, "
        f"requested {_fmt(0, vec[0])}"
    )
