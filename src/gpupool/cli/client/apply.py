"""``gpupool apply`` and ``gpupool submit``: send a whole set of manifests, all applied or none.

Why the set is checked here first: nothing is sent unless every document is good, so a bad
document or a duplicate name cannot leave the rest of the set applied.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import httpx
import typer

from gpupool.cli.checks import Known
from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import Format, Out, OutOpt, console, emit, fail
from gpupool.cli.files import FileProblem, load_documents
from gpupool.cli.preview_text import print_preview
from gpupool.manifests import Document, ManifestError


def server_names(api: Api) -> Known | None:
    """The queues, pools and priority classes the server has, to check a set's references
    before sending it; None when the caller may not read them (the server checks then)."""
    k = Known()
    for res, names in (("queues", k.queues), ("pools", k.pools), ("priorityclasses", k.classes)):
        try:
            r = api.http.get(f"/v1/config/{res}")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        names.update(i["metadata"]["name"] for i in r.json().get("items", []))
    return k


def load_set(files: list[Path], api: Api | None = None) -> list[Document]:
    """Every document of the files, validated locally as the server would; exit 2 on any problem.

    Why: nothing is sent unless the whole set is good, so a bad document or a duplicate name
    cannot leave the rest of the set applied; with ``api``, names the set refers to are checked
    against the server's in the same round.
    """
    try:
        return load_documents(files, server_names(api) if api is not None else None)
    except FileProblem as exc:
        fail(str(exc), 2)
    except ManifestError as exc:
        fail(
            f"{len(exc.errors)} problem(s) in the manifests; nothing was sent:\n  " + "\n  ".join(exc.errors),
            2,
        )


def json_value(v: Any) -> Any:
    """YAML loads unquoted timestamps as dates; send them as ISO 8601 text."""
    if isinstance(v, date | datetime):
        return v.isoformat()
    raise TypeError(f"cannot send {type(v).__name__} as JSON")


def post_apply(
    api: Api, items: list[Any], reason: str = "", dry_run: bool = False, sources: Sequence[str] = ()
) -> dict[str, Any]:
    """One ``POST /v1/apply`` of ``items`` (all applied or none; a preview only with ``dry_run``);
    ``sources`` name each item's document in a refusal (file, document number, kind/name)."""
    payload: dict[str, Any] = {"items": items}
    if reason:
        payload["reason"] = reason
    if dry_run:
        payload["dryRun"] = True
    data = api.call(
        "POST",
        "/v1/apply",
        content=json.dumps(payload, default=json_value),
        headers={"Content-Type": "application/json"},
        refused="nothing was applied",
        sources=sources,
    )
    return dict(data)


def apply_set(api: Api, docs: list[Document], reason: str = "") -> list[dict[str, Any]]:
    """Send the whole set in one ``POST /v1/apply`` (all applied or none); the per-object results."""
    return list(post_apply(api, [d.raw for d in docs], reason, sources=[d.source for d in docs])["results"])


def print_results(results: list[dict[str, Any]], data: Any, output: Format) -> None:
    """One ``Kind/name: result`` line per object, or ``data`` as JSON/YAML; exit 1 when an
    object failed alone (a race lost after the checks), after naming it and why."""
    if output not in (Out.table, Out.wide):
        emit(data, output)
    else:
        for r in results:
            why = f" ({r['error']})" if r.get("error") else ""
            console.print(
                f"{r['kind']}/{r['name']}: {r['result']}{why}", highlight=False, soft_wrap=True, markup=False
            )
    failed = [f"{r['kind']}/{r['name']}" for r in results if r.get("result") == "failed"]
    if failed:
        fail(f"{len(failed)} of {len(results)} object(s) failed: {', '.join(failed)}", 1)


def apply(
    files: list[Path] = typer.Option(
        ..., "-f", "--filename", help="YAML files or directories ('-' for stdin)"
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print what the change would do to running and pending work; change nothing"
    ),
    reason: str = typer.Option("", "--reason", help="why: kept with each revision and audit record"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Create or update pools, queues, priority classes and clusters (and submit workloads)."""
    api = Api(server, token)
    docs = load_set(files, api)
    if dry_run:
        report = post_apply(
            api, [d.raw for d in docs], reason, dry_run=True, sources=[d.source for d in docs]
        )
        if output in (Out.table, Out.wide):
            print_preview(report)
        else:
            emit(report, output)
        return
    results = apply_set(api, docs, reason)
    print_results(results, {"results": results}, output)


def submit(
    files: list[Path] = typer.Option(
        ...,
        "-f",
        "--filename",
        help="Workload manifests or Kubernetes Jobs with a Kueue queue ('-' for stdin)",
    ),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Submit workloads, all or none (idempotent by name: the same manifest again changes nothing)."""
    api = Api(server, token)
    docs = load_set(files, api)
    bad = [d for d in docs if d.kind != "Workload"]
    if bad:
        fail(
            f"{bad[0].source}: submit takes Workload manifests only; use `gpupool apply -f` for configuration",
            2,
        )
    results = apply_set(api, docs)
    print_results(results, results, output)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``apply`` and ``submit`` to the gpupool command (gpupool.cli.main loads this module
    only for them: the manifest models it checks a set with cost most of a client's start)."""
    app.command("apply")(apply)
    app.command("submit")(submit)
