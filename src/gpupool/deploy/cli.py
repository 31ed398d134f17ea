"""``gpupool deploy``: print or write what a cluster install needs (CRDs, plain manifests).

Why a command: the committed files under ``charts/gpupool/crds`` and ``deploy/manifests`` are
this command's output; after changing the models, ``gpupool deploy crds --out charts/gpupool/crds``
refreshes them, and the tests say when someone forgot.
"""

from __future__ import annotations

from pathlib import Path

import typer

deploy_app = typer.Typer(
    help="Kubernetes install files generated from gpupool's sources.", no_args_is_help=True
)


def crd_files() -> dict[str, str]:
    """The CRD files as committed under charts/gpupool/crds: one CRD per file."""
    from gpupool.deploy.crds import all_crds, crd_file_name
    from gpupool.deploy.render import dump

    return {crd_file_name(c): dump([c], "crds") for c in all_crds()}


def _emit(files: dict[str, str], out: Path | None) -> None:
    from gpupool.deploy.render import write_files

    if out is None:
        typer.echo("".join(files.values()), nl=False)
        return
    for path in write_files(files, out):
        typer.echo(f"wrote {path}")


@deploy_app.command("crds")
def crds_command(
    out: Path | None = typer.Option(None, "--out", help="write one file per CRD into this directory"),
) -> None:
    """gpupool's CustomResourceDefinitions (ResourcePool, Queue, Workload) as YAML."""
    _emit(crd_files(), out)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``gpupool deploy`` to the gpupool command."""
    app.add_typer(deploy_app, name="deploy")
