"""Commands on one workload: ``cancel``, ``explain``, ``approve`` and ``reject``."""

from __future__ import annotations

from typing import Any

import typer

from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import Format, Out, OutOpt, console, emit, show, table


def cancel(
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Cancel a workload (stops it if it runs)."""
    w = Api(server, token).call("POST", f"/v1/workloads/{name}/cancel")
    emit(w, output, table(["workload", "phase", "reason"], [(w["name"], w["phase"], w["reason"])]))


def explain(
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Why a workload waits, and where it stands in its queue."""
    ex = Api(server, token).call("GET", f"/v1/workloads/{name}/explain")
    if output not in (Out.table, Out.wide):
        emit(ex, output)
        return
    line = f"{ex['name']} ({ex['phase']}, queue {ex['queue']})"
    if ex.get("position"):
        line += f": position {ex['position']} of {ex['queueLength']}"
    console.print(line, highlight=False, markup=False, soft_wrap=True)
    if ex.get("code") or ex.get("reason"):
        console.print(
            f"  {ex.get('code', '')}: {ex.get('reason', '')}", highlight=False, soft_wrap=True, markup=False
        )
    for line in type_lines(ex):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if ex.get("holders") is not None:
        wait_lines(ex)


def wait_lines(ex: dict[str, Any]) -> None:
    """The usage per pool and per queue, the estimated start (or why there is none) and the
    running work holding what it needs, largest first (docs/service.md, "Why a workload waits")."""
    for text in (ex.get("usage"), ex.get("estimate")):
        if text:
            console.print(f"  {text}", highlight=False, markup=False, soft_wrap=True)
    s = ex.get("scope") or {}
    where = (
        f"pool {s.get('name')}"
        if s.get("kind") == "pool"
        else f"{s.get('kind')} {s.get('name')} in pool {s.get('pool')}"
    )
    hs = ex["holders"]
    if not hs:
        console.print(f"  nothing runs in {where}", highlight=False, markup=False, soft_wrap=True)
        return
    console.print(f"  held by running work of {where}:", highlight=False, markup=False, soft_wrap=True)
    rows = [
        (h["name"], h.get("owner") or "", h["queue"], f"{h['gpus']:g}", h.get("expectedEnd") or "unknown")
        for h in hs
    ]
    show(table(["workload", "owner", "queue", "gpus", "expected end"], rows))
    if ex.get("holdersNotShown"):
        console.print(f"  and {ex['holdersNotShown']} more", highlight=False, markup=False, soft_wrap=True)


def type_lines(ex: dict[str, Any]) -> list[str]:
    """The pods admitted of those asked (partial admission) and what the task type set, each
    value with where it came from (docs/engine.md, "Task types")."""
    out = []
    got, asked = ex.get("admittedPods"), ex.get("requestedPods")
    if got is not None and asked is not None and got != asked:
        out.append(f"  admitted with {got} of {asked} pods (gang minimum)")
    for field, v in (ex.get("typeDefaults") or {}).items():
        if isinstance(v, dict) and v.get("value") is not None:
            value = v["value"]
            text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
            out.append(f"  {field}: {text} (from {v.get('from', 'none')})")
    return out


def approve(
    name: str = typer.Argument(...),
    reason: str = typer.Option("", "--reason"),
    until: str | None = typer.Option(None, "--until", help="end of an exception window (ISO 8601)"),
    for_: str | None = typer.Option(None, "--for", help="exception window length, e.g. 2h"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Approve a workload waiting for approval (an exception: optionally until a time)."""
    body: dict[str, Any] = {"reason": reason}
    if until:
        body["until"] = until
    if for_:
        body["duration"] = for_
    w = Api(server, token).call("POST", f"/v1/workloads/{name}/approve", json=body)
    emit(
        w,
        output,
        table(
            ["workload", "phase", "approval", "until"],
            [(w["name"], w["phase"], w["approval"]["state"], w["approval"].get("until") or "")],
        ),
    )


def reject(
    name: str = typer.Argument(...),
    reason: str = typer.Option(..., "--reason", help="why (required)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Reject a workload waiting for approval, with a reason."""
    w = Api(server, token).call("POST", f"/v1/workloads/{name}/reject", json={"reason": reason})
    emit(
        w,
        output,
        table(["workload", "phase", "approval"], [(w["name"], w["phase"], w["approval"]["state"])]),
    )
