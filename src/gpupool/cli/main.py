"""Entry point: ``gpupool demo | schedule | validate | serve | get | sim | bench ...``.

Errors a user can act on are printed as one clear message and exit 2; never a traceback.

Why the commands are loaded lazily: ``gpupool --version`` and the client commands must answer
at once (kubectl answers in ~50 ms), but the command modules between them import the engine
(numpy), the store (SQLAlchemy, alembic), the service (FastAPI) and the manifest models. So this
module imports only typer and rich, and ``COMMAND_MODULES`` names which module registers which
command: a command's module is imported when that command runs (``gpupool get`` loads
gpupool.cli.client.commands alone, not the manifest models ``apply`` checks a set with), and all
of them only to list them (``--help``, completion).
tests/cli/test_cli_startup.py checks what ``import gpupool.cli.main`` and the client commands leave
out of ``sys.modules``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import typer
import typer.main
from typer.core import TyperGroup

from gpupool.cli.common import err_console, invocation

if TYPE_CHECKING:  # the click TyperGroup is built on (typer vendors its own as typer._click)
    from typer._click import Command, Context


@dataclass(frozen=True)
class CommandModule:
    """A module whose ``register(app, bench_app)`` adds these commands to ``gpupool`` and these
    to ``gpupool bench``. Loading it checks that it registers no command not named here (one
    would be unreachable)."""

    module: str
    commands: tuple[str, ...] = ()
    bench: tuple[str, ...] = ()


# In the order ``gpupool --help`` lists them. A module that is not present is skipped; an error
# inside one that is present is not hidden.
COMMAND_MODULES = (
    CommandModule("gpupool.cli.offline", ("validate", "schedule", "demo")),
    CommandModule("gpupool.cli.sim", ("sim",)),
    CommandModule("gpupool.cli.server", ("serve",), bench=("submit", "burst")),
    # the client: reading commands load neither the manifest models (pydantic) nor the audit
    # log's cryptography; a module may be named more than once to keep kubectl's order
    CommandModule("gpupool.cli.client.apply", ("apply",)),
    CommandModule("gpupool.cli.client.commands", ("get", "describe")),
    CommandModule("gpupool.cli.client.apply", ("submit",)),
    CommandModule(
        "gpupool.cli.client.commands", ("cancel", "explain", "approve", "reject", "delete", "cordon", "drain")
    ),
    CommandModule("gpupool.cli.client.audit", ("audit",)),
    CommandModule("gpupool.cli.client.commands", ("token",)),
    CommandModule("gpupool.cli.edit", ("edit",)),
    CommandModule("gpupool.cli.logs", ("logs",)),
    CommandModule("gpupool.cli.ready", ("wait-ready",)),
    CommandModule("gpupool.cli.report", ("evidence", "profile", "plan", "report")),
    CommandModule("gpupool.cli.governance", ("history", "diff", "rollback", "onboard", "alerts")),
    CommandModule("gpupool.cli.kube", ("kube",)),
    CommandModule("gpupool.deploy.cli", ("deploy",)),
    CommandModule("gpupool.cli.bench", bench=("engine", "fragmentation", "kube")),
)


@cache
def _loaded(module: str) -> tuple[Mapping[str, Command], Mapping[str, Command]]:
    """The commands ``module`` registers: (gpupool's, gpupool bench's); empty if it is absent."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return {}, {}
        raise
    top, bench = typer.Typer(), typer.Typer()
    mod.register(top, bench)
    found = typer.main.get_group(top).commands, typer.main.get_group(bench).commands
    specs = [m for m in COMMAND_MODULES if m.module == module]
    declared_top = {n for m in specs for n in m.commands}
    declared_bench = {n for m in specs for n in m.bench}
    for where, declared, got in (("", declared_top, found[0]), ("bench ", declared_bench, found[1])):
        extra = sorted(set(got) - set(declared))
        if extra:
            raise RuntimeError(
                f"{module} registers `gpupool {where}{', '.join(extra)}`, which COMMAND_MODULES "
                "in gpupool.cli.main does not name: add it there"
            )
    return found


class _LazyGroup(TyperGroup):
    """A command group whose commands named in COMMAND_MODULES are loaded on first use."""

    bench = False  # gpupool's own commands, or gpupool bench's

    def _owner(self, name: str) -> str | None:
        return next(
            (m.module for m in COMMAND_MODULES if name in (m.bench if self.bench else m.commands)), None
        )

    def _lazy(self, name: str) -> Command | None:
        owner = self._owner(name)
        return _loaded(owner)[self.bench].get(name) if owner else None

    def list_commands(self, ctx: Context) -> list[str]:
        names = [n for m in COMMAND_MODULES for n in (m.bench if self.bench else m.commands)]
        names = [n for n in names if self._lazy(n) is not None]
        return names + [n for n in super().list_commands(ctx) if n not in names]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        return super().get_command(ctx, cmd_name) or self._lazy(cmd_name)


class _LazyBenchGroup(_LazyGroup):
    bench = True


app = typer.Typer(
    cls=_LazyGroup,
    help="gpupool: a governed GPU compute scheduling platform.",
    no_args_is_help=True,
    add_completion=True,
)
bench_app = typer.Typer(
    cls=_LazyBenchGroup,
    help="Benchmarks that print figures (ratios against a baseline run in the same process).",
)
app.add_typer(bench_app, name="bench")


def _version(value: bool) -> None:
    """``gpupool --version``: the installed package's version (what a bug report needs first)."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            sys.stdout.write(f"gpupool {version('gpupool')}\n")
        except PackageNotFoundError:
            sys.stdout.write("gpupool (not installed as a package)\n")
        raise typer.Exit()


@app.callback()
def _top(
    _: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print the version"),
    state_dir: str | None = typer.Option(
        None,
        "--state-dir",
        envvar="GPUPOOL_STATE_DIR",
        help="client commands: the `gpupool serve --state-dir` whose admin-token to use",
    ),
    ca_file: str | None = typer.Option(
        None,
        "--ca-file",
        envvar="GPUPOOL_CA",
        help="client commands: the PEM CA certificate(s) that signed an https server's certificate",
    ),
) -> None:
    """gpupool: a governed GPU compute scheduling platform."""
    invocation.state_dir = state_dir
    invocation.ca_file = ca_file


def main() -> None:
    """Console-script entry point; turns unexpected errors into one line, not a traceback."""
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
