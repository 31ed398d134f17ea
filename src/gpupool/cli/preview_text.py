"""How ``gpupool apply --dry-run``, ``rollback`` and ``onboard`` print an impact preview.

Why a module apart: three commands print the same report (gpupool.service.preview), and
the reader's question is always the same — who is stopped, who starts, which quota moves —
so the order of the sections is fixed: queues, preempted, admitted, reclaimable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.cli.client.output import console, show, table


def _pair(v: Sequence[Any]) -> str:
    def one(x: Any) -> str:
        if x is None:
            return "-"
        if isinstance(x, bool):
            return "yes" if x else "no"
        return f"{x:g}" if isinstance(x, float) else str(x)

    a, b = one(v[0]), one(v[1])
    return a if a == b else f"{a} -> {b}"


def _say(line: str) -> None:
    console.print(line, highlight=False, soft_wrap=True, markup=False)


def print_preview(report: Mapping[str, Any]) -> None:
    """The preview as text: what the change would do now, and that nothing was changed."""
    seen = report.get("considered") or {}
    _say(
        f"Preview {report.get('previewId', '')} (nothing was changed): "
        f"{seen.get('running', 0)} running and {seen.get('pending', 0)} pending workloads considered"
    )
    rows = [
        (
            q["queue"],
            q["pool"],
            _pair(q["guaranteeGPUs"]),
            _pair(q["limitGPUs"]),
            _pair(q["usedGPUs"]),
            _pair(q["borrowing"]),
        )
        for q in report.get("queues") or []
    ]
    if rows:
        _say("Queues (GPUs, now -> after the change and one scheduling cycle):")
        show(table(("QUEUE", "POOL", "GUARANTEE", "LIMIT", "USED", "BORROWING"), rows))
    else:
        _say("Queues: no guarantee, limit or use changes")
    victims = report.get("preempted") or []
    _say(f"Would preempt ({len(victims)}):" + ("" if victims else " none"))
    for v in victims:
        _say(f"  {v['workload']} ({v['queue']}) for {v['by']}: {v['rule']}")
    admits = report.get("admitted") or []
    _say(f"Would admit ({len(admits)}):" + ("" if admits else " none"))
    for a in admits:
        _say(f"  {a['workload']} ({a['queue']}) -> {a['pool']}" + (" borrowing" if a["borrowing"] else ""))
    fresh = [r["workload"] for r in report.get("reclaimable") or [] if not r["already"]]
    if fresh:
        _say(f"Would become reclaimable ({len(fresh)}): {', '.join(fresh)}")
    delta = {k: v for k, v in (report.get("becauseOfChange") or {}).items() if v}
    if delta:
        _say("Because of the change: " + "; ".join(f"{k} {', '.join(v)}" for k, v in delta.items()))
    else:
        _say("Because of the change: no scheduling decision differs from the configuration in force")
