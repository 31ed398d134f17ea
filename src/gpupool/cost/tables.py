"""The pieces every report format is made of: a cell's text, a text table, an HTML table, a page.

Why a module of its own: the generic renderer (``render``) and the weekly report's own page
(``weekly``) both build on them, and ``render`` hands a weekly report to ``weekly``; with the
pieces here neither imports the other back.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any


def cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.4f}".rstrip("0").rstrip(".") if v else "0"
    return str(v)


def text_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(columns)] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def html_table(t: Mapping[str, Any]) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in t["columns"])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(v))}</td>" for v in r) + "</tr>" for r in t["rows"]
    )
    return f"<h2>{html.escape(t['title'])}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
    "th{background:#f3f3f3}h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}.summary{color:#444}"
)


def page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{body}</body></html>\n"
    )
