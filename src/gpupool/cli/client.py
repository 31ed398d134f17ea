"""kubectl-like commands that talk to a gpupool server over HTTP, and where each one lives.

Why a thin client: all rules live in the server (one place to audit); the client only reads
files, picks the server and token (flag > environment > config file > ./.gpupool/admin-token)
and prints results as a table, JSON or YAML. Every failure is one clear line and a non-zero
exit, never a traceback.

The client's modules, by command area:

- ``client_http``: which server and token, and the HTTP call that reports a refusal as one line;
- ``client_output``: the consoles, ``-o table|json|yaml``, tables and ``fail``;
- ``client_apply``: ``apply`` and ``submit`` (a whole set of manifests, all or none), registered
  by that module itself: it loads the manifest models, which ``get`` does not need;
- ``client_objects`` and ``client_rows``: ``get``, ``describe``, ``delete`` and each kind's table;
- ``client_workloads``: ``cancel``, ``explain``, ``approve``, ``reject``;
- ``client_nodes``: ``cordon``, ``drain``;
- ``client_audit`` and ``client_tokens``: the ``audit`` and ``token`` command groups (``audit``
  registered by its own module: it loads the audit log's cryptography).
"""

from __future__ import annotations

import typer

from gpupool.cli.client_http import (
    CONFIG_FILE,
    DEFAULT_SERVER,
    DEFAULT_TOKEN_FILE,
    Api,
    CliError,
    ServerOpt,
    TokenOpt,
    resolve,
)
from gpupool.cli.client_nodes import cordon, drain
from gpupool.cli.client_objects import RESOURCES, delete, describe, get
from gpupool.cli.client_output import Out, OutOpt, console, err_console, fail
from gpupool.cli.client_tokens import token_app
from gpupool.cli.client_workloads import approve, cancel, explain, reject

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_SERVER",
    "DEFAULT_TOKEN_FILE",
    "RESOURCES",
    "Api",
    "CliError",
    "Out",
    "OutOpt",
    "ServerOpt",
    "TokenOpt",
    "console",
    "err_console",
    "fail",
    "register",
    "resolve",
]

#: the top-level commands this module registers (gpupool.cli.main.COMMAND_MODULES orders them)
COMMANDS = (get, describe, cancel, explain, approve, reject, delete, cordon, drain)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the client commands that read or change objects by name to the gpupool command."""
    for fn in COMMANDS:
        app.command(fn.__name__)(fn)
    app.add_typer(token_app, name="token")
