"""Commands on one node: ``cordon`` (and ``--undo``) and ``drain``."""

from __future__ import annotations

import typer

from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import console


def cordon(
    name: str = typer.Argument(...),
    undo: bool = typer.Option(False, "--undo", help="uncordon"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Stop (or with --undo resume) placing new work on a node."""
    r = Api(server, token).call("POST", f"/v1/nodes/{name}/{'uncordon' if undo else 'cordon'}")
    console.print(f"node/{r['name']}: schedulable={r['schedulable']}", highlight=False, markup=False)


def drain(
    name: str = typer.Argument(...),
    reason: str = typer.Option("", "--reason", help="why (recorded with every eviction)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Cordon a node, then evict every workload on it with the reason and requeue them."""
    r = Api(server, token).call("POST", f"/v1/nodes/{name}/drain", json={"reason": reason})
    evicted = ", ".join(r["evicted"]) or "nothing"
    console.print(
        f"node/{r['name']}: cordoned; evicted and requeued: {evicted}", highlight=False, markup=False
    )
