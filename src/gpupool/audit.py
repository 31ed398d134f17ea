"""Append-only, hash-chained audit log: record model, hashing, verification, export.

Why: operators must be able to prove who changed what. Each record's hash covers
its fields and the previous record's hash, so editing, inserting, deleting or
reordering records breaks the chain at a definite seq. Deleting records at the
tail leaves a valid (shorter) chain, so verification also takes the expected
count and head hash from an anchor (the store keeps one, updated in the same
transaction as each append). A writer who can rewrite the table can rewrite the
anchor too, so an operator also keeps an external *checkpoint* (count, head hash,
signed outside the database: see :mod:`gpupool.audit_checkpoint`); verification with
a checkpoint demands that record ``count`` still has that hash, which holds while
records are only appended and fails once any record at or before it is rewritten.
This module is pure: no database access.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

GENESIS_HASH = "0" * 64
CSV_FIELDS = ("seq", "at", "actor", "action", "kind", "name", "detail", "prev_hash", "hash")


@dataclass(frozen=True)
class AuditEntry:
    """What a caller wants recorded; the store assigns seq, time and hashes.

    ``kind``/``name`` may be left empty when the store call itself knows the object.
    """

    actor: str
    action: str
    kind: str = ""
    name: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditRecord:
    """One stored audit record (immutable once written)."""

    seq: int
    at: datetime
    actor: str
    action: str
    kind: str
    name: str
    detail: Mapping[str, Any]
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (time as ISO-8601 UTC); the inverse of :func:`record_from_dict`."""
        return {
            "seq": self.seq,
            "at": format_time(self.at),
            "actor": self.actor,
            "action": self.action,
            "kind": self.kind,
            "name": self.name,
            "detail": dict(self.detail),
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of chain verification; ``first_bad_seq`` is None when ``ok``."""

    ok: bool
    count: int
    head_hash: str
    first_bad_seq: int | None = None
    problem: str = ""


def format_time(at: datetime) -> str:
    """Canonical time text: UTC, microseconds, explicit offset (stable across databases)."""
    if at.tzinfo is None:
        raise ValueError("audit times must be timezone-aware")
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def canonical_json(value: Any) -> str:
    """Deterministic JSON (sorted keys, no spaces) so the hash does not depend on key order."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def compute_hash(
    *,
    seq: int,
    at: datetime,
    actor: str,
    action: str,
    kind: str,
    name: str,
    detail: Mapping[str, Any],
    prev_hash: str,
) -> str:
    """sha256 over the canonical JSON of all record fields including prev_hash."""
    body = canonical_json(
        {
            "seq": seq,
            "at": format_time(at),
            "actor": actor,
            "action": action,
            "kind": kind,
            "name": name,
            "detail": dict(detail),
            "prev_hash": prev_hash,
        }
    )
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def chain(entry: AuditEntry, *, seq: int, at: datetime, prev_hash: str) -> AuditRecord:
    """Build the next record after ``prev_hash``; the detail is normalised through JSON first."""
    if not entry.actor:
        raise ValueError("audit entry needs an actor")
    if not entry.action:
        raise ValueError("audit entry needs an action")
    detail = json.loads(canonical_json(dict(entry.detail)))
    digest = compute_hash(
        seq=seq,
        at=at,
        actor=entry.actor,
        action=entry.action,
        kind=entry.kind,
        name=entry.name,
        detail=detail,
        prev_hash=prev_hash,
    )
    return AuditRecord(seq, at, entry.actor, entry.action, entry.kind, entry.name, detail, prev_hash, digest)


def verify(
    records: Iterable[AuditRecord],
    *,
    expected_count: int | None = None,
    expected_head: str | None = None,
    checkpoint: tuple[int, str] | None = None,
) -> VerifyResult:
    """Check the chain in the given order and name the FIRST bad seq and why.

    Detects: edited records (hash mismatch), deleted records (seq gap or broken
    prev_hash), inserted or reordered records (seq out of order or broken
    prev_hash), and — given ``expected_count``/``expected_head`` from an anchor —
    records deleted or appended at the tail. ``checkpoint`` (count, head hash) is
    an external witness of a prefix: records appended after it are fine, but
    record ``count`` must exist and still have that hash.
    """
    prev = GENESIS_HASH
    count = 0
    if checkpoint is not None and checkpoint[0] == 0 and checkpoint[1] != GENESIS_HASH:
        return VerifyResult(False, 0, prev, None, "a checkpoint of 0 records must have the genesis hash")
    for rec in records:
        expected_seq = count + 1
        if rec.seq != expected_seq:
            if rec.seq > expected_seq:
                why = f"seq {expected_seq} missing (next record has seq {rec.seq}): record deleted"
            else:
                why = f"seq {rec.seq} found where seq {expected_seq} expected: record inserted or reordered"
            return VerifyResult(False, count, prev, expected_seq, why)
        if rec.prev_hash != prev:
            why = (
                f"prev_hash does not match the hash of seq {expected_seq - 1}: "
                "a record before it was edited, inserted, deleted or reordered"
            )
            return VerifyResult(False, count, prev, rec.seq, why)
        recomputed = compute_hash(
            seq=rec.seq,
            at=rec.at,
            actor=rec.actor,
            action=rec.action,
            kind=rec.kind,
            name=rec.name,
            detail=rec.detail,
            prev_hash=rec.prev_hash,
        )
        if recomputed != rec.hash:
            return VerifyResult(False, count, prev, rec.seq, "content does not match its hash: record edited")
        if checkpoint is not None and rec.seq == checkpoint[0] and rec.hash != checkpoint[1]:
            return VerifyResult(False, count, prev, rec.seq, checkpoint_mismatch(rec.seq))
        prev = rec.hash
        count += 1
    if checkpoint is not None and count < checkpoint[0]:
        return VerifyResult(False, count, prev, count + 1, checkpoint_truncated(count, checkpoint[0]))
    if expected_count is not None and count != expected_count:
        if count < expected_count:
            why = f"chain ends at seq {count} but the anchor records {expected_count}: tail records deleted"
            return VerifyResult(False, count, prev, count + 1, why)
        why = f"chain has {count} records but the anchor records {expected_count}: records appended"
        return VerifyResult(False, count, prev, expected_count + 1, why)
    if expected_head is not None and prev != expected_head:
        why = "head hash does not match the anchor: tail records edited or replaced"
        return VerifyResult(False, count, prev, count if count else 1, why)
    return VerifyResult(True, count, prev)


def checkpoint_mismatch(seq: int) -> str:
    """Why a chain fails a checkpoint whose record is still there but with another hash."""
    return (
        f"seq {seq} does not have the hash the checkpoint records: a record at or before seq {seq} "
        "was rewritten (the chain and the anchor were recomputed to hide it)"
    )


def checkpoint_truncated(count: int, witnessed: int) -> str:
    """Why a chain shorter than a checkpoint fails it: its tail deleted, or all of it."""
    if count == 0:
        return f"the audit log is empty but the checkpoint records {witnessed} records: the log was wiped"
    return f"chain ends at seq {count} but the checkpoint records {witnessed}: records deleted"


def export_jsonl(records: Iterable[AuditRecord], out: TextIO) -> int:
    """Write one canonical JSON object per line; returns the number of records."""
    n = 0
    for rec in records:
        out.write(canonical_json(rec.to_dict()))
        out.write("\n")
        n += 1
    return n


def export_csv(records: Iterable[AuditRecord], out: TextIO) -> int:
    """Write CSV with a header; detail is a canonical JSON cell. Returns the number of records."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    n = 0
    for rec in records:
        d = rec.to_dict()
        d["detail"] = canonical_json(d["detail"])
        writer.writerow([d[f] for f in CSV_FIELDS])
        n += 1
    return n


def record_from_dict(data: Mapping[str, Any]) -> AuditRecord:
    """Parse a dict as written by :meth:`AuditRecord.to_dict` (e.g. a JSONL export line)."""
    detail = data["detail"]
    if isinstance(detail, str):
        detail = json.loads(detail)
    return AuditRecord(
        seq=int(data["seq"]),
        at=datetime.fromisoformat(str(data["at"])),
        actor=str(data["actor"]),
        action=str(data["action"]),
        kind=str(data["kind"]),
        name=str(data["name"]),
        detail=detail,
        prev_hash=str(data["prev_hash"]),
        hash=str(data["hash"]),
    )


def read_jsonl(lines: Iterable[str]) -> list[AuditRecord]:
    """Load a JSONL export so it can be verified offline."""
    return [record_from_dict(json.loads(line)) for line in lines if line.strip()]


def read_csv(src: TextIO) -> list[AuditRecord]:
    """Load a CSV export so it can be verified offline."""
    return [record_from_dict(row) for row in csv.DictReader(src)]
