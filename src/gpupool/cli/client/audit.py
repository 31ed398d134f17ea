"""``gpupool audit verify | keygen | checkpoint | export``: the hash-chained audit log (platform-admin).

Why checkpoints are checked in the client too: a signed checkpoint held outside the database
proves the chain's prefix unchanged even against a server that ignores the checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from gpupool import audit as auditlog
from gpupool import audit_checkpoint as ckpt
from gpupool.cli.client.http import Api, ServerOpt, TokenOpt
from gpupool.cli.client.output import Format, Out, OutOpt, console, emit, err_console, fail
from gpupool.cli.files import FileProblem, read_text

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
    witness: str | None = typer.Option(
        None,
        "--witness",
        help="the server's witness (--audit-witness): a file, URL or configmap://NS/NAME; its newest checkpoint is checked",
    ),
    server: str | None = ServerOpt,
    token: str | None = TokenOpt,
    output: Format = OutOpt,
) -> None:
    """Check every record's hash and link; names the first bad record. Exit 1 when broken.

    With --checkpoint, every signed checkpoint in the file must verify with --public-key, and
    each checkpoint's record must still have its hash (records appended since are fine). With
    --witness, the newest checkpoint there is checked the same way. With neither, the server
    checks the newest checkpoint of its own witness (gpupool serve --audit-witness).
    """
    if checkpoint is not None and witness is not None:
        fail("--checkpoint and --witness: give one", 2)
    if (checkpoint is None and witness is None) != (public_key is None):
        fail("--checkpoint or --witness goes with --public-key (KEY.pub beside the signing key)", 2)
    cps = _checked_checkpoints(checkpoint, public_key) if checkpoint and public_key else []
    if witness is not None and public_key is not None:
        cps = _newest_witness(witness, public_key)
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
    if output not in (Out.table, Out.wide):
        emit(r, output)
    elif r["ok"]:
        seen = (
            f"; matches {len(cps)} signed checkpoint(s), the latest at seq {latest.count}" if latest else ""
        )
        if not cps and r.get("witness"):
            w = r["witness"]
            seen = (
                f"; matches the server's witness checkpoint of seq {w['count']} ({w['at']}, in {w['where']})"
            )
        console.print(
            f"[green]audit log intact[/]: {r['count']} records, head {r['headHash']}{seen}",
            highlight=False,
            soft_wrap=True,  # one line in logs and pipes: it is read by scripts
        )
    else:
        err_console.print(
            f"[red]audit log broken[/] at seq {r['firstBadSeq']}: {escape(str(r['problem']))}",
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


def _newest_witness(where: str, public_key: Path) -> list[ckpt.Checkpoint]:
    """The newest checkpoint of a witness file or URL, its signature verified (none: exit 1)."""
    from gpupool.kube.client import make_client
    from gpupool.service.audit_witness import WitnessError, sink_for

    try:
        pub = ckpt.load_public_key(public_key)
        data = sink_for(where, kube_client=make_client).newest()
    except (ckpt.CheckpointError, WitnessError, ValueError) as exc:  # ValueError: a malformed target
        fail(str(exc).replace("--audit-witness", "--witness"), 2)
    if data is None:
        fail(f"--witness {where}: holds no checkpoint", 1)
    try:
        return [ckpt.check(data, pub)]
    except ckpt.CheckpointError as exc:
        fail(f"--witness {where}: newest checkpoint: {exc}", 1)


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
            why = auditlog.checkpoint_truncated(r["count"], cp.count)
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


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``audit`` to the gpupool command (loaded only for it: the checkpoints' signatures
    need the cryptography package, which no other client command does)."""
    app.add_typer(audit_app, name="audit")
