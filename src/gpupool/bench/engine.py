"""Engine benchmark: one full scheduling cycle on a large synthetic cluster.

The baseline is a naive first-fit scheduler written here (numpy, no quotas, no topology,
arrival order), so the ratio says what gpupool's extra governance costs or saves.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from rich.table import Table

from gpupool.engine import decide
from gpupool.model import (
    EngineConfig,
    Node,
    PodGroup,
    PodRequest,
    PoolQuota,
    PriorityClass,
    Queue,
    ResourcePool,
    Snapshot,
    Topology,
    TopologyMode,
    TopologyScope,
    Workload,
    WorkloadType,
    devices_only,
)

MODELS = (("H100-80GB", 81920), ("A100-80GB", 81920), ("A100-40GB", 40960), ("L40S-48GB", 49152))
CLASSES = (
    PriorityClass("inference-critical", 1000, False),
    PriorityClass("training", 500),
    PriorityClass("fine-tuning", 400),
    PriorityClass("experiment", 200),
    PriorityClass("evaluation", 100),
)


def build_snapshot(n_nodes: int, n_queues: int, n_cohorts: int, n_workloads: int, seed: int) -> Snapshot:
    """A deterministic large cluster and workload mix (see the module docstring of the bench)."""
    nodes = _nodes(n_nodes)
    pools = tuple(ResourcePool(m, (("pool", m),)) for m, _ in MODELS)
    queues = _queues(nodes, n_queues, n_cohorts)
    leaf_names = [q.name for q in queues if q.parent is not None]
    workloads = _workloads(np.random.default_rng(seed), leaf_names, n_workloads)
    return Snapshot(tuple(nodes), pools, tuple(queues), CLASSES, tuple(workloads))


def _nodes(n_nodes: int) -> list[Node]:
    """8-GPU nodes split evenly over the GPU models, 32 to a rack, NVLink domains of two."""
    nodes = []
    per_model = n_nodes // len(MODELS)
    for mi, (model, mem) in enumerate(MODELS):
        count = per_model if mi < len(MODELS) - 1 else n_nodes - per_model * (len(MODELS) - 1)
        for i in range(count):
            name = f"{model.lower()}-{i:05d}"
            rack = f"{model.lower()}-r{i // 32}"
            nodes.append(
                Node(
                    name,
                    model,
                    8,
                    mem,
                    128_000,
                    1_048_576,
                    4,
                    (("pool", model),),
                    (),
                    f"{model.lower()}-nvl{i // 2}",
                    rack,
                )
            )
    return nodes


def _queues(nodes: list[Node], n_queues: int, n_cohorts: int) -> list[Queue]:
    """Cohorts that split each pool's GPUs evenly, each with leaf queues splitting its share."""
    cap = {m: sum(1 for n in nodes if n.gpu_model == m) * 8000 for m, _ in MODELS}
    queues: list[Queue] = []
    leaves_per_cohort = max(1, n_queues // n_cohorts)
    for c in range(n_cohorts):
        root = f"cohort-{c:02d}"
        queues.append(
            Queue(
                root,
                quotas=tuple(PoolQuota(m, devices_only(cap[m] // n_cohorts)) for m, _ in MODELS),
            )
        )
        for leaf in range(leaves_per_cohort):
            g = tuple(
                PoolQuota(m, devices_only((cap[m] // n_cohorts // leaves_per_cohort) // 1000 * 1000))
                for m, _ in MODELS
            )
            queues.append(Queue(f"{root}-q{leaf:03d}", parent=root, weight=float(1 + leaf % 3), quotas=g))
    return queues


def _workloads(rng: np.random.Generator, leaf_names: list[str], n_workloads: int) -> list[Workload]:
    """The pending mix: whole-GPU pods of 1-8 GPUs, GPU fractions, and rack-preferring gangs.

    Every random draw is made here, in this order: the mix depends on the seed alone."""
    shapes = rng.choice(6, size=n_workloads, p=[0.35, 0.15, 0.10, 0.10, 0.20, 0.10])
    qidx = rng.integers(0, len(leaf_names), size=n_workloads)
    cidx = rng.choice(len(CLASSES), size=n_workloads, p=[0.05, 0.25, 0.2, 0.3, 0.2])
    pin = rng.random(n_workloads) < 0.5
    midx = rng.integers(0, len(MODELS), size=n_workloads)
    frac = rng.choice([250, 500], size=n_workloads)
    gang = rng.integers(2, 5, size=n_workloads)
    workloads = []
    for i in range(n_workloads):
        groups, topo = _pod_groups(int(shapes[i]), int(frac[i]), int(gang[i]))
        pc = CLASSES[int(cidx[i])]
        workloads.append(
            Workload(
                f"w{i:06d}",
                leaf_names[int(qidx[i])],
                groups,
                pc.name,
                pc.value,
                pc.preemptible,
                WorkloadType.TRAINING,
                gpu_models=(MODELS[int(midx[i])][0],) if pin[i] else (),
                topology=topo,
                arrival=float(i),
            )
        )
    return workloads


def _pod_groups(s: int, frac: int, gang: int) -> tuple[tuple[PodGroup, ...], Topology | None]:
    """The pods of shape ``s``: 0-3 one pod of 1/2/4/8 GPUs, 4 a GPU fraction, 5 a gang of 8-GPU pods."""
    if s < 4:
        req = PodRequest(
            gpus=(1, 2, 4, 8)[s],
            cpu_milli=8000 * (1, 2, 4, 8)[s],
            memory_mib=65536 * (1, 2, 4, 8)[s] // 2,
        )
        return (PodGroup("main", 1, req),), None
    if s == 4:
        req = PodRequest(gpu_milli=frac, cpu_milli=2000, memory_mib=16384)
        return (PodGroup("main", 1, req),), None
    req = PodRequest(gpus=8, cpu_milli=64000, memory_mib=524288, rdma=2)
    return (PodGroup("worker", gang, req),), Topology(TopologyScope.RACK, TopologyMode.PREFERRED)


def first_fit(snapshot: Snapshot) -> int:
    """Naive baseline: arrival order, first node that fits, gang rollback; no quota or topology."""
    nodes = snapshot.nodes
    model_of = np.array([MODELS.index(next(m for m in MODELS if m[0] == n.gpu_model)) for n in nodes])
    dev = np.full((len(nodes), 8), 1000, dtype=np.int32)
    placed = 0
    for w in sorted(snapshot.pending, key=lambda w: w.arrival):
        allowed = np.ones(len(nodes), dtype=bool)
        if w.gpu_models:
            allowed = model_of == [m[0] for m in MODELS].index(w.gpu_models[0])
        taken: list[tuple[int, np.ndarray, int]] = []
        ok = True
        for g in w.pod_groups:
            for _ in range(g.replicas):
                r = g.request
                if r.gpus:
                    free = (dev == 1000).sum(axis=1)
                    cand = np.flatnonzero(allowed & (free >= r.gpus))
                    if not len(cand):
                        ok = False
                        break
                    i = int(cand[0])
                    ds = np.flatnonzero(dev[i] == 1000)[: r.gpus]
                    dev[i, ds] -= 1000
                    taken.append((i, ds, 1000))
                else:
                    fit = (dev >= r.gpu_milli) & allowed[:, None]
                    flat = np.flatnonzero(fit)
                    if not len(flat):
                        ok = False
                        break
                    i, d = divmod(int(flat[0]), 8)
                    dev[i, d] -= r.gpu_milli
                    taken.append((i, np.array([d]), r.gpu_milli))
            if not ok:
                break
        if ok:
            placed += len(taken)
        else:
            for i, ds, m in taken:
                dev[i, ds] += m
    return placed


def _measure(fn: Callable[[], int]) -> dict[str, float]:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    placements = fn()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0  # on a shared machine the wall time also counts others' work
    gc.collect()
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "cycle_seconds": round(dt, 4),
        "cpu_seconds": round(cpu, 4),
        "placements": placements,
        "placements_per_second": round(placements / dt, 1) if dt > 0 else 0.0,
        "peak_memory_mb": round(peak / 2**20, 1),
    }


def run_engine_bench(
    n_nodes: int = 5000,
    n_queues: int = 1000,
    n_cohorts: int = 10,
    n_workloads: int = 50000,
    seed: int = 1,
    progress: Callable[[str], Any] | None = None,
    score: str = "auto",
) -> dict[str, Any]:
    """Run gpupool's cycle and the first-fit baseline on the same snapshot; return both."""
    say = progress or (lambda _m: None)
    say(f"building {n_nodes} nodes, {n_queues} queues in {n_cohorts} cohorts, {n_workloads} workloads ...")
    snap = replace(
        build_snapshot(n_nodes, n_queues, n_cohorts, n_workloads, seed), config=EngineConfig(score=score)
    )
    say("running gpupool's engine (one full cycle) ...")
    last: dict[str, Any] = {}

    def engine() -> int:
        d = decide(snap)
        last["d"] = d
        return sum(len(a.pods) for a in d.admitted)

    ours = _measure(engine)
    d = last["d"]
    ours.update(
        {
            "workloads_admitted": len(d.admitted),
            "workloads_pending": len(d.pending),
            "gpus_allocated": sum(p.gpu_milli * len(p.devices) for a in d.admitted for p in a.pods) / 1000,
        }
    )
    say("running the naive first-fit baseline ...")
    base = _measure(lambda: first_fit(snap))
    return {
        "nodes": n_nodes,
        "score": score,
        "gpus": n_nodes * 8,
        "queues": n_queues,
        "cohorts": n_cohorts,
        "workloads": n_workloads,
        **ours,
        "baseline": base,
        "speedup_vs_baseline": round(base["cycle_seconds"] / ours["cycle_seconds"], 2)
        if ours["cycle_seconds"]
        else None,
        "cpu_speedup_vs_baseline": round(base["cpu_seconds"] / ours["cpu_seconds"], 2)
        if ours["cpu_seconds"]
        else None,
    }


def format_result(res: dict[str, Any]) -> Table:
    t = Table(
        title=f"Engine benchmark: {res['nodes']} nodes / {res['gpus']} GPUs, {res['queues']} queues, {res['workloads']} workloads"
    )
    t.add_column("scheduler")
    for c in ("cycle s", "CPU s", "placements", "placements/s", "peak MiB"):
        t.add_column(c, justify="right")
    b = res["baseline"]
    t.add_row(
        "gpupool",
        f"{res['cycle_seconds']:.3f}",
        f"{res['cpu_seconds']:.3f}",
        str(res["placements"]),
        f"{res['placements_per_second']:,.0f}",
        f"{res['peak_memory_mb']:.1f}",
    )
    t.add_row(
        "first-fit baseline",
        f"{b['cycle_seconds']:.3f}",
        f"{b['cpu_seconds']:.3f}",
        str(b["placements"]),
        f"{b['placements_per_second']:,.0f}",
        f"{b['peak_memory_mb']:.1f}",
    )
    t.caption = (
        f"gpupool cycle is {res['speedup_vs_baseline']}x the baseline's speed "
        f"({res['cpu_speedup_vs_baseline']}x by CPU seconds); admitted {res['workloads_admitted']} workloads, "
        f"{res['gpus_allocated']:,.0f} GPUs allocated"
    )
    return t
