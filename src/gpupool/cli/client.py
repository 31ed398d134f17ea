"""kubectl-like commands that talk to a gpupool server over HTTP.

Why a thin client: all rules live in the server (one place to audit); the client only reads
files, picks the server and token (flag > environment > config file > ./.gpupool/admin-token)
and prints results as a table, JSON or YAML. Every failure is one clear line and a non-zero
exit, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpupool import audit as auditlog
from gpupool import audit_checkpoint as ckpt
from gpupool.cli.files import FileProblem, load_documents, read_text
from gpupool.manifests import Document, ManifestError

console = Console()
err_console = Console(stderr=True)

DEFAULT_SERVER = "http://127.0.0.1:8080"
DEFAULT_TOKEN_FILE = Path(".gpupool") / "admin-token"
CONFIG_FILE = Path("~/.config/gpupool/config.yaml")


class Out(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


ServerOpt = typer.Option(None, "--server", "-s", help="server URL (env GPUPOOL_SERVER)")
TokenOpt = typer.Option(None, "--token", help="API token (env GPUPOOL_TOKEN)")
OutOpt = typer.Option(Out.table, "-o", "--output", help="table, json or yaml")


class CliError(Exception):
    """A failure to report as one line."""


def fail(msg: str, code: int = 1) -> NoReturn:
    # the message is data (names, patterns, reasons): brackets in it are not styling
    err_console.print(f"[red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


def _config_file() -> dict[str, Any]:
    path = Path(os.environ.get("GPUPOOL_CONFIG", str(CONFIG_FILE))).expanduser()
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read the client config {path}: {exc}", 2)
    if not isinstance(data, dict):
        fail(f"the client config {path} must be a mapping with server/token/tokenFile", 2)
    return data


def resolve(server: str | None, token: str | None) -> tuple[str, str | None]:
    """Server and token from flag, environment, config file, then the defaults."""
    cfg = _config_file()
    srv = server or os.environ.get("GPUPOOL_SERVER") or cfg.get("server") or DEFAULT_SERVER
    tok = token or os.environ.get("GPUPOOL_TOKEN") or cfg.get("token")
    if not tok:
        tf = Path(
            os.environ.get("GPUPOOL_TOKEN_FILE") or cfg.get("tokenFile") or DEFAULT_TOKEN_FILE
        ).expanduser()
        if tf.exists():
            try:
                tok = tf.read_text(encoding="utf-8").strip()
            except OSError as exc:
                fail(f"cannot read the token file {tf}: {exc.strerror}", 2)
    return str(srv).rstrip("/"), tok


class Api:
    """A small HTTP client that turns every failure into CliError with the server's message."""

    def __init__(self, server: str | None, token: str | None) -> None:
        self.server, self.token = resolve(server, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=30.0)

    def call(self, method: str, path: str, *, refused: str | None = None, **kw: Any) -> Any:
        """The decoded answer; any failure exits with the server's message (and ``refused``, a
        line saying what a 4xx answer means for the request, e.g. that nothing was applied)."""
        try:
            r = self.http.request(method, path, **kw)
            leader = _standby_leader(r)
            if leader is not None and leader.rstrip("/") != self.server.rstrip("/"):
                # a standby replica names the leader: send the write there, once
                err_console.print(f"note: {self.server} is a standby; sending to the leader {leader}")
                self.server = leader
                self.http = httpx.Client(base_url=leader, headers=self.http.headers, timeout=30.0)
                r = self.http.request(method, path, **kw)
        except httpx.ConnectError:
            fail(
                f"cannot reach the gpupool server at {self.server} (is `gpupool serve` running? set --server or GPUPOOL_SERVER)"
            )
        except httpx.HTTPError as exc:
            fail(f"request to {self.server}{path} failed: {type(exc).__name__}: {exc}")
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                msg = str(err.get("message") or r.reason_phrase)
                details = [e for e in err.get("errors", []) if e.get("message") or e.get("problem")]
            except (ValueError, KeyError, TypeError):
                msg, details = f"{r.status_code} {r.reason_phrase}", []
            lines = [f"{msg} (HTTP {r.status_code})"]
            if len(details) > 1 or (details and details[0].get("problem", "") not in msg):
                lines += [f"  {d.get('field', '')}: {d.get('problem', '')}".rstrip() for d in details]
            if refused and r.status_code < 500:
                lines.append(f"  {refused}")
            if r.status_code == 401 and not self.token:
                lines.append(
                    f"  no token found: pass --token, set GPUPOOL_TOKEN, or run from the directory holding {DEFAULT_TOKEN_FILE}"
                )
            fail("\n".join(lines))
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text


def _standby_leader(r: httpx.Response) -> str | None:
    """The leader's URL when ``r`` is a standby's refusal of a write (gpupool.service.leader)."""
    if r.status_code != 503:
        return None
    try:
        errors = r.json()["error"]["errors"]
    except (ValueError, KeyError, TypeError):
        return None
    url = next((e.get("problem") for e in errors if isinstance(e, dict) and e.get("field") == "leader"), None)
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def _emit(data: Any, out: Out, table: Table | None = None) -> None:
    if out is Out.json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    elif out is Out.yaml:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    elif table is not None:
        console.print(table)
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def _table(cols: Iterable[str], rows: Iterable[Iterable[Any]]) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold")
    for c in cols:
        t.add_column(c.upper(), overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    return t


def load_set(files: list[Path]) -> list[Document]:
    """Every document of the files, validated locally as the server would; exit 2 on any problem.

    Why: nothing is sent unless the whole set is good, so a bad document or a duplicate name
    cannot leave the rest of the set applied.
    """
    try:
        return load_documents(files)
    except FileProblem as exc:
        fail(str(exc), 2)
    except ManifestError as exc:
        fail(
            f"{len(exc.errors)} problem(s) in the manifests; nothing was sent:\n  " + "\n  ".join(exc.errors),
            2,
        )


def _json_value(v: Any) -> Any:
    """YAML loads unquoted timestamps as dates; send them as ISO 8601 text."""
    if isinstance(v, date | datetime):
        return v.isoformat()
    raise TypeError(f"cannot send {type(v).__name__} as JSON")


def apply_set(api: Api, docs: list[Document]) -> list[dict[str, Any]]:
    """Send the whole set in one ``POST /v1/apply`` (all applied or none); the per-object results."""
    body = json.dumps({"items": [d.raw for d in docs]}, default=_json_value)
    data = api.call(
        "POST",
        "/v1/apply",
        content=body,
        headers={"Content-Type": "application/json"},
        refused="nothing was applied",
    )
    return list(data["results"])


def _print_results(results: list[dict[str, Any]], data: Any, output: Out) -> None:
    if output is not Out.table:
        _emit(data, output)
        return
    for r in results:
        console.print(f"{r['kind']}/{r['name']}: {r['result']}", highlight=False, soft_wrap=True)


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


def _resource(kind: str) -> str:
    r = RESOURCES.get(kind.lower())
    if r is None:
        fail(
            f"unknown resource type {kind!r}; one of pools, queues, priorityclasses, clusters, workloads, nodes, approvals, tokens, quota",
            2,
        )
    return r


def _gpu(spec: Mapping[str, Any]) -> str:
    out = []
    for q in spec.get("quotas", []):
        g = (q.get("guarantee") or {}).get("nvidia.com/gpu", 0)
        out.append(f"{q.get('pool')}={g}")
    return " ".join(out)


def _rows_for(res: str, data: dict[str, Any]) -> Table:
    items = data.get("items", [])
    if res == "pools":
        return _table(
            ["name", "selector", "preemptible", "approval", "price/gpu-h"],
            [
                (
                    i["metadata"]["name"],
                    ",".join(f"{k}={v}" for k, v in (i["spec"].get("nodeSelector") or {}).items()),
                    i["spec"].get("preemptible", True),
                    i["spec"].get("requiresApproval", False),
                    i["spec"].get("pricePerGPUHour", ""),
                )
                for i in items
            ],
        )
    if res == "queues":
        return _table(
            ["name", "parent", "weight", "strategy", "guarantees (gpu)", "approval"],
            [
                (
                    i["metadata"]["name"],
                    i["spec"].get("parent", ""),
                    i["spec"].get("weight", 1),
                    i["spec"].get("queueingStrategy", "BestEffortFIFO"),
                    _gpu(i["spec"]),
                    i["spec"].get("requiresApproval", False),
                )
                for i in items
            ],
        )
    if res == "priorityclasses":
        return _table(
            ["name", "value", "preemptible", "description"],
            [
                (
                    i["metadata"]["name"],
                    i["spec"].get("value"),
                    i["spec"].get("preemptible", True),
                    i["spec"].get("description", ""),
                )
                for i in items
            ],
        )
    if res == "clusters":
        return _table(
            ["name", "node groups", "nodes"],
            [
                (i["metadata"]["name"], len(i["spec"].get("nodeGroups", [])), len(i["spec"].get("nodes", [])))
                for i in items
            ],
        )
    if res == "workloads":
        return _table(
            ["name", "queue", "phase", "owner", "pool", "reason"],
            [
                (
                    w["name"],
                    w["queue"],
                    w["phase"],
                    w["owner"],
                    (w.get("placement") or {}).get("pool", ""),
                    (w.get("reason") or "")[:70],
                )
                for w in items
            ],
        )
    if res == "nodes":
        return _table(
            ["name", "pool", "model", "gpus", "allocated", "schedulable"],
            [
                (n["name"], n["pool"], n["gpuModel"], n["gpus"], f"{n['gpuAllocated']:g}", n["schedulable"])
                for n in items
            ],
        )
    if res == "approvals":
        return _table(
            ["id", "workload", "queue", "state", "requested by", "approver", "reason"],
            [
                (
                    a["id"],
                    a["workload"],
                    a["queue"],
                    a["state"],
                    a["requestedBy"],
                    a.get("approver") or "",
                    a["reason"],
                )
                for a in items
            ],
        )
    if res == "tokens":
        return _table(
            ["id", "name", "role", "scope", "revoked"],
            [(t["id"], t["name"], t["role"], t.get("scope") or "", t["revoked"]) for t in items],
        )
    if res == "quota":

        def g(v: Mapping[str, Any] | None) -> str:
            x = (v or {}).get("gpu")
            return "unlimited" if x is None else f"{x:g}"

        return _table(
            ["queue", "pool", "gpu used", "guarantee", "limit"],
            [(q["queue"], q["pool"], g(q["used"]), g(q["guarantee"]), g(q["limit"])) for q in items],
        )
    return _table(["item"], [(json.dumps(i),) for i in items])


def _path(res: str, name: str | None = None) -> str:
    if res in ("pools", "queues", "priorityclasses", "clusters"):
        return f"/v1/config/{res}" + (f"/{name}" if name else "")
    if res == "quota":
        return "/v1/quota"
    return f"/v1/{res}" + (f"/{name}" if name else "")


# ---------------------------------------------------------------------- commands
def apply(
    files: list[Path] = typer.Option(
        ..., "-f", "--filename", help="YAML files or directories ('-' for stdin)"
    ),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Create or update pools, queues, priority classes and clusters (and submit workloads)."""
    docs = load_set(files)
    results = apply_set(Api(server, token), docs)
    _print_results(results, {"results": results}, output)


def get(
    kind: str = typer.Argument(
        ..., help="pools|queues|priorityclasses|clusters|workloads|nodes|approvals|tokens|quota"
    ),
    name: str | None = typer.Argument(None),
    queue: str | None = typer.Option(None, "--queue", "-q", help="workloads: only this queue"),
    phase: list[str] = typer.Option([], "--phase", help="workloads: only these phases"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """List objects (or show one by name)."""
    res = _resource(kind)
    api = Api(server, token)
    if name is not None and res != "quota":
        data = api.call("GET", _path(res, name))
        _emit(data, output, _rows_for(res, {"items": [data]}) if res in ("workloads", "nodes") else None)
        return
    params: dict[str, Any] = {}
    if queue and res in ("workloads", "quota"):
        params["queue"] = queue
    if phase and res == "workloads":
        params["phase"] = phase
    data = api.call("GET", _path(res), params=params)
    _emit(data, output, _rows_for(res, data))


def describe(
    kind: str = typer.Argument(..., help="workload|node|pool|queue|priorityclass|cluster"),
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Everything about one object: spec, state, and for a workload its events and why it waits."""
    res = _resource(kind)
    api = Api(server, token)
    data: dict[str, Any] = {"object": api.call("GET", _path(res, name))}
    if res == "workloads":
        data["explain"] = api.call("GET", f"/v1/workloads/{name}/explain")
        data["events"] = api.call("GET", f"/v1/workloads/{name}/events")["items"]
    if res == "queues":
        data["quota"] = api.call("GET", "/v1/quota", params={"queue": name})["items"]
    if output is not Out.table:
        _emit(data, output)
        return
    obj = data["object"]
    if res == "workloads":
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
        _write_attempts(obj)
        console.print(
            _table(
                ["at", "type", "reason", "message"],
                [(e["at"][:19], e["type"], e["reason"], e["message"]) for e in data["events"]],
            )
        )
        return
    if res == "nodes":
        sys.stdout.write(yaml.safe_dump({k: v for k, v in obj.items() if k != "devices"}, sort_keys=False))
        console.print(
            _table(
                ["device", "allocated", "workloads"],
                [
                    (
                        d["index"],
                        f"{d['allocatedMilli'] / 1000:g}",
                        ", ".join(f"{w['workload']}({w['gpuMilli'] / 1000:g})" for w in d["workloads"]),
                    )
                    for d in obj["devices"]
                ],
            )
        )
        return
    _emit(data, Out.yaml)


def submit(
    files: list[Path] = typer.Option(..., "-f", "--filename", help="Workload manifests ('-' for stdin)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Submit workloads, all or none (idempotent by name: the same manifest again changes nothing)."""
    docs = load_set(files)
    bad = [d for d in docs if d.kind != "Workload"]
    if bad:
        fail(
            f"{bad[0].source}: submit takes Workload manifests only; use `gpupool apply -f` for configuration",
            2,
        )
    results = apply_set(Api(server, token), docs)
    _print_results(results, results, output)


def cancel(
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Cancel a workload (stops it if it runs)."""
    w = Api(server, token).call("POST", f"/v1/workloads/{name}/cancel")
    _emit(w, output, _table(["workload", "phase", "reason"], [(w["name"], w["phase"], w["reason"])]))


def explain(
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Why a workload waits, and where it stands in its queue."""
    ex = Api(server, token).call("GET", f"/v1/workloads/{name}/explain")
    if output is not Out.table:
        _emit(ex, output)
        return
    line = f"{ex['name']} ({ex['phase']}, queue {ex['queue']})"
    if ex.get("position"):
        line += f": position {ex['position']} of {ex['queueLength']}"
    console.print(line, highlight=False)
    if ex.get("code") or ex.get("reason"):
        console.print(f"  {ex.get('code', '')}: {ex.get('reason', '')}", highlight=False, soft_wrap=True)


def approve(
    name: str = typer.Argument(...),
    reason: str = typer.Option("", "--reason"),
    until: str | None = typer.Option(None, "--until", help="end of an exception window (ISO 8601)"),
    for_: str | None = typer.Option(None, "--for", help="exception window length, e.g. 2h"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Approve a workload waiting for approval (an exception: optionally until a time)."""
    body: dict[str, Any] = {"reason": reason}
    if until:
        body["until"] = until
    if for_:
        body["duration"] = for_
    w = Api(server, token).call("POST", f"/v1/workloads/{name}/approve", json=body)
    _emit(
        w,
        output,
        _table(
            ["workload", "phase", "approval", "until"],
            [(w["name"], w["phase"], w["approval"]["state"], w["approval"].get("until") or "")],
        ),
    )


def reject(
    name: str = typer.Argument(...),
    reason: str = typer.Option(..., "--reason", help="why (required)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Reject a workload waiting for approval, with a reason."""
    w = Api(server, token).call("POST", f"/v1/workloads/{name}/reject", json={"reason": reason})
    _emit(
        w,
        output,
        _table(["workload", "phase", "approval"], [(w["name"], w["phase"], w["approval"]["state"])]),
    )


audit_app = typer.Typer(
    help="Verify or export the hash-chained audit log (platform-admin).", no_args_is_help=True
)


@audit_app.command("verify")
def audit_verify(
    expected_count: int | None = typer.Option(
        None, "--expected-count", help="from an external copy of the head"
    ),
    expected_head: str | None = typer.Option(None, "--expected-head"),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="signed checkpoint file or checkpoint log (`audit checkpoint`)"
    ),
    public_key: Path | None = typer.Option(None, "--public-key", help="KEY.pub from `audit keygen`"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Check every record's hash and link; names the first bad record. Exit 1 when broken.

    With --checkpoint, every signed checkpoint in the file must verify with --public-key, and
    each checkpoint's record must still have its hash (records appended since are fine).
    """
    if (checkpoint is None) != (public_key is None):
        fail("--checkpoint and --public-key go together", 2)
    cps = _checked_checkpoints(checkpoint, public_key) if checkpoint and public_key else []
    params: dict[str, Any] = {
        k: v
        for k, v in (("expected_count", expected_count), ("expected_head", expected_head))
        if v is not None
    }
    latest = max(cps, key=lambda c: c.count) if cps else None
    if latest is not None:
        params.update(checkpoint_count=latest.count, checkpoint_head=latest.head_hash)
    api = Api(server, token)
    r = api.call("GET", "/v1/audit/verify", params=params)
    if r["ok"] and cps:
        r = _against_checkpoints(api, r, cps)
    if output is not Out.table:
        _emit(r, output)
    elif r["ok"]:
        seen = (
            f"; matches {len(cps)} signed checkpoint(s), the latest at seq {latest.count}" if latest else ""
        )
        console.print(
            f"[green]audit log intact[/]: {r['count']} records, head {r['headHash']}{seen}",
            highlight=False,
            soft_wrap=True,  # one line in logs and pipes: it is read by scripts
        )
    else:
        err_console.print(
            f"[red]audit log broken[/] at seq {r['firstBadSeq']}: {r['problem']}",
            highlight=False,
            soft_wrap=True,
        )
    if not r["ok"]:
        raise typer.Exit(1)


def _checked_checkpoints(path: Path, public_key: Path) -> list[ckpt.Checkpoint]:
    """Every checkpoint in the file, signature verified; a forged one exits 1 naming it."""
    try:
        pub = ckpt.load_public_key(public_key)
        text = read_text(path)
    except (ckpt.CheckpointError, FileProblem) as exc:
        fail(str(exc), 2)
    try:
        items = ckpt.read_checkpoints(text)
    except ckpt.CheckpointError as exc:
        fail(f"{path}: {exc}", 2)
    out = []
    for n, item in enumerate(items, 1):
        try:
            out.append(ckpt.check(item, pub))
        except ckpt.CheckpointError as exc:
            fail(f"{path}: checkpoint {n}: {exc}", 1)
    return out


def _against_checkpoints(api: Api, r: dict[str, Any], cps: list[ckpt.Checkpoint]) -> dict[str, Any]:
    """The server's verdict, failed where a checkpoint's record is gone or has another hash.

    Why here as well as on the server: the chain the server verified is intact from genesis,
    so the record at a checkpoint's seq having the signed hash proves the prefix unchanged;
    checking it in the client holds against a server that ignores the checkpoint parameters.
    """
    for cp in sorted(cps, key=lambda c: c.count):
        if cp.count == 0:
            continue
        when = f" (checkpoint taken {cp.at})"
        if cp.count > r["count"]:
            why = f"chain ends at seq {r['count']} but the checkpoint records {cp.count}: records deleted"
            return {**r, "ok": False, "firstBadSeq": r["count"] + 1, "problem": why + when}
        items = api.call("GET", "/v1/audit", params={"after": cp.count - 1, "limit": 1})["items"]
        if not items or items[0]["seq"] != cp.count or items[0]["hash"] != cp.head_hash:
            why = auditlog.checkpoint_mismatch(cp.count)
            return {**r, "ok": False, "firstBadSeq": cp.count, "problem": why + when}
    return r


@audit_app.command("keygen")
def audit_keygen(
    out: Path = typer.Option(..., "--out", help="private key file to create (KEY.pub is written beside it)"),
) -> None:
    """Create the Ed25519 key that signs checkpoints. Keep it where the database writer cannot read it."""
    try:
        pub = ckpt.generate_key(out)
        kid = ckpt.key_id(ckpt.load_public_key(pub))
    except ckpt.CheckpointError as exc:
        fail(str(exc), 2)
    console.print(f"private key {out} (mode 0600), public key {pub}, key id {kid}", highlight=False)


@audit_app.command("checkpoint")
def audit_checkpoint(
    key: Path = typer.Option(..., "--key", help="private key from `audit keygen`"),
    out: Path | None = typer.Option(None, "--out", help="write the checkpoint to this file"),
    append: Path | None = typer.Option(None, "--append", help="add it as one line to this checkpoint log"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Print a signed checkpoint {count, headHash, at, server, keyId, signature} of the verified chain."""
    try:
        private = ckpt.load_private_key(key)
    except ckpt.CheckpointError as exc:
        fail(str(exc), 2)
    api = Api(server, token)
    r = api.call("GET", "/v1/audit/verify")
    if not r["ok"]:
        fail(f"audit log broken at seq {r['firstBadSeq']}: {r['problem']}; no checkpoint taken", 1)
    cp = ckpt.sign(private, count=r["count"], head_hash=r["headHash"], server=api.server)
    line = json.dumps(cp.to_dict(), sort_keys=True) + "\n"
    sys.stdout.write(line)
    try:
        if out is not None:
            out.write_text(line, encoding="utf-8")
            err_console.print(f"wrote {out}", highlight=False)
        if append is not None:
            with append.open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            err_console.print(f"appended to {append}", highlight=False)
    except OSError as exc:
        fail(f"{exc.filename}: cannot write: {exc.strerror}", 2)


@audit_app.command("export")
def audit_export(
    fmt: str = typer.Option("jsonl", "--format", help="jsonl or csv"),
    out: Path | None = typer.Option(None, "--out", help="file to write (default: stdout)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Export the audit log as JSONL or CSV."""
    if fmt not in ("jsonl", "csv"):
        fail("--format must be jsonl or csv", 2)
    text = Api(server, token).call("GET", "/v1/audit/export", params={"format": fmt})
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
        console.print(f"wrote {out}")


token_app = typer.Typer(help="Manage API tokens (platform-admin).", no_args_is_help=True)


@token_app.command("create")
def token_create(
    name: str = typer.Argument(..., help="who the token is for"),
    role: str = typer.Option(..., "--role", help="platform-admin, queue-admin, member or viewer"),
    scope: str | None = typer.Option(None, "--scope", help="root queue of the subtree"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Out = OutOpt,
) -> None:
    """Issue a token; it is printed once."""
    r = Api(server, token).call("POST", "/v1/tokens", json={"name": name, "role": role, "scope": scope})
    _emit(
        r,
        output,
        _table(
            ["id", "name", "role", "scope", "token"],
            [(r["id"], r["name"], r["role"], r["scope"], r["token"])],
        ),
    )


@token_app.command("revoke")
def token_revoke(
    token_id: int = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Revoke a token by id."""
    r = Api(server, token).call("DELETE", f"/v1/tokens/{token_id}")
    console.print(f"token {r['id']} ({r['name']}) revoked")


def delete(
    kind: str = typer.Argument(..., help="pool|queue|priorityclass|cluster|workload"),
    name: str = typer.Argument(...),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Delete a configuration object (or cancel a workload)."""
    res = _resource(kind)
    if res not in ("pools", "queues", "priorityclasses", "clusters", "workloads"):
        fail(f"cannot delete {kind}", 2)
    r = Api(server, token).call("DELETE", _path(res, name))
    console.print(f"{kind}/{name}: {r.get('result') or r.get('phase')}", highlight=False)


def cordon(
    name: str = typer.Argument(...),
    undo: bool = typer.Option(False, "--undo", help="uncordon"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Stop (or with --undo resume) placing new work on a node."""
    r = Api(server, token).call("POST", f"/v1/nodes/{name}/{'uncordon' if undo else 'cordon'}")
    console.print(f"node/{r['name']}: schedulable={r['schedulable']}", highlight=False)


def drain(
    name: str = typer.Argument(...),
    reason: str = typer.Option("", "--reason", help="why (recorded with every eviction)"),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
) -> None:
    """Cordon a node, then evict every workload on it with the reason and requeue them."""
    r = Api(server, token).call("POST", f"/v1/nodes/{name}/drain", json={"reason": reason})
    evicted = ", ".join(r["evicted"]) or "nothing"
    console.print(f"node/{r['name']}: cordoned; evicted and requeued: {evicted}", highlight=False)


def _write_attempts(obj: dict[str, Any]) -> None:
    """A workload's runs started and its failure history (from GET /v1/workloads/NAME)."""
    if "attempts" not in obj:
        return
    fails = obj.get("failures") or []
    sys.stdout.write(f"attempts: {obj['attempts']}, failures: {len(fails)}\n")
    for f in fails:
        code = "-" if f.get("exitCode") is None else f["exitCode"]
        sys.stdout.write(f"  {f['at'][:19]}  exit code {code}  {f['reason']}\n")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add the client commands to the gpupool command."""
    for fn in (apply, get, describe, submit, cancel, explain, approve, reject, delete, cordon, drain):
        app.command(fn.__name__)(fn)
    app.add_typer(audit_app, name="audit")
    app.add_typer(token_app, name="token")
