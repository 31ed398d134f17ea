"""Reports (``{"kind", "from", "to", "summary", "tables"}``) as text, CSV, JSON or HTML.

Why generic: every report is titled tables, so a new table shows up in every format at once,
and the CLI renders what the API returned without knowing which report it is.
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Mapping
from typing import Any

from gpupool.cost.tables import cell, html_table, page, text_table

FORMATS = ("table", "csv", "json", "html")


def render_text(rep: Mapping[str, Any]) -> str:
    head = f"{rep['kind']} report, {rep['from']} to {rep['to']} ({rep.get('currency', '')}, {rep.get('scope', '')})"
    parts = [head, "  ".join(f"{k}={cell(v)}" for k, v in rep.get("summary", {}).items())]
    for t in rep.get("tables", ()):
        body = text_table(t["columns"], t["rows"]) if t["rows"] else "(none)"
        parts.append(f"\n{t['title']}\n{body}")
    return "\n".join(parts) + "\n"


def render_csv(rep: Mapping[str, Any]) -> str:
    """One block per table: a ``# name`` line, the header, the rows; blocks apart by a blank line."""
    buf = io.StringIO()
    for i, t in enumerate(rep.get("tables", ())):
        if i:
            buf.write("\n")
        buf.write(f"# {t['name']}\n")
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(t["columns"])
        w.writerows(["" if v is None else v for v in r] for r in t["rows"])
    return buf.getvalue()


def render_html(rep: Mapping[str, Any]) -> str:
    title = f"gpupool {rep['kind']} report"
    summary = ", ".join(
        f"{html.escape(k)}: {html.escape(cell(v))}" for k, v in rep.get("summary", {}).items()
    )
    body = f"<h1>{html.escape(title)}</h1><p>{html.escape(rep['from'])} to {html.escape(rep['to'])}</p>"
    body += f'<p class="summary">{summary}</p>' + _team_chart(rep)
    body += "".join(html_table(t) for t in rep.get("tables", ()))
    return page(title, body)


def _team_chart(rep: Mapping[str, Any]) -> str:
    """A chargeback's cost per team as the weekly page draws it (each queue's own cost stacked
    under its top team, plotly inline so the page stays offline); nothing for other reports."""
    if rep.get("kind") != "chargeback" or not any(t["name"] == "teams" for t in rep.get("tables", ())):
        return ""
    from gpupool.cost.weekly import team_figure

    fig = team_figure(rep)
    fig.update_layout(template="plotly_white", height=380, title="Cost per team (own cost, stacked)")
    return str(fig.to_html(full_html=False, include_plotlyjs=True, div_id="teams-chart"))


def render(rep: Mapping[str, Any], fmt: str) -> str:
    """The report in ``fmt``; a weekly report's HTML is its own page (gpupool.cost.weekly)."""
    if fmt == "json":
        return json.dumps(rep, indent=2, sort_keys=False) + "\n"
    if fmt == "csv":
        return render_csv(rep)
    if fmt == "html":
        if rep.get("kind") == "weekly":
            from gpupool.cost.weekly import render_weekly_html

            return render_weekly_html(rep)
        return render_html(rep)
    if fmt == "table":
        return render_text(rep)
    raise ValueError(f"output: unknown format {fmt!r}; one of {', '.join(FORMATS)}")
