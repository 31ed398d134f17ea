"""``gpupool history``, ``gpupool diff`` and ``gpupool rollback``: the configuration's history,
what changed, and going back — always forward, as a new revision, previewed first.

Why a rollback is an apply: the earlier revision's object is sent through ``POST /v1/apply``
like any change, so it is validated against the configuration as it is now, authorized,
previewed (gpupool.service.preview) and recorded as the next revision; history is never
rewritten. ``gpupool onboard`` (gpupool.cli.onboard) registers itself here too.
"""

from __future__ import annotations

from typing import Any

import typer

from gpupool.cli.client.apply import post_apply, print_results
from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.objects import CONFIG_RESOURCES, resource
from gpupool.cli.client.output import Format, Out, OutOpt, console, emit, fail, show, table
from gpupool.cli.preview_text import print_preview

KindArg = typer.Argument(..., help="pools|queues|priorityclasses|clusters (or pool, queue, ...)")


def config_resource(kind: str) -> str:
    """The API plural of a configuration kind as typed; exit 2 for anything else."""
    res = resource(kind)
    if res not in CONFIG_RESOURCES:
        fail(f"{kind!r} has no configuration history; one of {', '.join(CONFIG_RESOURCES)}", 2)
    return res


def history(
    kind: str = KindArg,
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Every revision of one object: number, time, author, action and reason."""
    api = Api(server, token)
    data = api.call("GET", f"/v1/revisions/{config_resource(kind)}/{name}")
    rows = [
        (r["revision"], r["at"][:19].replace("T", " "), r["author"], r["action"], r["reason"] or "-")
        for r in data["items"]
    ]
    emit(data, output, table(("REVISION", "AT (UTC)", "AUTHOR", "ACTION", "REASON"), rows))


def diff(
    kind: str = KindArg,
    name: str = typer.Argument(...),
    rev_from: int | None = typer.Option(None, "--from", min=1, help="default: the one before --to"),
    rev_to: int | None = typer.Option(None, "--to", min=1, help="default: the latest"),
    fields: bool = typer.Option(
        False, "--fields", help="one line per changed field instead of a unified diff"
    ),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """What changed between two revisions of one object (a unified diff of the YAML)."""
    api = Api(server, token)
    params: dict[str, Any] = {}
    if rev_from is not None:
        params["from"] = rev_from
    if rev_to is not None:
        params["to"] = rev_to
    data = api.call("GET", f"/v1/revisions/{config_resource(kind)}/{name}/diff", params=params)
    if output not in (Out.table, Out.wide):
        emit(data, output)
    elif fields:
        rows = [(c["field"], _val(c["from"]), _val(c["to"])) for c in data["changes"]]
        show(table(("FIELD", f"REVISION {data['from']}", f"REVISION {data['to']}"), rows))
    else:
        text = data["unified"] or f"revisions {data['from']} and {data['to']} are the same\n"
        console.print(text, end="", highlight=False, soft_wrap=True, markup=False)


def _val(v: Any) -> str:
    return "(absent)" if v is None else str(v)


def rollback(
    kind: str = KindArg,
    name: str = typer.Argument(...),
    to: int = typer.Option(..., "--to", min=1, help="the revision whose object to apply again"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the preview only; change nothing"),
    reason: str = typer.Option("", "--reason", help="why (default: says which revision is restored)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Apply revision R's object again as a new revision, after printing its preview."""
    api = Api(server, token)
    res = config_resource(kind)
    rev = api.call("GET", f"/v1/revisions/{res}/{name}/{to}")
    why = reason or f"rollback of {rev['kind']}/{name} to revision {to}"
    items = [rev["manifest"]]
    report = post_apply(api, items, why, dry_run=True)
    table_out = output in (Out.table, Out.wide)
    if table_out:
        print_preview(report)
    if dry_run:
        if not table_out:
            emit(report, output)
        return
    results = post_apply(api, items, why)["results"]
    if table_out:
        print_results(results, None, output)
    else:
        emit({"preview": report, "results": results}, output)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``history``, ``diff``, ``rollback`` (and ``onboard``) to the gpupool command."""
    app.command("history")(history)
    app.command("diff")(diff)
    app.command("rollback")(rollback)
    from gpupool.cli.incidents import alerts_app

    app.add_typer(alerts_app, name="alerts")
    try:
        from gpupool.cli.onboard import onboard
    except ModuleNotFoundError as exc:  # pragma: no cover - onboarding is optional
        if exc.name != "gpupool.cli.onboard":
            raise
    else:
        app.command("onboard")(onboard)
