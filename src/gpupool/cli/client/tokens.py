"""``gpupool token create | revoke``: API tokens (platform-admin)."""

from __future__ import annotations

import typer

from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import Format, OutOpt, console, emit, table

token_app = typer.Typer(help="Manage API tokens (platform-admin).", no_args_is_help=True)


@token_app.command("create")
def token_create(
    name: str = typer.Argument(..., help="who the token is for"),
    role: str = typer.Option(..., "--role", help="platform-admin, queue-admin, member or viewer"),
    scope: str | None = typer.Option(None, "--scope", help="root queue of the subtree"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Issue a token; it is printed once."""
    r = Api(server, token).call("POST", "/v1/tokens", json={"name": name, "role": role, "scope": scope})
    emit(
        r,
        output,
        table(
            ["id", "name", "role", "scope", "token"],
            [(r["id"], r["name"], r["role"], r["scope"], r["token"])],
        ),
    )


@token_app.command("revoke")
def token_revoke(
    token_id: int = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Revoke a token by id."""
    r = Api(server, token).call("DELETE", f"/v1/tokens/{token_id}")
    console.print(f"token {r['id']} ({r['name']}) revoked", markup=False, highlight=False)
