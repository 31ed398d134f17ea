"""The weekly report (周报): headline figures, week-over-week change, the operations review
(运营复盘), and one offline HTML page with its charts inlined (plotly, as the simulator's report).

Why one file: a cost review is read by finance and management away from the cluster; a page
that needs no server and no network can be mailed and archived as the evidence it is.
"""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from statistics import mean, median
from typing import Any

import plotly.graph_objects as go

from gpupool.cost.metering import US_PER_S, Window, us_between
from gpupool.cost.reports import CostData, chargeback_report, hours, load, report, table, usage_report
from gpupool.cost.tables import cell, html_table, page
from gpupool.cost.utilisation import utilisation_tables

SYSTEM_ACTORS = frozenset({"scheduler", "system", "system:kubernetes"})
CONFIG_SUFFIXES = (".apply", ".delete")
NODE_ACTIONS = frozenset({"node.drain", "node.cordon", "node.uncordon", "device.health"})


def previous(window: Window) -> Window:
    return Window(window.start - (window.end - window.start), window.start)


MAX_POINTS = 2000


def series(data: CostData, bucket_s: int | None = None) -> dict[str, dict[str, Any]]:
    """Per pool, mean GPUs allocated in each bucket of the window, and the pool's capacity.
    Buckets are hours, or whole multiples of an hour so a long window stays under MAX_POINTS."""
    if bucket_s is None:
        hours = -(-data.window.us // (3600 * US_PER_S))
        bucket_s = 3600 * max(1, -(-hours // MAX_POINTS))
    n = -(-data.window.us // (bucket_s * US_PER_S))
    acc: dict[str, list[int]] = defaultdict(lambda: [0] * n)
    step = bucket_s * US_PER_S
    for m in data.mine():
        a = us_between(data.window.start, m.start)
        b = us_between(data.window.start, m.end)
        per_us = m.gpu // us_between(m.start, m.end)
        while a < b:
            i = a // step
            end = min(b, (i + 1) * step)
            acc[m.pool][i] += per_us * (end - a)
            a = end
    times = [(data.window.start + timedelta(seconds=i * bucket_s)).isoformat() for i in range(n)]
    out = {}
    for name in sorted(set(acc) | set(data.pools)):
        vals = acc.get(name, [0] * n)
        gpus = data.pools[name].gpus if name in data.pools else 0
        out[name] = {"t": times, "allocated": [round(v / (1000 * step), 3) for v in vals], "capacity": gpus}
    return out


def _wait_minutes(data: CostData) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Minutes waited by the waits that ended in an admission inside the window, by type and queue."""
    by_type: dict[str, list[float]] = defaultdict(list)
    by_queue: dict[str, list[float]] = defaultdict(list)
    for w in data.history.waits:
        info = data.history.workloads[w.workload]
        if not w.admitted or w.end is None or not data.sees(info.queue):
            continue
        if data.window.start <= w.end < data.window.end:
            minutes = us_between(w.start, w.end) / (60 * US_PER_S)
            by_type[info.task_type].append(minutes)
            by_queue[info.queue].append(minutes)
    return by_type, by_queue


def _p90(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.9 * len(s)))] if s else 0.0


def _reason_key(text: str) -> str:
    """A waiting reason without its numbers and names, so like reasons count together."""
    head = text.split(";")[0].split(" at ")[0].strip()
    return (head.split(":")[0] if ":" in head[:40] else head)[:80] or "(none given)"


def wait_tables(data: CostData) -> list[dict[str, Any]]:
    by_type, by_queue = _wait_minutes(data)
    cols = ["key", "admitted", "meanMinutes", "p90Minutes"]
    rows_t = [[k, len(v), round(mean(v), 2), round(_p90(v), 2)] for k, v in sorted(by_type.items())]
    rows_q = [[k, len(v), round(mean(v), 2), round(_p90(v), 2)] for k, v in sorted(by_queue.items())]
    reasons: Counter[str] = Counter()
    for w in data.history.waits:
        info = data.history.workloads[w.workload]
        if (
            data.sees(info.queue)
            and w.start < data.window.end
            and (w.end is None or w.end > data.window.start)
        ):
            reasons[_reason_key(w.reason)] += 1
    fails: Counter[str] = Counter(
        code
        for name, at, code in data.history.failures
        if data.window.start <= at < data.window.end and data.sees(data.history.workloads[name].queue)
    )
    return [
        table("waitsByType", "Waits per task type (admitted this period)", cols, rows_t),
        table("waitsByQueue", "Waits per queue (admitted this period)", cols, rows_q),
        table(
            "waitReasons",
            "Top reasons for waiting",
            ["reason", "waits"],
            [list(x) for x in reasons.most_common(10)],
        ),
        table(
            "failures", "Failures by reason", ["reason", "failures"], [list(x) for x in fails.most_common()]
        ),
    ]


def _change(now: float, before: float) -> float | None:
    return None if before == 0 else round((now - before) / before, 4)


def wow_table(
    this: Mapping[str, Any], prev: Mapping[str, Any], name: str, key_col: int, val_col: int, title: str
) -> dict[str, Any]:
    """Week over week for one table of two reports: this, before, relative change."""

    def values(rep: Mapping[str, Any]) -> dict[str, float]:
        rows = _rows(rep, name)
        return {str(r[key_col]): float(r[val_col]) for r in rows}

    a, b = values(this), values(prev)
    rows = [
        [k, a.get(k, 0.0), b.get(k, 0.0), _change(a.get(k, 0.0), b.get(k, 0.0))]
        for k in sorted(set(a) | set(b))
    ]
    return table(f"wow_{name}", title, ["key", "thisPeriod", "previousPeriod", "change"], rows)


def weekly_report(data: CostData, store: Any | None = None) -> dict[str, Any]:
    """This period and the one before it, with the operations review when a store is given and
    the caller sees every queue."""
    prev = load(data.history, data.bundle, previous(data.window), data.policy, None, data.visible)
    usage, cb = usage_report(data), chargeback_report(data)
    usage_prev, cb_prev = usage_report(prev), chargeback_report(prev)
    tables = [t for t in cb["tables"] if t["name"] in ("pools", "teams", "waiting", "losses")]
    tables += wait_tables(data)
    tables.append(wow_table(usage, usage_prev, "pool", 0, 1, "GPU-hours per pool, week over week"))
    tables.append(wow_table(cb, cb_prev, "teams", 0, 5, "Cost per team, week over week"))
    if store is not None and data.visible is None:
        tables += operations_review(store, data)
        tables.append(incident_review(store, data.window))
    # -- measured utilisation (gpupool.cost.utilisation): allocated vs used, idle allocations
    if store is not None:
        tables += utilisation_tables(store, data)
    summary = {**usage["summary"], **cb["summary"]}
    rep = report("weekly", data, tables, summary)
    rep["series"] = series(data)
    return rep


def operations_review(store: Any, data: CostData) -> list[dict[str, Any]]:
    """How the platform ran as an organisation: approvals, manual interventions, failures closed
    inside the platform against those left to a person, and queues onboarded."""
    win = data.window

    def inside(t: Any) -> bool:
        return t is not None and win.start <= t < win.end

    appr = [a for a in store.list_approvals() if inside(a.requested_at)]
    decided = [
        us_between(a.requested_at, a.decided_at) / (60 * US_PER_S)
        for a in appr
        if a.decided_at and a.state in ("Approved", "Rejected")
    ]
    audit = [r for r in store.audit_records() if inside(r.at)]
    people = [r for r in audit if r.actor not in SYSTEM_ACTORS]
    rows = [
        ["approval requests", len(appr)],
        ["approved", sum(a.state == "Approved" for a in appr)],
        ["rejected", sum(a.state == "Rejected" for a in appr)],
        ["expired unused", sum(a.state == "Expired" for a in appr)],
        ["mean minutes to decide", round(mean(decided), 2) if decided else None],
        ["cancels by people", sum(r.action == "workload.cancel" for r in people)],
        ["node drains, cordons and device changes", sum(r.action in NODE_ACTIONS for r in people)],
        ["configuration changes", sum(r.action.endswith(CONFIG_SUFFIXES) for r in people)],
        [
            "failures closed by the platform (retried or requeued)",
            sum(r.action == "workload.failure" for r in audit),
        ],
        ["failures left to a person (retries exhausted)", sum(r.action == "workload.fail" for r in audit)],
        ["preemptions", sum(r.action == "workload.preempt" for r in audit)],
        ["queues onboarded", sum(inside(o.created_at) for o in store.list_objects("Queue"))],
    ]
    return [table("operations", "Operations review (运营复盘)", ["item", "count"], rows)]


def _minutes(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds() / 60


def _median(xs: Sequence[float]) -> float | None:
    return round(median(xs), 2) if xs else None


def incident_review(store: Any, win: Window) -> dict[str, Any]:
    """Incidents (告警处置) per rule in the period: opened, resolved, still open at its end, how
    long those resolved took (median and p90, minutes), and how many the platform resolved itself
    (its condition cleared) against those a person closed with a note."""
    rows: dict[str, dict[str, Any]] = {}
    for i in store.incidents_between(win.start, win.end):
        r = rows.setdefault(i["rule"], {"opened": 0, "resolved": 0, "open": 0, "took": [], "byPlatform": 0})
        fired = datetime.fromisoformat(i["firedAt"])
        done = datetime.fromisoformat(i["resolvedAt"]) if i["resolvedAt"] else None
        r["opened"] += win.start <= fired
        if done is not None and done < win.end:
            r["resolved"] += 1
            r["took"].append(_minutes(i["firedAt"], i["resolvedAt"]))
            r["byPlatform"] += i["resolvedBy"] == "gpupool"
        else:
            r["open"] += 1
    cols = ["rule", "opened", "resolved", "stillOpen", "medianMinutesToResolve", "p90MinutesToResolve"]
    out = []
    for k, r in sorted(rows.items()):
        p90 = round(_p90(r["took"]), 2) if r["took"] else None
        out.append([k, r["opened"], r["resolved"], r["open"], _median(r["took"]), p90, r["byPlatform"]])
    return table("incidents", "Incidents per rule (告警处置)", [*cols, "resolvedByPlatform"], out)


# ---------------------------------------------------------------------- the HTML page
def _rows(rep: Mapping[str, Any], name: str) -> list[list[Any]]:
    return next((list(t["rows"]) for t in rep["tables"] if t["name"] == name), [])


def figures(rep: Mapping[str, Any]) -> list[tuple[str, go.Figure]]:
    """The charts the issue asks for, each from the report's own tables and series."""
    figs: list[tuple[str, go.Figure]] = []
    util = go.Figure()
    for pool, s in rep.get("series", {}).items():
        cap = s["capacity"] or 1
        util.add_trace(go.Scatter(x=s["t"], y=[v / cap for v in s["allocated"]], name=pool, mode="lines"))
    util.update_layout(yaxis={"title": "allocated / capacity", "tickformat": ".0%"})
    figs.append(("Utilization per pool over time", util))
    pools = _rows(rep, "pools")
    alloc = go.Figure(
        [
            go.Bar(x=[r[0] for r in pools], y=[r[3] for r in pools], name="allocated GPU-hours"),
            go.Bar(x=[r[0] for r in pools], y=[r[4] for r in pools], name="idle GPU-hours"),
        ]
    )
    alloc.update_layout(barmode="stack")
    figs.append(("Allocated versus idle", alloc))
    for name, title in (
        ("waitsByType", "Mean wait per task type (minutes)"),
        ("waitsByQueue", "Mean wait per queue (minutes)"),
    ):
        rows = _rows(rep, name)
        figs.append((title, go.Figure([go.Bar(x=[r[0] for r in rows], y=[r[2] for r in rows])])))
    for name, title in (("waitReasons", "Top reasons for waiting"), ("failures", "Failures by reason")):
        rows = _rows(rep, name)
        figs.append(
            (title, go.Figure([go.Bar(y=[r[0] for r in rows], x=[r[1] for r in rows], orientation="h")]))
        )
    figs.append(("Cost per team (each queue's own cost, stacked under its top team)", team_figure(rep)))
    wow = go.Figure()
    for name in ("wow_pool", "wow_teams"):
        rows = _rows(rep, name)
        wow.add_trace(
            go.Bar(x=[r[0] for r in rows], y=[(r[3] or 0) for r in rows], name=name.removeprefix("wow_"))
        )
    wow.update_layout(yaxis={"title": "change against the previous period", "tickformat": ".0%"})
    figs.append(("Week-over-week change", wow))
    return figs


def team_figure(rep: Mapping[str, Any]) -> go.Figure:
    """One bar per top team shown, stacked from each queue's own cost (its ownTotal), so the
    bars add up to the real spend: a parent's subtree total beside its children's counted the
    children twice."""
    t = next((t for t in rep["tables"] if t["name"] == "teams"), None)
    if t is None:
        return go.Figure()
    cols = t["columns"]
    by = {r[0]: dict(zip(cols, r, strict=True)) for r in t["rows"]}

    def top(q: str) -> str:
        seen = {q}
        p = by[q].get("parent")
        while isinstance(p, str) and p in by and p not in seen:
            q = p
            seen.add(q)
            p = by[q].get("parent")
        return q

    fig = go.Figure()
    for q, r in sorted(by.items()):
        own = float(r.get("ownTotal") or 0)
        if own:
            fig.add_trace(go.Bar(x=[top(q)], y=[own], name=q))
    fig.update_layout(barmode="stack", yaxis={"title": rep.get("currency", "")})
    return fig


def render_weekly_html(rep: Mapping[str, Any]) -> str:
    """One self-contained page: the first chart carries plotly.js inline, the rest reuse it."""
    parts = [
        f"<h1>gpupool weekly cost review (成本复盘)</h1><p>{html.escape(rep['from'])} to {html.escape(rep['to'])}</p>"
    ]
    head = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(cell(v))}</td></tr>"
        for k, v in rep["summary"].items()
    )
    parts.append(f"<h2>Headline figures</h2><table>{head}</table>")
    for i, (title, fig) in enumerate(figures(rep)):
        fig.update_layout(template="plotly_white", height=380, title=title)
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"chart{i}"))
    parts += [html_table(t) for t in rep["tables"]]
    return page("gpupool weekly report", "".join(parts))


__all__ = [
    "hours",
    "incident_review",
    "operations_review",
    "render_weekly_html",
    "series",
    "team_figure",
    "weekly_report",
]
