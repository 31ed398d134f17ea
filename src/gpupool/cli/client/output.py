"""How the client commands print: the consoles, the output formats, tables and the one-line failure.

Why one module: every command prints through the same two consoles and the same table style,
so ``-o table|wide|name|json|yaml|jsonpath=...`` and the error line read the same whichever
command printed them.

Why two table renderings: a pipe (``grep``, ``less``, a CI log) gets one row per line, never
wrapped or cut, so a name found by ``grep`` is the whole name; a terminal gets a table that
fits its width, where only the free-text columns (reason, message) are cut, with an ellipsis.
Every cell is plain text, never rich markup: ``[h100-training]`` in a reason is data.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from gpupool.cli.client.jsonpath import JsonPathError, render_template

console = Console()
err_console = Console(stderr=True)

#: the columns a terminal table may cut (with an ellipsis); every other column is kept whole
FREE_TEXT = frozenset({"reason", "message", "description", "why", "scope"})
#: the space between columns, and the narrowest a cut free-text column becomes
GAP = "   "
MIN_FREE = 12


@dataclass(frozen=True, slots=True)
class Format:
    """One ``-o`` format; ``template`` is the jsonpath template of ``-o jsonpath=...``."""

    kind: str
    template: str = ""

    def __str__(self) -> str:
        return f"{self.kind}={self.template}" if self.template else self.kind


class Out:
    """The ``-o`` formats: tables for people (``wide`` adds columns), names, JSON, YAML, jsonpath."""

    table = Format("table")
    wide = Format("wide")
    name = Format("name")
    json = Format("json")
    yaml = Format("yaml")


SIMPLE = {f.kind: f for f in (Out.table, Out.wide, Out.name, Out.json, Out.yaml)}


def parse_output(value: str | Format) -> Format:
    """The format named by ``-o``; a clear error naming the choices for anything else."""
    if isinstance(value, Format):
        return value
    if value in SIMPLE:
        return SIMPLE[value]
    if value.startswith("jsonpath="):
        template = value.removeprefix("jsonpath=")
        if not template:
            raise typer.BadParameter("jsonpath= needs a template, e.g. jsonpath='{.items[*].name}'")
        return Format("jsonpath", template)
    raise typer.BadParameter(f"{value!r}: one of table, wide, name, json, yaml, jsonpath=TEMPLATE")


OutOpt = typer.Option(
    "table",
    "-o",
    "--output",
    parser=parse_output,
    metavar="FORMAT",
    help="table, wide, name, json, yaml or jsonpath=TEMPLATE",
)


def fail(msg: str, code: int = 1) -> NoReturn:
    """Print ``msg`` as one error line on stderr and exit with ``code`` (never a traceback)."""
    # the message is data (names, patterns, reasons): brackets in it are not styling
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


@dataclass(slots=True)
class Rows:
    """A table as plain cells; rendered by :func:`show` for a pipe or a terminal."""

    cols: list[str]
    rows: list[list[str]]


def cell(v: Any) -> str:
    """A cell's text: ``None`` is empty, and a newline would break the one-row-per-line rule."""
    return "" if v is None else str(v).replace("\r", " ").replace("\n", " ")


def table(cols: Iterable[str], rows: Iterable[Iterable[Any]]) -> Rows:
    """A table with upper-case headers; ``None`` cells print empty."""
    return Rows([c.upper() for c in cols], [[cell(v) for v in r] for r in rows])


def _widths(t: Rows) -> list[int]:
    return [max([len(c), *(len(r[i]) for r in t.rows)]) for i, c in enumerate(t.cols)]


def _join(cells: Sequence[str], widths: Sequence[int]) -> str:
    return GAP.join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _cut(text: str, width: int) -> str:
    """``text`` in ``width`` characters, ending with an ellipsis when it had to be cut."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def plain_lines(t: Rows) -> list[str]:
    """One line per row, columns padded to their widest cell; nothing wrapped or cut."""
    widths = _widths(t)
    return [_join(t.cols, widths), *(_join(r, widths) for r in t.rows)]


def fitted_lines(t: Rows, width: int) -> list[str]:
    """One line per row in ``width`` columns: names stay whole; free text is cut, with an ellipsis.

    Why not the table library's fitting: it shrinks every column, breaking names mid-word,
    and may drop columns altogether; a name is what people copy into the next command.
    """
    widths = _widths(t)
    free = [i for i, c in enumerate(t.cols) if c.lower() in FREE_TEXT]
    spare = width - (sum(widths) + len(GAP) * (len(widths) - 1))
    for i in reversed(free):  # the last free column gives way first
        if spare >= 0:
            break
        give = min(widths[i] - min(widths[i], MIN_FREE), -spare)
        widths[i] -= give
        spare += give
    lines = [_join([_cut(c, w) for c, w in zip(t.cols, widths, strict=True)], widths)]
    for r in t.rows:
        lines.append(
            _join(
                [_cut(c, w) if i in free else c for i, (c, w) in enumerate(zip(r, widths, strict=True))],
                widths,
            )
        )
    # a terminal too narrow even for the names: the line ends where it would wrap, marked as cut
    return [_cut(line, width) for line in lines]


def show(t: Rows, to: Console | None = None) -> None:
    """Print a table: fitted to a terminal, one untruncated line per row anywhere else."""
    c = to or console
    if c.is_terminal:
        lines = fitted_lines(t, c.width)
        c.print(Text(lines[0], style="bold"), no_wrap=True, crop=True)
        for line in lines[1:]:
            c.print(Text(line), no_wrap=True, crop=True, highlight=False)
    else:
        c.file.write("".join(line + "\n" for line in plain_lines(t)))


def names(data: Any, kind: str = "") -> list[str]:
    """``kind/name`` per object, as ``kubectl get -o name`` prints them."""
    items = data.get("items", [data]) if isinstance(data, dict) else list(data)
    out = []
    for i in items:
        meta = i.get("metadata") or {}
        k = str(kind or i.get("kind") or "object").lower()
        out.append(f"{k}/{meta.get('name') or i.get('name') or i.get('id')}")
    return out


def emit(data: Any, out: Format, table: Rows | None = None, kind: str = "") -> None:
    """``data`` in format ``out``: a table for table/wide (YAML where a kind has no table)."""
    if out is Out.json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    elif out is Out.name:
        sys.stdout.write("".join(n + "\n" for n in names(data, kind)))
    elif out.kind == "jsonpath":
        try:
            sys.stdout.write(render_template(out.template, data) + "\n")
        except JsonPathError as exc:
            fail(f"-o jsonpath: {exc}", 2)
    elif table is not None and out in (Out.table, Out.wide):
        show(table)
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
