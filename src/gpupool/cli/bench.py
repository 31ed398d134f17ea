"""``gpupool bench engine | fragmentation | kube``: benchmarks that print figures.

Why a module of its own: gpupool.cli.main loads it only when a benchmark runs; each benchmark
imports what it measures inside its command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from gpupool.cli.common import Output, console, err_console, fail
from gpupool.cli.files import FileProblem, read_text


def bench_engine(
    nodes: int = typer.Option(5000, help="nodes (8 GPUs each, 4 GPU models)"),
    queues: int = typer.Option(1000, help="leaf queues"),
    cohorts: int = typer.Option(10, help="cohorts (top-level queues)"),
    workloads: int = typer.Option(50000, help="pending workloads"),
    seed: int = typer.Option(1),
    score: str = typer.Option(
        "auto", help="Score plugin: auto (the engine default), fragmentation, binpack, spread"
    ),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """One full scheduling cycle on a large synthetic cluster, against a naive first-fit baseline."""
    from gpupool.bench.engine import format_result, run_engine_bench
    from gpupool.engine.placement import SCORERS

    if score not in SCORERS:
        fail(f"--score: unknown policy {score!r}; choose one of {', '.join(SCORERS)}")
    say = None if output is Output.json else console.print
    res = run_engine_bench(nodes, queues, cohorts, workloads, seed, progress=say, score=score)
    if output is Output.json:
        sys.stdout.write(json.dumps(res) + "\n")
    else:
        console.print(format_result(res))


def bench_fragmentation(
    nodes: Path = typer.Option(
        ..., "--nodes", help="openb node list CSV (sn,cpu_milli,memory_mib,gpu,model)"
    ),
    pods: Path = typer.Option(..., "--pods", help="openb pod list CSV"),
    policy: list[str] = typer.Option(None, "--policy", help="policies to run (default: all)"),
    seeds: int = typer.Option(10, "--seeds", min=1),
    variant: str = typer.Option(
        None,
        "--variant",
        help="KIND=LEVEL: run on the pod list with one share moved (model-constrained=0.3, "
        "gpu-share=0.8, multi-gpu=0.4, cpu-heavy=2.0)",
    ),
    variant_seed: int = typer.Option(0, "--variant-seed", min=0, help="seed the variant is drawn with"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """The FGD paper's experiment: GPU allocation ratio when arrived requests reach 100% of capacity."""
    from gpupool.fragbench import ENGINE_POLICIES, POLICIES, FragbenchError, format_table, run_fragmentation

    for f in (nodes, pods):
        if not f.is_file():
            fail(f"{f}: no such file")
        try:
            read_text(f)  # a binary or Latin-1 trace is one line here, not a traceback later
        except FileProblem as exc:
            fail(str(exc))
    known = (*POLICIES, *ENGINE_POLICIES)
    unknown = [p for p in policy or [] if p not in known]
    if unknown:
        fail(f"--policy: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    say = None if output is Output.json else (lambda m: err_console.print(m, highlight=False))
    try:
        res = run_fragmentation(
            nodes, pods, list(policy) if policy else None, seeds, say, variant, variant_seed
        )
    except FragbenchError as exc:
        fail(str(exc))
        raise AssertionError from exc
    if output is Output.json:
        sys.stdout.write(json.dumps(res) + "\n")
    else:
        console.print(format_table(res))


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``bench engine``, ``bench fragmentation`` and ``bench kube`` (the Kubernetes adapter
    against the fake API server, gpupool.bench.kube)."""
    from gpupool.bench.kube import bench_kube_command

    bench_app.command("engine")(bench_engine)
    bench_app.command("fragmentation")(bench_fragmentation)
    bench_app.command("kube")(bench_kube_command)
