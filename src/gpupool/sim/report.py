"""The POC report: one self-contained HTML file (plotly inlined, no CDN) plus JSON and CSV.

The summary table puts policies (and what-if variants) side by side and marks the best value of
each row, so a reader can pick the better policy at a glance.
"""

from __future__ import annotations

import csv
import html
import io
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from gpupool.sim.metrics import SUMMARY_ROWS
from gpupool.sim.runner import dumps

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 10px;text-align:right}
th:first-child,td:first-child{text-align:left}thead th{background:#f3f3f3}
td.best{background:#c8f0c8;font-weight:bold}.note{color:#666;font-size:90%}
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.4g}"
    return str(v)


def summary_table(data: dict[str, Any]) -> str:
    """HTML table: a row per metric, a column per run, the best cell of each row highlighted."""
    runs = data["runs"]
    head = "".join(f"<th>{html.escape(r['label'])}</th>" for r in runs)
    rows = []
    for key, label, higher in SUMMARY_ROWS:
        vals = [r["metrics"].get(key, 0) for r in runs]
        best = (max if higher else min)(vals) if vals else None
        distinct = len(set(vals)) > 1
        cells = "".join(
            f'<td class="{"best" if distinct and v == best else ""}">{_fmt(v)}</td>' for v in vals
        )
        arrow = "higher is better" if higher else "lower is better"
        rows.append(f"<tr><td title='{arrow}'>{html.escape(label)}</td>{cells}</tr>")
    return f"<table><thead><tr><th>metric</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _queue_table(data: dict[str, Any]) -> str:
    runs = data["runs"]
    queues = sorted({q for r in runs for q in r["metrics"]["per_queue"]})
    head = "".join(f"<th>{html.escape(r['label'])}<br>wait p95 / JCT mean</th>" for r in runs)
    body = []
    for q in queues:
        cells = ""
        for r in runs:
            m = r["metrics"]["per_queue"].get(q)
            cells += f"<td>{_fmt(m['wait_p95_s'])} / {_fmt(m['jct_mean_s'])}</td>" if m else "<td>-</td>"
        body.append(f"<tr><td>{html.escape(q)}</td>{cells}</tr>")
    return f"<table><thead><tr><th>queue</th>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figures(data: dict[str, Any]) -> list[go.Figure]:
    runs = data["runs"]
    figs = []
    f = go.Figure()
    for r in runs:
        q = r.get("wait_quantiles") or []
        if q:
            f.add_trace(
                go.Scatter(
                    x=[max(x, 1.0) for x in q], y=[i / (len(q) - 1) for i in range(len(q))], name=r["label"]
                )
            )
    f.update_layout(
        title="Wait time distribution (CDF)",
        xaxis_type="log",
        xaxis_title="wait (s, log)",
        yaxis_title="fraction of jobs",
    )
    figs.append(f)
    for time_key, key, title, ytitle in (
        ("t", "allocation", "GPU allocation ratio over time", "allocated / capacity"),
        ("t", "pending", "Pending jobs over time", "jobs"),
        (
            "frag_t",
            "fragmentation",
            "Fragmentation over time (share of free GPUs on partly used nodes)",
            "fraction",
        ),
    ):
        f = go.Figure()
        for r in runs:
            s = r["series"]
            f.add_trace(
                go.Scatter(x=[t / 3600 for t in s[time_key]], y=s[key], name=r["label"], mode="lines")
            )
        f.update_layout(title=title, xaxis_title="hours", yaxis_title=ytitle)
        figs.append(f)
    f = go.Figure()
    queues = sorted({q for r in runs for q in r["metrics"]["fairness"]})
    for r in runs:
        fr = r["metrics"]["fairness"]
        f.add_trace(
            go.Bar(x=queues, y=[fr.get(q, {}).get("usage_share", 0) for q in queues], name=r["label"])
        )
    if runs:
        fr = runs[0]["metrics"]["fairness"]
        f.add_trace(
            go.Scatter(
                x=queues,
                y=[fr.get(q, {}).get("guarantee_share", 0) for q in queues],
                name="guarantee share",
                mode="markers",
                marker={"symbol": "diamond", "size": 10},
            )
        )
    f.update_layout(title="Per-queue share of GPU usage vs guarantee", barmode="group", yaxis_title="share")
    figs.append(f)
    return figs


def render_html(data: dict[str, Any]) -> str:
    """The whole report as one HTML string that opens offline."""
    parts = []
    for i, fig in enumerate(figures(data)):
        fig.update_layout(template="plotly_white", height=420)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"fig{i}"))
    rej = data["rejected"]
    rej_html = ""
    if rej["count"]:
        items = "".join(
            f"<li>{html.escape(x['job'])} ({html.escape(x['source'])}): {html.escape(x['reason'])}</li>"
            for x in rej["jobs"][:50]
        )
        rej_html = f"<h2>Rejected jobs ({rej['count']})</h2><ul>{items}</ul>"
    variants = ", ".join(f"{v['name']}: {v['nodes']} nodes, {v['gpus']} GPUs" for v in data["variants"])
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>gpupool simulation: {html.escape(data['scenario'])}</title><style>{_CSS}</style></head><body>"
        f"<h1>gpupool simulation: {html.escape(data['scenario'])}</h1>"
        f"<p class='note'>{data['jobs']} jobs, seed {data['seed']}; cluster variants: {html.escape(variants)}. "
        "Best value per row is highlighted (hover a metric for its direction).</p>"
        f"<h2>Summary</h2>{summary_table(data)}"
        f"<h2>Per queue</h2>{_queue_table(data)}{rej_html}"
        f"<h2>Charts</h2>{''.join(parts)}</body></html>\n"
    )


def csv_tables(data: dict[str, Any]) -> dict[str, str]:
    """summary.csv (every scalar metric), per_queue.csv, per_type.csv, fairness.csv, events.csv."""
    out: dict[str, str] = {}

    def table(rows: list[list[Any]], header: list[str]) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
        return buf.getvalue()

    scalar = []
    for r in data["runs"]:
        for k, v in sorted(r["metrics"].items()):
            if not isinstance(v, dict):
                scalar.append([r["label"], k, v])
    out["summary.csv"] = table(scalar, ["run", "metric", "value"])
    for name in ("per_queue", "per_type", "fairness"):
        rows = []
        cols: list[str] = []
        for r in data["runs"]:
            for g, m in sorted(r["metrics"][name].items()):
                cols = cols or sorted(m)
                rows.append([r["label"], g, *[m[c] for c in cols]])
        out[f"{name}.csv"] = table(rows, ["run", "group", *cols])
    ev = [
        [r["label"], e["time"], e["kind"], e["subject"], e["detail"]]
        for r in data["runs"]
        for e in r["events"]
    ]
    out["events.csv"] = table(ev, ["run", "time", "kind", "subject", "detail"])
    return out


def write_outputs(data: dict[str, Any], report: Path | None, out_dir: Path | None) -> list[Path]:
    """Write the HTML report and, next to it or in out_dir, metrics.json and the CSV tables."""
    written = []
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(render_html(data), encoding="utf-8")
        written.append(report)
    target = out_dir if out_dir is not None else (report.parent if report is not None else None)
    if target is not None:
        target.mkdir(parents=True, exist_ok=True)
        p = target / "metrics.json"
        p.write_text(dumps(data), encoding="utf-8")
        written.append(p)
        for name, text in csv_tables(data).items():
            q = target / name
            q.write_text(text, encoding="utf-8")
            written.append(q)
    return written
