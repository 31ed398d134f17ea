"""``gpupool logs NAME [-f] [--pod N]``: a workload's output, from the server.

Why through the server and not from the files: the server decides who may read a workload (its
queue subtree), and a user need not be on the host, nor know where the state directory is.
"""

from __future__ import annotations

import sys

import httpx
import typer

from gpupool.cli.client import Api, ServerOpt, TokenOpt, fail


def logs(
    name: str = typer.Argument(..., help="workload name"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the workload stops"),
    pod: int = typer.Option(0, "--pod", min=0, help="the pod's rank (0 .. pods-1)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Print a workload's output (one pod's; the local backend keeps it)."""
    api = Api(server, token)
    path = f"/v1/workloads/{name}/logs"
    params: dict[str, str | int] = {"pod": pod, "follow": str(follow).lower()}
    if not follow:
        sys.stdout.write(str(api.call("GET", path, params=params)))
        sys.stdout.flush()
        return
    try:
        with api.http.stream("GET", path, params=params, timeout=httpx.Timeout(30.0, read=None)) as r:
            if r.status_code >= 400:
                r.read()
                fail(api._refusal(r, None))
            for chunk in r.iter_bytes():
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
    except httpx.ConnectError:
        fail(f"cannot reach the gpupool server at {api.server} (is `gpupool serve` running?)")
    except httpx.HTTPError as exc:
        fail(f"following the log of {name} failed: {type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``logs`` to the gpupool command."""
    app.command("logs")(logs)
