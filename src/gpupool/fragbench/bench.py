"""Entry point of the fragmentation benchmark (``gpupool bench fragmentation``).

Why it exists: it reproduces the FGD paper's "GPU allocation ratio at 100%
arrival" table on the public openb traces, so the project's default placement
policy is checked against a published, independently produced number.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from gpupool.engine.fgd import CompiledShapes, ShapeDistribution, per_gpu_weights
from gpupool.fragbench.engine_run import ENGINE_POLICIES, simulate_seed_engine
from gpupool.fragbench.sim import POLICIES, Cluster, PodTable, simulate_seed
from gpupool.fragbench.trace import FragbenchError, Node, Pod, load_nodes, load_pods
from gpupool.fragbench.variants import apply_variant, parse_variant, shares

__all__ = ["PUBLISHED", "format_table", "run_fragmentation"]

# Median of 10 seeds from the paper's published result files (percent; see shared/data/README.md).
_COLUMNS = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
PUBLISHED: dict[str, dict[str, float]] = {
    trace: dict(zip(_COLUMNS, figures, strict=True))
    for trace, figures in {
        "default": (86.25, 90.56, 91.58, 91.81, 92.91, 95.23),
        "gpushare40": (84.96, 89.34, 89.82, 89.81, 91.47, 93.95),
        "gpuspec10": (86.31, 90.25, 91.94, 92.23, 93.12, 94.70),
        "multigpu20": (86.84, 91.81, 93.38, 93.51, 93.73, 95.53),
        "cpu100": (87.44, 91.78, 92.54, 92.56, 93.28, 95.21),
    }.items()
}


def _cpu_only(pods: list[Pod]) -> int:
    return sum(p.cpu_milli for p in pods if p.num_gpu == 0)


def _trace_name(pods_csv: Path) -> str:
    stem = Path(pods_csv).stem
    return stem.removeprefix("openb_pod_list_")


def run_fragmentation(
    nodes_csv: Path,
    pods_csv: Path,
    policies: list[str] | None = None,
    seeds: int = 10,
    progress: Callable[[str], None] | None = None,
    variant: str | None = None,
    variant_seed: int = 0,
) -> dict[str, Any]:
    """Run the allocation-ratio-at-100%-arrival experiment; median over ``seeds`` seeds.

    ``variant`` (``KIND=LEVEL``, see :mod:`gpupool.fragbench.variants`) runs on the pod list
    derived from ``pods_csv`` with that share moved, drawn with ``variant_seed``.

    Returns ``{"results": [{"policy", "allocation_ratio_median", "seeds"}, ...],
    "trace", "skipped_pods", "published", ...}``; ratios are percents.
    """
    if seeds < 1:
        raise FragbenchError(f"seeds must be >= 1 (got {seeds})")
    known = (*POLICIES, *ENGINE_POLICIES)
    names = [p.lower() for p in (policies or list(known))]
    unknown = [p for p in names if p not in known]
    if unknown:
        raise FragbenchError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(known)}")
    wanted = parse_variant(variant) if variant is not None else None
    nodes = load_nodes(Path(nodes_csv))
    pods = load_pods(Path(pods_csv))
    base_cpu = _cpu_only(pods)
    base_shares = shares(pods, base_cpu)
    if wanted is not None:
        pods = apply_variant(pods, nodes, wanted, variant_seed)
    cluster = Cluster.from_nodes(nodes)
    if cluster.gpu_capacity_milli == 0:
        raise FragbenchError(f"{nodes_csv}: the node list has no GPUs")
    table = PodTable.build(pods, cluster)
    # FGD weighs shapes by their share of pods (the paper); gpupool by demand per usable GPU
    pool = per_gpu_weights(ShapeDistribution.from_pods(pods, popularity=1.0), cluster.kinds)
    shapes = {
        "fgd": ShapeDistribution.from_pods(pods).compile(cluster.models),
        "gpupool": pool.compile(cluster.models),
    }
    trace = _trace_name(Path(pods_csv)) + (f"+{wanted.label}" if wanted is not None else "")
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    for name in names:
        row = _run_policy(name, seeds, nodes, pods, table, cluster, shapes)
        results.append(row)
        if progress is not None:
            progress(f"{trace}: {name} median {row['allocation_ratio_median']:.2f}% over {seeds} seeds")
    return {
        "results": results,
        "trace": trace,
        "nodes_csv": str(nodes_csv),
        "pods_csv": str(pods_csv),
        "seeds": seeds,
        "nodes": len(nodes),
        "gpus": cluster.gpu_capacity_milli // 1000,
        "trace_pods": len(pods),
        "skipped_pods": {
            "unknown_gpu_model": int(table.unknown_model.sum()),
            "impossible": int(table.impossible.sum()),
        },
        "published": dict(PUBLISHED.get(trace, {})),
        "variant": None
        if wanted is None
        else {"kind": wanted.kind, "level": wanted.level, "seed": variant_seed},
        "shares": {"base": base_shares, "run": shares(pods, base_cpu)},
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


def _run_policy(
    name: str,
    seeds: int,
    nodes: list[Node],
    pods: list[Pod],
    table: PodTable,
    cluster: Cluster,
    shapes: dict[str, CompiledShapes],
) -> dict[str, Any]:
    """One policy over ``seeds`` seeds: the median, every seed's ratio and pods skipped."""
    t0 = time.perf_counter()
    ratios: list[float] = []
    skipped: list[int] = []
    for seed in range(seeds):
        if name in ENGINE_POLICIES:  # the product's engine itself places the pods
            ratio, skip = simulate_seed_engine(
                nodes, pods, table, cluster, seed, name.removeprefix("engine-")
            )
        else:
            ratio, skip = simulate_seed(cluster, table, name, seed, shapes.get(name, shapes["fgd"]))
        ratios.append(round(ratio, 4))
        skipped.append(skip)
    return {
        "policy": name,
        "allocation_ratio_median": round(statistics.median(ratios), 4),
        "seeds": ratios,
        "skipped_pods_per_seed": skipped,
        "elapsed_s": round(time.perf_counter() - t0, 2),
    }


def format_table(result: dict[str, Any]) -> Table:
    """Rich table: measured median per policy, the paper's figure, and the gap to published FGD."""
    published: dict[str, float] = result.get("published", {})
    fgd = published.get("fgd")
    table = Table(title=f"GPU allocation ratio at 100% arrival: {result.get('trace', '?')} (median, %)")
    table.add_column("policy")
    table.add_column("measured", justify="right")
    table.add_column("published", justify="right")
    table.add_column("vs published FGD", justify="right")
    for row in result["results"]:
        measured = float(row["allocation_ratio_median"])
        pub = published.get(row["policy"])
        table.add_row(
            row["policy"],
            f"{measured:.2f}",
            f"{pub:.2f}" if pub is not None else "-",
            f"{measured - fgd:+.2f}" if fgd is not None else "-",
        )
    return table
