"""``gpupool get``, ``describe`` and ``delete``: objects by kind and name.

Why the kind table: users type ``pool``, ``pools`` or ``resourcepool``; each maps to one API
resource, and each resource to its path (configuration kinds live under ``/v1/config``).
"""

from __future__ import annotations

import sys
from typing import Any

import typer
import yaml

from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.jsonpath import JsonPathError, sort_key
from gpupool.cli.client.listing import labels_of, list_all, parse_selector, watch_list
from gpupool.cli.client.output import Format, Out, OutOpt, console, emit, fail, show, table
from gpupool.cli.client.pools import describe_pool, with_catalog
from gpupool.cli.client.rows import rows_for
from gpupool.cli.client.workloads import wait_lines

RESOURCES = {
    "pool": "pools",
    "pools": "pools",
    "resourcepool": "pools",
    "resourcepools": "pools",
    "queue": "queues",
    "queues": "queues",
    "priorityclass": "priorityclasses",
    "priorityclasses": "priorityclasses",
    "pc": "priorityclasses",
    "cluster": "clusters",
    "clusters": "clusters",
    "workload": "workloads",
    "workloads": "workloads",
    "wl": "workloads",
    "node": "nodes",
    "nodes": "nodes",
    "approval": "approvals",
    "approvals": "approvals",
    "token": "tokens",
    "tokens": "tokens",
    "quota": "quota",
}

#: the singular kind of each resource, for ``-o name``
KINDS = {
    "pools": "pool",
    "queues": "queue",
    "priorityclasses": "priorityclass",
    "clusters": "cluster",
    "workloads": "workload",
    "nodes": "node",
    "approvals": "approval",
    "tokens": "token",
    "quota": "quota",
}

#: the resources kept by ``apply`` (their paths are under /v1/config)
CONFIG_RESOURCES = ("pools", "queues", "priorityclasses", "clusters")


def resource(kind: str) -> str:
    """The API resource of a kind as the user typed it; exit 2 naming the choices if unknown."""
    r = RESOURCES.get(kind.lower())
    if r is None:
        fail(
            f"unknown resource type {kind!r}; one of pools, queues, priorityclasses, clusters, workloads, nodes, approvals, tokens, quota",
            2,
        )
    return r


def path(res: str, name: str | None = None) -> str:
    """The API path of a resource's list, or of one object by name."""
    if res in CONFIG_RESOURCES:
        return f"/v1/config/{res}" + (f"/{name}" if name else "")
    if res == "quota":
        return "/v1/quota"
    return f"/v1/{res}" + (f"/{name}" if name else "")


def get(
    kind: str = typer.Argument(
        ..., help="pools|queues|priorityclasses|clusters|workloads|nodes|approvals|tokens|quota"
    ),
    name: str | None = typer.Argument(None),
    queue: str | None = typer.Option(None, "--queue", "-q", help="workloads: only this queue"),
    phase: list[str] = typer.Option([], "--phase", help="workloads: only these phases"),
    selector: str | None = typer.Option(
        None, "-l", "--selector", help="labels, e.g. team=vision,tier!=batch,!experimental"
    ),
    sort_by: str | None = typer.Option(
        None, "--sort-by", help="a JSONPath such as .submittedAt or {.metadata.name}"
    ),
    watch: bool = typer.Option(False, "-w", "--watch", help="keep printing objects as they change"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """List objects (or show one by name)."""
    res = resource(kind)
    api = Api(server, token)
    if name is not None and res != "quota":
        data = api.call("GET", path(res, name))
        one = rows_for(res, {"items": [data]}, output is Out.wide) if res in ("workloads", "nodes") else None
        emit(data, output, one, kind=KINDS.get(res, res))
        return
    params: dict[str, Any] = {}
    if queue and res in ("workloads", "quota"):
        params["queue"] = queue
    if phase and res == "workloads":
        params["phase"] = phase
    match = parse_selector(selector) if selector else None
    key = sort_key_or_fail(sort_by) if sort_by else None

    def fetch() -> dict[str, Any]:
        data = list_all(api, res, params, path(res))
        items = [i for i in data["items"] if match is None or match(labels_of(i))]
        data = {**data, "items": sorted(items, key=key) if key else items}
        return with_catalog(api, data) if res == "pools" and output is Out.wide else data

    if watch:
        watch_list(fetch, res, output)
        return
    data = fetch()
    emit(data, output, rows_for(res, data, output is Out.wide), kind=KINDS.get(res, res))


def sort_key_or_fail(path: str) -> Any:
    """The ``--sort-by`` key, or exit 2 naming the part of the path that cannot be read."""
    try:
        return sort_key(path)
    except JsonPathError as exc:
        fail(f"--sort-by: {exc}", 2)


def describe(
    kind: str = typer.Argument(..., help="workload|node|pool|queue|priorityclass|cluster"),
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Everything about one object: spec, state, and for a workload its events and why it waits."""
    res = resource(kind)
    api = Api(server, token)
    data: dict[str, Any] = {"object": api.call("GET", path(res, name))}
    if res == "workloads":
        data["explain"] = api.call("GET", f"/v1/workloads/{name}/explain")
        data["events"] = api.call("GET", f"/v1/workloads/{name}/events")["items"]
    if res == "queues":
        data["quota"] = api.call("GET", "/v1/quota", params={"queue": name})["items"]
    if res == "pools":
        data["catalog"] = api.call("GET", f"/v1/catalog/{name}")
    if output not in (Out.table, Out.wide):
        emit(data, output)
    elif res == "workloads":
        describe_workload(data)
    elif res == "nodes":
        describe_node(data["object"])
    elif res == "pools":
        describe_pool(data["catalog"])
    else:
        emit(data, Out.yaml)


def describe_workload(data: dict[str, Any]) -> None:
    """A workload's state, placement, queue position, why it waits, its runs and its events."""
    obj = data["object"]
    shown = {
        k: obj[k]
        for k in ("name", "queue", "owner", "phase", "reason", "submittedAt", "admittedAt", "finishedAt")
    }
    sys.stdout.write(yaml.safe_dump(shown, sort_keys=False))
    if obj.get("placement"):
        pods = obj["placement"]["pods"]
        sys.stdout.write(
            f"placement: pool {obj['placement']['pool']}, {len(pods)} pods on "
            f"{', '.join(sorted({p['node'] for p in pods}))}\n"
        )
    ex = data["explain"]
    if ex.get("position"):
        sys.stdout.write(
            f"position: {ex['position']} of {ex['queueLength']} pending in queue {ex['queue']}\n"
        )
    if ex.get("code"):
        sys.stdout.write(f"why: {ex.get('code')}: {ex.get('reason')}\n")
    if ex.get("holders") is not None:  # what it waits for and when it should start
        wait_lines(ex)
    write_attempts(obj)
    show(
        table(
            ["at", "type", "reason", "message"],
            [(e["at"][:19], e["type"], e["reason"], e["message"]) for e in data["events"]],
        )
    )


def describe_node(obj: dict[str, Any]) -> None:
    """A node's fields, then each device's allocation and the workloads sharing it."""
    sys.stdout.write(yaml.safe_dump({k: v for k, v in obj.items() if k != "devices"}, sort_keys=False))
    show(
        table(
            ["device", "allocated", "health", "workloads"],
            [
                (
                    d["index"],
                    f"{d['allocatedMilli'] / 1000:g}",
                    "ok" if d.get("healthy", True) else f"unhealthy: {d.get('healthReason') or '?'}",
                    ", ".join(f"{w['workload']}({w['gpuMilli'] / 1000:g})" for w in d["workloads"]),
                )
                for d in obj["devices"]
            ],
        )
    )


def write_attempts(obj: dict[str, Any]) -> None:
    """A workload's runs started and its failure history (from GET /v1/workloads/NAME)."""
    if "attempts" not in obj:
        return
    fails = obj.get("failures") or []
    sys.stdout.write(f"attempts: {obj['attempts']}, failures: {len(fails)}\n")
    for f in fails:
        code = "-" if f.get("exitCode") is None else f["exitCode"]
        sys.stdout.write(f"  {f['at'][:19]}  exit code {code}  {f['reason']}\n")


def delete(
    kind: str = typer.Argument(..., help="pool|queue|priorityclass|cluster|workload"),
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Delete a configuration object (or cancel a workload)."""
    res = resource(kind)
    if res not in (*CONFIG_RESOURCES, "workloads"):
        fail(f"cannot delete {kind}", 2)
    r = Api(server, token).call("DELETE", path(res, name))
    console.print(f"{kind}/{name}: {r.get('result') or r.get('phase')}", highlight=False, markup=False)
