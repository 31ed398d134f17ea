"""Entry point: ``gpupool demo | schedule | validate | bench ...``.

Errors a user can act on are printed as one clear message and exit 2; never a traceback.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import replace
from enum import StrEnum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from gpupool.cli.files import FileProblem, load_documents, read_text
from gpupool.cli.kube import kube_app
from gpupool.cli.render import decisions_json, decisions_table
from gpupool.engine import apply_decisions, decide
from gpupool.engine.invariants import check_cycle
from gpupool.manifests import Bundle, ManifestError, build, default_priority_classes, load_files
from gpupool.model import Snapshot

app = typer.Typer(
    help="gpupool: a governed GPU compute scheduling platform.", no_args_is_help=True, add_completion=True
)


def _version(value: bool) -> None:
    """``gpupool --version``: the installed package's version (what a bug report needs first)."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            sys.stdout.write(f"gpupool {version('gpupool')}\n")
        except PackageNotFoundError:
            sys.stdout.write("gpupool (not installed as a package)\n")
        raise typer.Exit()


@app.callback()
def _top(
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
) -> None:
    """gpupool: a governed GPU compute scheduling platform."""


bench_app = typer.Typer(
    help="Benchmarks that print figures (ratios against a baseline run in the same process)."
)
app.add_typer(bench_app, name="bench")
app.add_typer(kube_app, name="kube")
# Wide tables when piped (CI logs, `make run | less`); the terminal's width otherwise.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


class Output(StrEnum):
    table = "table"
    json = "json"


def fail(msg: str, code: int = 2) -> None:
    """Print an actionable error and exit without a traceback."""
    # the message is data (names, patterns, reasons): brackets in it are not styling
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


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


@app.command()
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


@app.command()
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


@app.command()
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


@bench_app.command("engine")
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


@bench_app.command("fragmentation")
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


def _register_bench_kube() -> None:
    """``gpupool bench kube``: the Kubernetes adapter against the fake API server (gpupool.bench.kube)."""
    from gpupool.bench.kube import bench_kube_command

    bench_app.command("kube")(bench_kube_command)


_register_bench_kube()


# Command groups that live in their own modules register themselves here. A module that is not
# present is skipped; an error inside one that is present is not hidden.
COMMAND_MODULES = (
    "gpupool.cli.sim",
    "gpupool.cli.server",
    "gpupool.cli.client",
    "gpupool.deploy.cli",
    "gpupool.cli.logs",
    "gpupool.cli.report",
    "gpupool.cli.governance",
)


def _register_modules() -> None:
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        mod.register(app, bench_app)


_register_modules()


def main() -> None:
    """Console-script entry point; turns unexpected errors into one line, not a traceback."""
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
