"""``gpupool logs NAME [--attempt N | --previous] [--pod K] [-f] [--tail N]``: a workload's
output of any attempt, from the server.

Why through the server and not from the files: the server decides who may read a workload (its
queue subtree), and a user need not be on the host, nor know where the state directory is.
The flags are kubectl's (``--previous`` is the attempt before the latest, ``--tail -1`` all
lines); a refusal names the flag to change, as the server names its parameter.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx
import typer

from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import fail

#: the API's query parameters as this command's flags (the server names the former)
FLAGS = {"attempt": "--attempt", "previous": "--previous", "pod": "--pod", "tailLines": "--tail"}


def refusal(r: httpx.Response) -> str:
    """The server's refusal, led by the flag it is about and with what does exist."""
    try:
        err = r.json()["error"]
        msg, errors = str(err["message"]), list(err.get("errors") or [])
    except (ValueError, KeyError, TypeError):
        return f"{r.status_code} {r.reason_phrase}"
    flags = list(dict.fromkeys(FLAGS[e["field"]] for e in errors if e.get("field") in FLAGS))
    lines = [f"{', '.join(flags)}: {msg}" if flags else msg]
    lines += [f"  {e['problem']}" for e in errors if e.get("problem") and e["problem"] not in msg]
    return "\n".join(lines) + f" (HTTP {r.status_code})"


def params_of(attempt: int | None, previous: bool, pod: int, tail: int, follow: bool) -> dict[str, Any]:
    """The query of a read; ``--attempt`` with ``--previous`` is refused before asking."""
    if attempt is not None and previous:
        fail("--attempt, --previous: give one of them (--previous is the attempt before the latest)", 2)
    params: dict[str, Any] = {"pod": pod, "follow": str(follow).lower()}
    if attempt is not None:
        params["attempt"] = attempt
    if previous:
        params["previous"] = "true"
    if tail >= 0:
        params["tailLines"] = tail
    return params


def logs(
    name: str = typer.Argument(..., help="workload name"),
    attempt: int | None = typer.Option(None, "--attempt", min=1, help="this attempt (1 = the first run)"),
    previous: bool = typer.Option(False, "--previous", "-p", help="the attempt before the latest"),
    pod: int = typer.Option(0, "--pod", min=0, help="the pod's rank (0 .. pods-1)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the attempt ends"),
    tail: int = typer.Option(-1, "--tail", min=-1, help="only the last N lines (-1: all)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Print a workload's output: one pod's, of the latest attempt or the one asked for."""
    api = Api(server, token)
    path = f"/v1/workloads/{name}/logs"
    params = params_of(attempt, previous, pod, tail, follow)
    try:
        with api.http.stream("GET", path, params=params, timeout=httpx.Timeout(30.0, read=None)) as r:
            if r.status_code >= 400:
                r.read()
                fail(refusal(r) if r.status_code in (404, 422) else api._refusal(r, None))
            for chunk in r.iter_bytes():
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
    except httpx.ConnectError:
        fail(f"cannot reach the gpupool server at {api.server} (is `gpupool serve` running?)")
    except httpx.HTTPError as exc:
        fail(f"reading the log of {name} failed: {type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``logs`` to the gpupool command."""
    app.command("logs")(logs)
