"""``gpupool onboard TEMPLATE --team NAME``: a team's queues and tokens from a TeamTemplate, in
one atomic step, after printing what they would change (``POST /v1/onboard``, the use-case
gpupool.service.usecases.onboard).

Why the template is read here and sent whole: it is validated locally first (a bad template
never reaches the server), and the server renders it again, so what is created is exactly what
was previewed and the audit entry names the template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from gpupool.cli.client.apply import json_value, load_set
from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import Format, Out, OutOpt, console, emit, fail
from gpupool.cli.preview_text import print_preview


def parse_sets(sets: list[str]) -> dict[str, str]:
    """``key=value`` pairs; exit 2 naming the one without ``=``."""
    out: dict[str, str] = {}
    for s in sets:
        key, eq, value = s.partition("=")
        if not eq or not key.strip():
            fail(f"--set {s!r}: expected key=value", 2)
        out[key.strip()] = value.strip()
    return out


def _post(api: Api, template: dict[str, Any], team: str, sets: dict[str, str], dry: bool, reason: str) -> Any:
    body = {"template": template, "team": team, "set": sets, "dryRun": dry, "reason": reason}
    return api.call(
        "POST",
        "/v1/onboard",
        content=json.dumps(body, default=json_value),
        headers={"Content-Type": "application/json"},
        refused="nothing was created",
    )


def onboard(
    template: Path = typer.Argument(..., help="a TeamTemplate file (examples/templates/*.yaml)"),
    team: str = typer.Option(..., "--team", help="the team's name ({team} in the template)"),
    sets: list[str] = typer.Option([], "--set", help="a template parameter, key=value (repeatable)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the preview only; create nothing"),
    reason: str = typer.Option("", "--reason", help="why: kept with the audit entry and revisions"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Onboard a team from a template: its queues and tokens, all or nothing, previewed first."""
    values = parse_sets(sets)
    docs = [d for d in load_set([template]) if d.kind == "TeamTemplate"]
    if len(docs) != 1:
        fail(f"{template}: expected exactly one TeamTemplate document, found {len(docs)}", 2)
    api = Api(server, token)
    preview = _post(api, docs[0].raw, team, values, True, reason)
    table_out = output in (Out.table, Out.wide)
    if table_out:
        names = ", ".join(q["metadata"]["name"] for q in preview["objects"])
        console.print(f"Team {team}: queues {names}", highlight=False, markup=False)
        print_preview(preview)
    if dry_run:
        if not table_out:
            emit(preview, output)
        return
    done = _post(api, docs[0].raw, team, values, False, reason)
    if not table_out:
        emit(done, output)
        return
    for c in done["created"]:
        console.print(f"{c['kind']}/{c['name']}: created", highlight=False, markup=False)
    for t in done["tokens"]:
        console.print(
            f"Token {t['name']} ({t['role']} of {t['scope']}): {t['token']}  (shown once)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    for g in done.get("oidcGroups", []):
        console.print(f"OIDC group {g['group']}: {g['role']} of {g['scope']}", highlight=False, markup=False)
    if done.get("note"):
        console.print(done["note"], highlight=False, markup=False)
