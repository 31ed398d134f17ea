"""``gpupool validate | schedule | demo``: the engine run offline on manifests, no server.

Why a module of its own: these commands need the engine (and numpy under it) and the manifest
models; the client commands and ``gpupool --version`` must not pay for them (gpupool.cli.main
loads this module only when one of these commands runs).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import typer
from rich.markup import escape

from gpupool.cli.common import EXAMPLES, Output, console, err_console, fail
from gpupool.cli.files import FileProblem, load_documents
from gpupool.cli.render import decisions_json, decisions_table
from gpupool.engine import apply_decisions, decide
from gpupool.engine.invariants import check_cycle
from gpupool.manifests import Bundle, ManifestError, build, default_priority_classes, load_files
from gpupool.model import Snapshot


def _load(paths: list[Path]) -> Snapshot:
    """The manifests as a snapshot, read and validated as `apply`/`submit` read them."""
    try:
        b = build(load_documents(paths), Bundle(priority_classes=list(default_priority_classes())))
    except FileProblem as exc:
        fail(str(exc))
        raise AssertionError from exc  # unreachable
    except ManifestError as exc:
        fail(
            f"{len(exc.errors)} problem(s) in the manifests; nothing was applied:\n  "
            + "\n  ".join(exc.errors)
        )
        raise AssertionError from exc  # unreachable
    return Snapshot(
        tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(b.priority_classes), tuple(b.workloads)
    )


def validate(
    files: list[Path] = typer.Option(..., "-f", "--filename", help="YAML files or directories"),
) -> None:
    """Check manifests and report every problem with its file, object and field.

    A simulator Scenario and the cluster files it names are checked as a set of their own
    (gpupool.cli.bundles says why)."""
    from gpupool.cli.bundles import validation_sets

    try:
        sets = validation_sets(files)
    except FileProblem as exc:
        fail(str(exc))
        raise AssertionError from exc  # unreachable
    if sets.problems:
        fail(f"{len(sets.problems)} problem(s) in the scenarios:\n  " + "\n  ".join(sets.problems))
    named = [("", sets.config)] + [(f" (scenario {escape(str(p))})", fs) for p, fs in sets.scenarios.items()]
    for label, paths in named:
        if not paths and label:
            console.print(f"[green]valid[/]{label}: the scenario (its cluster is inline)")
        elif paths:
            s = _load(paths)
            console.print(
                f"[green]valid[/]{label}: {len(s.nodes)} nodes, {len(s.pools)} pools, {len(s.queues)} queues, "
                f"{len(s.priority_classes)} priority classes, {len(s.pending)} workloads"
            )


def schedule(
    files: list[Path] = typer.Option(..., "-f", "--filename", help="YAML files or directories"),
    output: Output = typer.Option(Output.table, "-o", "--output"),
) -> None:
    """Run one scheduling cycle offline on manifests and show what the engine decided and why."""
    s = _load(files)
    d = decide(s)
    after = apply_decisions(s, d)
    problems = check_cycle(s, d, after)
    if output is Output.json:
        out = decisions_json(d)
        out["invariantViolations"] = problems
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        console.print(decisions_table(d, {w.name: w for w in s.pending}))
        _capacity(after)
        if problems:
            err_console.print("[red]invariant violations:[/] " + "; ".join(problems))
    if problems:
        raise typer.Exit(1)


def _capacity(s: Snapshot) -> None:
    from rich.table import Table

    t = Table(title="Pools after the cycle")
    for c in ("pool", "nodes", "GPUs", "allocated", "ratio"):
        t.add_column(c)
    for p in s.pools:
        nodes = [n for n in s.nodes if p.selects(n)]
        cap = sum(n.gpu_count for n in nodes) * 1000
        used = sum(
            pp.gpu_milli * len(pp.devices)
            for r in s.running
            if r.admission.pool == p.name
            for pp in r.admission.pods
        )
        t.add_row(
            p.name,
            str(len(nodes)),
            f"{cap / 1000:g}",
            f"{used / 1000:g}",
            f"{100 * used / cap:.1f}%" if cap else "-",
        )
    console.print(t)


def demo() -> None:
    """Two scheduling cycles over examples/: a first wave, then a team reclaiming its guarantee."""
    if not EXAMPLES.exists():
        fail(f"examples not found at {EXAMPLES}")
    try:
        docs = load_files([EXAMPLES / "cluster", EXAMPLES / "workloads"])
        wave2 = load_files([EXAMPLES / "wave2"])
        b = build(docs + wave2, Bundle(priority_classes=list(default_priority_classes())))
    except ManifestError as exc:
        fail("the examples do not validate:\n  " + "\n  ".join(exc.errors))
        raise AssertionError from exc
    second = {d.name for d in wave2}
    first = tuple(w for w in b.workloads if w.name not in second)
    snap = Snapshot(tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(b.priority_classes), first)
    console.print(
        f"[bold]gpupool demo[/]: {len(b.nodes)} nodes in {len(b.pools)} pools, {len(b.queues)} queues ({EXAMPLES})"
    )
    d1 = decide(snap)
    after = apply_decisions(snap, d1, now=0.0)
    problems = check_cycle(snap, d1, after)
    console.print(
        decisions_table(d1, {w.name: w for w in b.workloads}, "Cycle 1: the first wave of workloads")
    )
    snap2 = replace(
        after, pending=after.pending + tuple(w for w in b.workloads if w.name in second), now=60.0
    )
    d2 = decide(snap2)
    after2 = apply_decisions(snap2, d2, now=60.0)
    problems += check_cycle(snap2, d2, after2)
    console.print(
        decisions_table(
            d2,
            {w.name: w for w in b.workloads},
            "Cycle 2: vision-team submits within its guarantee and reclaims",
        )
    )
    _capacity(after2)
    if problems:
        fail("invariant violations: " + "; ".join(problems), code=1)
    console.print(
        "Next: [bold]gpupool schedule -f examples/cluster -f examples/workloads -o json[/] for machine-readable "
        "decisions, [bold]gpupool bench engine[/] for the large benchmark."
    )


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``validate``, ``schedule`` and ``demo`` to the gpupool command."""
    for fn in (validate, schedule, demo):
        app.command()(fn)
