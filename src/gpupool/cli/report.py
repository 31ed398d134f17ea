"""``gpupool report usage | chargeback | weekly | tco``: cost review (成本复盘) from the CLI.

Why two sources: against a running service (``--server``) the report comes from the API and is
cut to the caller's queue subtree, like every other read; with ``--db URL`` an operator on the
control-plane host reads the store directly (the whole cluster), e.g. from a backup or a
simulator's database, with no server running.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta, tzinfo
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import fail

if TYPE_CHECKING:
    from gpupool.cost.profile_inputs import ProfileInput

report_app = typer.Typer(
    help="Cost review: usage, chargeback, the weekly report, TCO (docs/cost.md).", no_args_is_help=True
)


class Fmt(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    html = "html"


FromOpt = typer.Option(None, "--from", help="start, ISO-8601 UTC (default: 7 days before --to)")
ToOpt = typer.Option(None, "--to", help="end, ISO-8601 UTC (default: now; running work counts to here)")
FmtOpt = typer.Option(Fmt.table, "-o", "--output", help="table, csv, json or html")
FileOpt = typer.Option(None, "--out", "-f", help="write to this file instead of stdout")
DbOpt = typer.Option(None, "--db", help="read this store directly (SQLAlchemy URL) instead of a server")
PolicyOpt = typer.Option(
    None, "--policy", help="CostPolicy YAML (with --db/--sim; a server reads its cost.yaml)"
)
SimOpt = typer.Option(None, "--sim", help="report a simulator replay of this Scenario file instead")
SimPolicyOpt = typer.Option("gpupool", "--sim-policy", help="with --sim: the scheduling policy replayed")
VariantOpt = typer.Option(None, "--variant", help="with --sim: the cluster variant (default: the baseline)")
ForceOpt = typer.Option(
    False, "--force", help="answer even when the history is shorter than the method needs (with a warning)"
)


def _build(kind: str, data: Any, store: Any | None) -> dict[str, Any]:
    from gpupool.cost.reports import chargeback_report, usage_report
    from gpupool.cost.weekly import weekly_report

    if kind == "usage":
        return usage_report(data)
    if kind == "chargeback":
        return chargeback_report(data)
    return weekly_report(data, store)


def _simulated(
    kind: str, scenario: Path, sim_policy: str, variant: str | None, policy: Path | None
) -> dict[str, Any]:
    """The report of one simulated run over its whole horizon (--from/--to do not apply)."""
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import load_policy
    from gpupool.cost.reports import load
    from gpupool.cost.simhistory import replay
    from gpupool.sim.scenario import load_scenario

    if not scenario.exists():
        raise ValueError(f"--sim: {scenario} does not exist")
    if policy is not None and not policy.exists():
        raise ValueError(f"--policy: {policy} does not exist")
    r = replay(load_scenario(scenario), sim_policy, variant)
    return _build(kind, load(r.history, r.bundle, Window(r.start, r.end), load_policy(policy)), None)


def _local(kind: str, db: str, start: str | None, end: str | None, policy: Path | None) -> dict[str, Any]:
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import load_policy
    from gpupool.cost.reports import load_store, parse_time
    from gpupool.store import Store

    to = parse_time(end, "--to", datetime.now(UTC))
    window = Window(parse_time(start, "--from", to - timedelta(days=7)), to)
    if policy is not None and not policy.exists():
        raise ValueError(f"--policy: {policy} does not exist")
    with Store.open(db) as store:
        return _build(kind, load_store(store, window, load_policy(policy)), store)


def _run(
    kind: str,
    start: str | None,
    end: str | None,
    output: Fmt,
    out: Path | None,
    db: str | None,
    policy: Path | None,
    server: str | None,
    token: str | None,
    sim: tuple[Path | None, str, str | None] = (None, "gpupool", None),
) -> None:
    from gpupool.cost.policy import PolicyError
    from gpupool.cost.render import render

    try:
        if sim[0] is not None:
            rep = _simulated(kind, sim[0], sim[1], sim[2], policy)
        elif db is not None:
            rep = _local(kind, db, start, end, policy)
        else:
            params = {k: v for k, v in (("from", start), ("to", end)) if v}
            rep = Api(server, token).call("GET", f"/v1/reports/{kind}", params=params)
        text = render(rep, output.value)
    except (ValueError, PolicyError) as exc:
        fail(str(exc), 2)
    _write(text, out)


def _command(kind: str, doc: str) -> None:
    def cmd(
        start: str | None = FromOpt,
        end: str | None = ToOpt,
        output: Fmt = FmtOpt,
        out: Path | None = FileOpt,
        db: str | None = DbOpt,
        policy: Path | None = PolicyOpt,
        server: str | None = ServerOpt,
        token: str | None = TokenOpt,
        sim: Path | None = SimOpt,
        sim_policy: str = SimPolicyOpt,
        variant: str | None = VariantOpt,
    ) -> None:
        _run(kind, start, end, output, out, db, policy, server, token, (sim, sim_policy, variant))

    cmd.__doc__ = doc
    report_app.command(kind)(cmd)


_command(
    "usage", "GPU-hours allocated and used by queue, pool, type, priority class, GPU model, fraction, day."
)
_command("chargeback", "List charges, idle, waiting cost and losses; reconciled to the cent per pool.")
_command(
    "weekly", "The weekly review: figures, week-over-week, operations review; -o html is one offline page."
)


@report_app.command("tco")
def tco_cmd(
    params: Path | None = typer.Option(None, "--params", help="TCO assumptions, YAML (docs/cost.md)"),
    db: str = typer.Option(..., "--db", help="the store to read (SQLAlchemy URL)"),
    start: str | None = FromOpt,
    end: str | None = ToOpt,
    target_wait: float = typer.Option(0.5, "--target-wait", help="longest acceptable wait, hours"),
    horizon_days: int = typer.Option(14, "--horizon-days", min=1, max=366),
    force: bool = ForceOpt,
    output: Fmt = FmtOpt,
    out: Path | None = FileOpt,
) -> None:
    """GPUs needed to hold waits under a target (demand forecast per pool, a range from its
    prediction interval) and own-vs-rent cost; refuses less than two days of history."""
    import yaml

    from gpupool.cost.forecast import parse_tco, tco_report
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import CostPolicySpec
    from gpupool.cost.render import render
    from gpupool.cost.reports import load_store, parse_time
    from gpupool.store import Store

    try:
        doc = None
        if params is not None:
            if not params.exists():
                raise ValueError(f"--params: {params} does not exist")
            doc = yaml.safe_load(params.read_text(encoding="utf-8"))
            if doc is not None and not isinstance(doc, dict):
                raise ValueError(f"--params: {params}: expected a mapping of parameters")
        p = parse_tco(doc, "--params")
        to = parse_time(end, "--to", datetime.now(UTC))
        window = Window(parse_time(start, "--from", to - timedelta(days=28)), to)
        with Store.open(db) as store:
            rep = tco_report(load_store(store, window, CostPolicySpec()), p, target_wait, horizon_days, force)
        text = render(rep, output.value)
    except (ValueError, yaml.YAMLError) as exc:
        fail(str(exc), 2)
    _warn(rep)
    _write(text, out)


@report_app.command("forecast")
def forecast_cmd(
    db: str = typer.Option(..., "--db", help="the store to read (SQLAlchemy URL)"),
    start: str | None = FromOpt,
    end: str | None = ToOpt,
    target_wait: float = typer.Option(0.5, "--target-wait", help="longest acceptable wait, hours"),
    horizon_days: int = typer.Option(14, "--horizon-days", min=1, max=366),
    force: bool = ForceOpt,
    output: Fmt = FmtOpt,
    out: Path | None = FileOpt,
) -> None:
    """Demand forecast per pool with its 90% interval and the GPUs for a wait target (a range);
    refuses less than two days of history (--force answers with a warning)."""
    from gpupool.cost.forecast import forecast_report
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import CostPolicySpec
    from gpupool.cost.render import render
    from gpupool.cost.reports import load_store, parse_time
    from gpupool.store import Store

    try:
        to = parse_time(end, "--to", datetime.now(UTC))
        window = Window(parse_time(start, "--from", to - timedelta(days=28)), to)
        with Store.open(db) as store:
            rep = forecast_report(
                load_store(store, window, CostPolicySpec()), target_wait, horizon_days, force
            )
        text = render(rep, output.value)
    except ValueError as exc:
        fail(str(exc), 2)
    _warn(rep)
    _write(text, out)


def _warn(rep: dict[str, Any]) -> None:
    """A planning answer's warnings (short history, a design no better than today's) on stderr
    too, so they are seen whatever the output format."""
    for key in ("warning", "verdict", "explanation"):
        if rep.get("summary", {}).get(key):
            typer.echo(str(rep["summary"][key]), err=True)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"--out: cannot write {out}: {exc.strerror}")
    typer.echo(f"wrote {out} ({len(text.encode()):,} bytes)", err=True)


def evidence_cmd(
    out: Path = typer.Option(..., "-o", "--output", help="the bundle to write, FILE.zip"),
    db: str | None = DbOpt,
    sim: Path | None = SimOpt,
    sim_policy: str = SimPolicyOpt,
    variant: str | None = VariantOpt,
    start: str | None = FromOpt,
    end: str | None = ToOpt,
) -> None:
    """The POC evidence bundle (验收材料): allocation proof, run evidence, failure-recovery
    records and the verified audit chain, from a store (--db) or a simulator replay (--sim)."""
    from gpupool.cost.evidence import evidence, write_bundle
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import CostPolicySpec
    from gpupool.cost.reports import load, load_store, parse_time
    from gpupool.cost.simhistory import replay
    from gpupool.sim.scenario import load_scenario
    from gpupool.store import Store

    if (db is None) == (sim is None):
        fail("give exactly one of --db URL or --sim SCENARIO", 2)
    try:
        if sim is not None:
            if not sim.exists():
                raise ValueError(f"--sim: {sim} does not exist")
            r = replay(load_scenario(sim), sim_policy, variant)
            data = load(r.history, r.bundle, Window(r.start, r.end), CostPolicySpec())
            files = evidence(data, events=r.result.events)
            source = f"simulator replay of {sim} ({sim_policy})"
        else:
            assert db is not None
            to = parse_time(end, "--to", datetime.now(UTC))
            window = Window(parse_time(start, "--from", to - timedelta(days=7)), to)
            with Store.open(db) as store:
                data = load_store(store, window, CostPolicySpec())
                files = evidence(data, store)
            source = "store"
        about = {"source": source, "from": data.window.start.isoformat(), "to": data.window.end.isoformat()}
        manifest = write_bundle(out, files, about)
    except ValueError as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"-o: cannot write {out}: {exc.strerror}")
    typer.echo(f"wrote {out}: {len(manifest['files'])} files, {source}", err=True)


def _profile_source(
    scenario: Path | None,
    from_store: bool,
    db: str | None,
    window: tuple[str | None, str | None],
    pool: str | None,
    sacct: tuple[Path | None, str],
) -> ProfileInput:
    """The design and the trace ``profile`` works on: a Scenario file, or the store; the trace
    replaced by a Slurm export with ``--sacct`` (alone: the profile without a suggestion)."""
    from gpupool.cost.profile_inputs import ProfileInput, only_pool, scenario_of
    from gpupool.cost.profile_inputs import from_store as store_input
    from gpupool.cost.reports import parse_time
    from gpupool.cost.sacct import load_sacct
    from gpupool.manifests import Bundle
    from gpupool.sim.scenario import load_scenario
    from gpupool.sim.sources import Trace
    from gpupool.store import Store

    if scenario is not None and from_store:
        raise ValueError("profile: give a SCENARIO or --from-store, not both")
    if db is not None and not from_store:
        raise ValueError("--db: only with --from-store")
    if from_store:
        from gpupool.service.config import ServiceConfig

        to = parse_time(window[1], "--to", datetime.now(UTC))
        start = parse_time(window[0], "--from", to - timedelta(days=28))
        with Store.open(db or ServiceConfig().url) as store:
            inp = store_input(store, start, to, pool)
    elif scenario is not None:
        if not scenario.exists():
            raise ValueError(f"scenario: {scenario} does not exist")
        from gpupool.cost.simhistory import BASE

        sc = load_scenario(scenario)  # its second 0 is the simulator's Monday, as in report --sim
        inp = ProfileInput(only_pool(sc, pool, {}) if pool else sc, origin=BASE)
    elif sacct[0] is not None:
        inp = ProfileInput(scenario_of(Bundle(), [], "sacct"))
        inp.notes.append("no design (SCENARIO or --from-store): the profile without a suggestion")
    else:
        raise ValueError("profile: give a SCENARIO, --from-store or --sacct FILE")
    if sacct[0] is not None:
        tr = load_sacct(sacct[0], sacct[1])
        inp.scenario.trace = Trace(jobs=tr.jobs)
        inp.origin = None  # the export's own clock is not kept: hours from its first submission
        inp.observed = list(tr.observed)
        inp.notes += [f"sacct rows not replayed ({why}): {n}" for why, n in sorted(tr.skipped.items())]
    return inp


def profile_cmd(
    scenario: Path | None = typer.Argument(None, help="a Scenario file: its trace and its current design"),
    from_store: bool = typer.Option(
        False, "--from-store", help="profile the store's recorded workloads on its configuration"
    ),
    db: str | None = typer.Option(None, "--db", help="with --from-store: the store (default: the server's)"),
    start: str | None = typer.Option(None, "--from", help="with --from-store: since (default: 28 days)"),
    end: str | None = typer.Option(None, "--to", help="with --from-store: until (default: now)"),
    pool: str | None = typer.Option(None, "--pool", help="profile one pool of a design with several"),
    sacct: Path | None = typer.Option(
        None, "--sacct", help="the trace from a Slurm `sacct --parsable2` export (docs/cost.md)"
    ),
    sacct_queue: str = typer.Option(
        "account", "--sacct-queue", help="what a Slurm job's queue is: account, user or partition"
    ),
    fit_share: float = typer.Option(
        0.7, "--fit-share", help="share of the trace (by submit time) the design is fitted on"
    ),
    percentile: float = typer.Option(
        50.0, "--percentile", min=1, max=99, help="guarantee = this percentile of hourly demand"
    ),
    out_dir: Path | None = typer.Option(
        None, "--out-dir", help="write suggested.yaml (ResourcePool and Queues) here"
    ),
    do_replay: bool = typer.Option(
        False, "--replay", help="replay both designs on the held-out part (slow on big traces)"
    ),
    tz: str | None = typer.Option(
        None, "--tz", help="time zone of the hour-of-day rhythm, IANA name (default: the server's local zone)"
    ),
    output: Fmt = FmtOpt,
) -> None:
    """Task profile (梳理任务画像): demand per type and queue, rhythm, preemption advice, and a
    suggested queue design fitted on the first part of the trace, replayed on the rest."""
    import yaml

    from gpupool.cost import profile as prof
    from gpupool.cost.render import render

    try:
        zone = prof.zone(tz)
        inp = _profile_source(scenario, from_store, db, (start, end), pool, (sacct, sacct_queue))
        rep, docs = _profile_report(inp, fit_share, percentile, do_replay, zone)
    except ValueError as exc:
        fail(str(exc), 2)
    rep["scope"] = "store" if from_store else str(scenario or sacct)
    _warn(rep)
    if out_dir is not None and docs and "verdict" not in rep["summary"]:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "suggested.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
        typer.echo(f"wrote {out_dir / 'suggested.yaml'} ({len(docs)} documents)", err=True)
    sys.stdout.write(render(rep, output.value))


def _profile_report(
    inp: ProfileInput, fit_share: float, percentile: float, do_replay: bool, zone: tzinfo | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The profile's report and the suggestion's manifests; the summary warns on a fitted part
    shorter than a day and carries the verdict when the replay shows the suggestion worse."""
    from gpupool.cost import profile as prof
    from gpupool.cost.profile_inputs import observed_table

    sc = inp.scenario
    fit, rest, cut = prof.split(sc.trace.jobs, fit_share)
    tables = [*prof.profile_tables(fit, inp.origin, zone), prof.preemption_advice(fit)]
    if inp.observed:
        tables.append(observed_table(inp.observed))
    docs: list[dict[str, Any]] = []
    verdict = None
    if sc.variants[0].nodes:
        docs, variant = prof.suggested_design(sc, fit, percentile)
        if do_replay:
            tables.append(prof.compare(sc, rest, variant))
            verdict = prof.verdict(tables[-1])
    summary: dict[str, Any] = {"jobs": len(sc.trace.jobs), "fittedOn": len(fit), "heldOut": len(rest)}
    fitted_s = cut - min((j.submit for j in fit), default=cut)
    warning = prof.PROFILE_LIMIT.check(fitted_s, f"the fitted {fit_share:g} of the trace", True)
    summary |= {"warning": warning} if warning else {}
    summary |= {"verdict": verdict} if verdict else {}
    summary |= {"cutAtS": round(cut, 1)} | ({"notes": "; ".join(inp.notes)} if inp.notes else {})
    rep: dict[str, Any] = {"kind": "profile", "from": "trace start", "to": "trace end", "currency": ""}
    return rep | {"scope": "", "summary": summary, "tables": tables}, docs


def plan_cmd(
    add: list[str] = typer.Option(
        ..., "--add", help="COUNTxGPU-MODEL: that many nodes like today's (repeatable)"
    ),
    db: str = typer.Option(..., "--db", help="the store whose history is replayed (SQLAlchemy URL)"),
    start: str | None = typer.Option(
        None, "--from", help="replay workloads submitted since (default: 7 days before --to)"
    ),
    end: str | None = ToOpt,
    policy: Path | None = PolicyOpt,
    output: Fmt = FmtOpt,
) -> None:
    """What-if (容量规划): replay the recorded workloads on today's design and with more nodes;
    says why when more nodes wait longer, warns on less than a day of history."""
    from gpupool.cost import plan as planner
    from gpupool.cost.forecast import observed_since
    from gpupool.cost.metering import Window
    from gpupool.cost.policy import load_policy
    from gpupool.cost.render import render
    from gpupool.cost.reports import load_store, parse_time, report
    from gpupool.store import Store

    try:
        if policy is not None and not policy.exists():
            raise ValueError(f"--policy: {policy} does not exist")
        to = parse_time(end, "--to", datetime.now(UTC))
        window = Window(parse_time(start, "--from", to - timedelta(days=7)), to)
        with Store.open(db) as store:
            data = load_store(store, window, load_policy(policy))
            since = observed_since(data)  # the replay starts when the cluster existed
            jobs = planner.jobs_of(data.history, store.list_workloads(), data.bundle, since)
        added = planner.parse_add(add, data.bundle.nodes)
        prices = {name: p.price for name, p in data.pools.items()}
        table = planner.plan(jobs, data.bundle, added, prices)
    except ValueError as exc:
        fail(str(exc), 2)
    summary: dict[str, Any] = {"added": ", ".join(add), "workloads": len(jobs)}
    warning = planner.PLAN_LIMIT.check(
        (to - since).total_seconds(), f"since {since:%Y-%m-%d %H:%M} UTC", True
    )
    summary |= {"warning": warning} if warning else {}
    summary |= {"explanation": table.pop("note")} if table.get("note") else {}
    rep = report("plan", data, [table], summary)
    _warn(rep)
    sys.stdout.write(render(rep, output.value))


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``report``, ``evidence`` and ``profile`` to the gpupool command."""
    app.add_typer(report_app, name="report")
    app.command("evidence")(evidence_cmd)
    app.command("profile")(profile_cmd)
    app.command("plan")(plan_cmd)
