"""``gpupool edit KIND NAME``: the object in ``$EDITOR``, then applied with the impact preview.

Why through ``get`` and ``apply``: the file the editor shows is exactly what
``gpupool get KIND NAME -o yaml`` prints, with its ``metadata.resourceVersion``, so a change made
by someone else meanwhile is a 409 rather than silently overwritten; the change is checked
locally as ``apply -f`` checks it, previewed (the preview is recorded and linked to the change in
the audit log, gpupool.service.preview), then applied. A file that fails any of this is kept and
its path printed with the located error, so no edit is lost (kubectl keeps it the same way).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import typer
import yaml

from gpupool.cli.client.apply import load_set, post_apply, print_results
from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.objects import CONFIG_RESOURCES, path, resource
from gpupool.cli.client.output import Out, console, err_console, fail
from gpupool.cli.preview_text import print_preview
from gpupool.manifests import Document, safe_yaml

HEADER = (
    "# Edit the object below and save; lines beginning with '#' are ignored. Closing the editor\n"
    "# without a change applies nothing. A change someone else made since this was read is\n"
    "# refused (metadata.resourceVersion); status and other server-set fields are ignored.\n"
)


def edit(
    kind: str = typer.Argument(..., help="pool|queue|priorityclass|cluster"),
    name: str = typer.Argument(...),
    dry_run: bool = typer.Option(False, "--dry-run", help="show the preview of the edit; apply nothing"),
    reason: str = typer.Option("", "--reason", help="why: kept with the revision and audit record"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Edit an object in $EDITOR (else vi); on save, print the preview of its effect and apply it."""
    res = resource(kind)
    if res not in CONFIG_RESOURCES:
        fail(
            f"cannot edit {kind}: one of {', '.join(CONFIG_RESOURCES)} (a workload cannot change once submitted)",
            2,
        )
    api = Api(server, token)
    current = api.call("GET", path(res, name))
    file = _write(res, name, yaml.safe_dump(current, sort_keys=False))
    _run_editor(file)
    try:
        doc = _edited(file, current, api)
        if doc is None:
            console.print("Edit cancelled, no changes made.", highlight=False, markup=False)
            file.unlink()
            return
        _preview_and_apply(api, doc, reason, dry_run)
    except typer.Exit as stop:
        if stop.exit_code:
            err_console.print(
                f"your edit is kept in {file}; fix it and run `gpupool apply -f {file}`",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        raise
    if dry_run:
        console.print(f"not applied (--dry-run); your edit is in {file}", markup=False, highlight=False)
    else:
        file.unlink()


def _write(res: str, name: str, text: str) -> Path:
    """The object in a temporary file of its own (kept when the edit fails)."""
    fd, name_ = tempfile.mkstemp(prefix=f"gpupool-edit-{res}-{name}-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(HEADER + text)
    return Path(name_)


def _run_editor(file: Path) -> None:
    """``$EDITOR FILE`` (a command line: ``code --wait`` works), else ``vi``; exit 2 when it fails."""
    command = shlex.split(os.environ.get("EDITOR") or "vi")
    try:
        done = subprocess.run([*command, str(file)], check=False)
    except OSError as exc:
        fail(f"cannot run the editor {command[0]!r} ({exc.strerror}); set EDITOR. The object is in {file}", 2)
    if done.returncode != 0:
        fail(f"the editor exited with {done.returncode}; nothing was applied. The object is in {file}")


def _edited(file: Path, current: dict[str, Any], api: Api) -> Document | None:
    """The edited object, checked as ``apply -f`` checks it; None when nothing was changed.
    It must stay the one object that was opened (kind and name)."""
    try:
        edited = safe_yaml.load(file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        edited = None  # not readable: load_set names the problem
    if edited == current:
        return None
    docs = load_set([file], api)
    want = (current.get("kind"), (current.get("metadata") or {}).get("name"))
    if len(docs) != 1 or (docs[0].kind, docs[0].name) != want:
        got = ", ".join(f"{d.kind}/{d.name}" for d in docs)
        fail(f"{file}: the edit must stay the one object {want[0]}/{want[1]}; found {got}", 2)
    return docs[0]


def _preview_and_apply(api: Api, doc: Document, reason: str, dry_run: bool) -> None:
    """The preview of the change (recorded, and named in the change's audit entry), then the apply."""
    report = post_apply(api, [doc.raw], reason, dry_run=True, sources=[doc.source])
    print_preview(report)
    if dry_run:
        return
    results = post_apply(api, [doc.raw], reason, sources=[doc.source])["results"]
    print_results(results, {"results": results}, Out.table)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``edit`` to the gpupool command."""
    app.command("edit")(edit)
