"""``gpupool alerts``: the incidents of the alert conditions gpupool evaluates itself
(gpupool.service.alerts) — list them, take one (``ack``), close one with a note (``resolve``)."""

from __future__ import annotations

import sys
from typing import Any

import typer

from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import Format, Out, OutOpt, emit, show, table

alerts_app = typer.Typer(help="Incidents: alert conditions evaluated by gpupool, with owner and resolution.")


def _rows(items: list[dict[str, Any]]) -> Any:
    return table(
        ("ID", "STATE", "RULE", "SUBJECT", "FIRED (UTC)", "OWNER", "MESSAGE"),
        [
            (
                i["id"],
                i["state"],
                i["rule"],
                i["subject"],
                (i["firedAt"] or "")[:19].replace("T", " "),
                i["owner"] or "-",
                i["resolution"] or i["message"],
            )
            for i in items
        ],
    )


@alerts_app.callback(invoke_without_command=True)
def alerts(
    ctx: typer.Context,
    open_only: bool = typer.Option(False, "--open", help="open incidents only"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Evaluate the alert conditions now and list the incidents, newest first."""
    if ctx.invoked_subcommand is not None:
        return
    data = Api(server, token).call("GET", "/v1/alerts", params={"open": open_only})
    emit(data, output, _rows(data["items"]))


@alerts_app.command("ack")
def ack(
    incident: int = typer.Argument(...),
    owner: str = typer.Option("", "--owner", help="who handles it (default: you)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Acknowledge an incident: it has an owner now."""
    data = Api(server, token).call("POST", f"/v1/alerts/{incident}/ack", json={"owner": owner})
    emit(data, output, _rows([data]))


@alerts_app.command("resolve")
def resolve(
    incident: int = typer.Argument(...),
    note: str = typer.Option(..., "--note", help="what was done (kept as the resolution)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Resolve an incident with a note of what was done."""
    data = Api(server, token).call("POST", f"/v1/alerts/{incident}/resolve", json={"note": note})
    emit(data, output, _rows([data]))


def _deliveries(data: dict[str, Any]) -> Any:
    return table(
        ("SINK", "CHANGE", "OUTCOME", "ATTEMPTS", "UPDATED (UTC)", "LAST ERROR"),
        [
            (d["sink"], d["state"], d["outcome"], d["attempts"], d["updatedAt"][:19].replace("T", " "),
             d["lastError"] or "-")
            for d in data["deliveries"]
        ],
    )  # fmt: skip


@alerts_app.command("describe")
def describe(
    incident: int = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """One incident and each notification of it: sink, change, outcome, attempts, last error."""
    data = Api(server, token).call("GET", f"/v1/alerts/{incident}")
    if output not in (Out.table, Out.wide):
        emit(data, output)
        return
    sys.stdout.write(describe_text(data))
    if data["deliveries"]:
        show(_deliveries(data))


def describe_text(data: dict[str, Any]) -> str:
    """The incident's head lines: what, on what, how bad, where it stands."""
    resolved = (
        f"{data['resolvedAt']} by {data['resolvedBy']}: {data['resolution']}" if data["resolvedAt"] else "-"
    )
    return (
        f"Incident {data['id']}: {data['rule']} on {data['subject']} ({data['severity']}), {data['state']}\n"
        f"Message:   {data['message']}\n"
        f"Fired:     {data['firedAt']}\n"
        f"Owner:     {data['owner'] or '-'}\n"
        f"Resolved:  {resolved}\n"
        f"Notifications: {len(data['deliveries']) or 'none'}\n"
    )
