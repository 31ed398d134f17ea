"""Registers the client commands that read or change objects by name (``get``, ``describe``,
``cancel`` ... ``drain``, ``token``); ``apply``/``submit`` and ``audit`` register themselves in
their own modules, which load what reading commands do not need (gpupool.cli.main names each)."""

from __future__ import annotations

import typer

from gpupool.cli.client.nodes import cordon, drain
from gpupool.cli.client.objects import delete, describe, get
from gpupool.cli.client.tokens import token_app
from gpupool.cli.client.workloads import approve, cancel, explain, reject

#: the top-level commands this module registers (gpupool.cli.main.COMMAND_MODULES orders them)
COMMANDS = (get, describe, cancel, explain, approve, reject, delete, cordon, drain)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the client commands that read or change objects by name to the gpupool command."""
    for fn in COMMANDS:
        app.command(fn.__name__)(fn)
    app.add_typer(token_app, name="token")
