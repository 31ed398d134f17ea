"""``gpupool sim SCENARIO.yaml [-o json] [--report report.html] [--out-dir DIR]``.

Bad input (a malformed trace row, a scenario field) is printed with its file, line or field and
exits 2, never with a traceback.
"""

from __future__ import annotations

import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpupool.sim.metrics import SUMMARY_ROWS
from gpupool.sim.runner import Run, dumps, run_scenario, to_json
from gpupool.sim.scenario import Scenario, load_scenario
from gpupool.sim.sources import SimInputError


class Output(StrEnum):
    table = "table"
    json = "json"


def _fail(msg: str) -> None:
    # the message is data (names, patterns, reasons): brackets in it are not styling
    Console(stderr=True).print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(2)


def sim(
    scenario: Path = typer.Argument(..., help="Scenario YAML (kind: Scenario)"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
    report: Path | None = typer.Option(None, "--report", help="write a self-contained HTML report"),
    out_dir: Path | None = typer.Option(None, "--out-dir", help="write metrics.json and CSV tables here"),
    check_invariants: bool = typer.Option(
        False, "--check-invariants", help="run the engine's invariant checker after every cycle (slow)"
    ),
) -> None:
    """Replay a trace through each policy in virtual time and compare them side by side."""
    console = Console()
    t0 = time.perf_counter()
    sc = _load(scenario)
    show = output is Output.table and sys.stderr.isatty()
    runs = _run(sc, show, check_invariants or None)
    wall = time.perf_counter() - t0
    data = to_json(sc, runs)
    if report is not None or out_dir is not None:
        from gpupool.sim.report import write_outputs

        written = write_outputs(data, report, out_dir)
    else:
        written = []
    violations = sum(len(r.result.violations) for r in runs)
    if output is Output.json:
        sys.stdout.write(dumps(data))
    else:
        _print_summary(console, sc, runs, data, written, wall)
    if violations:
        Console(stderr=True).print(f"[red]{violations} invariant violation(s)[/] (see the JSON output)")
        raise typer.Exit(1)


def _load(scenario: Path) -> Scenario:
    """The scenario, or exit 2 with every problem found (nothing is run on bad input)."""
    if not scenario.exists():
        _fail(f"{scenario}: no such file")
    try:
        return load_scenario(scenario)
    except SimInputError as exc:
        _fail(f"{len(exc.errors)} problem(s); nothing was run:\n  " + "\n  ".join(exc.errors))
        raise AssertionError from exc  # unreachable


def _run(sc: Scenario, show: bool, check_invariants: bool | None) -> list[Run]:
    """Run every policy; with a progress bar per run on a terminal (``show``)."""
    if not show:
        return run_scenario(sc, None, check_invariants)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} arrivals"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as prog:
        tasks: dict[str, TaskID] = {}

        def progress(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = prog.add_task(label, total=total)
            if done % 256 == 0 or done == total:
                prog.update(tasks[label], completed=done)

        return run_scenario(sc, progress, check_invariants)


def _print_summary(
    console: Console, sc: Scenario, runs: list[Run], data: dict[str, Any], written: list[Path], wall: float
) -> None:
    """The runs side by side (the best value of each row in bold), the rejected jobs, the files."""
    t = Table(title=f"{sc.name}: {len(sc.trace.jobs)} jobs, seed {sc.seed}")
    t.add_column("metric")
    for r in runs:
        t.add_column(r.label, justify="right")
    for key, label, higher in SUMMARY_ROWS:
        vals = [r.metrics.get(key, 0) for r in runs]
        best = (max if higher else min)(vals)
        t.add_row(
            label,
            *[
                (f"[bold green]{v:,.4g}[/]" if v == best and len(set(vals)) > 1 else f"{v:,.4g}")
                for v in vals
            ],
        )
    console.print(t)
    rej = data["rejected"]
    if rej["count"]:
        console.print(f"[yellow]{rej['count']} job(s) rejected[/] (listed in the JSON output and report):")
        for x in rej["jobs"][:10]:
            console.print(f"  {x['job']} ({x['source']}): {x['reason']}", highlight=False)
    for p in written:
        console.print(f"wrote {p}")
    console.print(f"[dim]simulated in {wall:.1f}s wall time[/]")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``gpupool sim`` to the main CLI."""
    app.command("sim")(sim)
