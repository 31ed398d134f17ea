"""How the client commands print: the consoles, the output formats, tables and the one-line failure.

Why one module: every command prints through the same two consoles and the same table style,
so ``-o table|json|yaml`` and the error line read the same whichever command printed them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


class Out(StrEnum):
    """The ``-o`` formats: a table for people, JSON or YAML for programs."""

    table = "table"
    json = "json"
    yaml = "yaml"


OutOpt = typer.Option(Out.table, "-o", "--output", help="table, json or yaml")


def fail(msg: str, code: int = 1) -> NoReturn:
    """Print ``msg`` as one error line on stderr and exit with ``code`` (never a traceback)."""
    # the message is data (names, patterns, reasons): brackets in it are not styling
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


def emit(data: Any, out: Out, table: Table | None = None) -> None:
    """``data`` as JSON or YAML, or ``table`` for ``-o table`` (YAML where a kind has no table)."""
    if out is Out.json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    elif out is Out.yaml:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    elif table is not None:
        console.print(table)
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def table(cols: Iterable[str], rows: Iterable[Iterable[Any]]) -> Table:
    """A borderless table with upper-case headers; ``None`` cells print empty."""
    t = Table(box=None, pad_edge=False, header_style="bold")
    for c in cols:
        t.add_column(c.upper(), overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    return t
