"""What the offline commands and the benchmarks share: the consoles, ``-o table|json`` and
``fail`` (one actionable line and exit 2, never a traceback).

Why a module of its own: it imports only rich and typer, so the command modules that use it
can be loaded one at a time (gpupool.cli.main) without loading each other.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

# Wide tables when piped (CI logs, `make run | less`); the terminal's width otherwise.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@dataclass
class Invocation:
    """What the options before the command (``gpupool --state-dir DIR get ...``) set for this
    run; set again by every run (so one test's value never reaches the next)."""

    state_dir: str | None = None
    ca_file: str | None = None


invocation = Invocation()


class Output(StrEnum):
    table = "table"
    json = "json"


def fail(msg: str, code: int = 2) -> None:
    """Print an actionable error and exit without a traceback."""
    # the message is data (names, patterns, reasons): brackets in it are not styling
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
