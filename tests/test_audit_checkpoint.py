"""The external audit witness: signed checkpoints, and verification of a chain against them.

The attacker here holds the database (direct SQL) but not the checkpoint key: they rewrite a
record, recompute every later hash and the anchor, and so pass `verify` — but not a checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpupool import audit_checkpoint as ckpt
from gpupool.audit import GENESIS_HASH, AuditEntry, AuditRecord, canonical_json, compute_hash, verify
from gpupool.store import Store
from tests.store.test_store import clock, raw, store, url
from tests.test_audit import make_chain

__all__ = ["clock", "store", "url"]


# ------------------------------------------------------------------ pure chain semantics


def _rehashed(recs: list[AuditRecord], i: int, detail: dict[str, Any]) -> list[AuditRecord]:
    """The chain with record i's detail changed and every hash from i on recomputed."""
    out = list(recs[:i])
    prev = out[-1].hash if out else GENESIS_HASH
    for j, r in enumerate(recs[i:], start=i):
        r = replace(r, detail=detail if j == i else r.detail, prev_hash=prev)
        r = replace(r, hash=compute_hash(**{k: getattr(r, k) for k in _HASHED}))
        out.append(r)
        prev = r.hash
    return out


_HASHED = ("seq", "at", "actor", "action", "kind", "name", "detail", "prev_hash")


def test_checkpoint_holds_after_appends() -> None:
    recs = make_chain(8)
    cp = (5, recs[4].hash)
    assert verify(recs[:5], checkpoint=cp).ok
    assert verify(recs, checkpoint=cp).ok  # three records appended since: still fine
    assert verify(recs, checkpoint=(0, GENESIS_HASH)).ok


def test_checkpoint_catches_a_rewritten_and_rehashed_prefix() -> None:
    recs = make_chain(8)
    cp = (5, recs[4].hash)
    forged = _rehashed(recs, 2, {"tampered": True})
    assert verify(forged, expected_count=8, expected_head=forged[-1].hash).ok  # anchor forged too
    res = verify(forged, checkpoint=cp)
    assert (res.ok, res.first_bad_seq) == (False, 5)
    assert "at or before seq 5 was rewritten" in res.problem


def test_checkpoint_ignores_rewrites_after_it_but_catches_truncation() -> None:
    recs = make_chain(8)
    cp = (5, recs[4].hash)
    assert verify(_rehashed(recs, 6, {"later": 1}), checkpoint=cp).ok  # after the witness: not its job
    res = verify(recs[:3], checkpoint=cp)
    assert (res.ok, res.first_bad_seq) == (False, 4) and "records deleted" in res.problem
    assert not verify(recs, checkpoint=(0, "f" * 64)).ok


# ------------------------------------------------------------------ in the store, attacked by SQL


def _rewrite_in_db(store: Store, seq: int, detail: dict[str, Any]) -> None:
    """What a database writer can do: edit a record, recompute the chain after it and the anchor."""
    recs = store.audit_records()
    forged = _rehashed(recs, seq - 1, detail)
    for r in forged[seq - 1 :]:
        raw(
            store,
            "UPDATE audit SET detail = :d, prev_hash = :p, hash = :h WHERE seq = :s",
            d=canonical_json(dict(r.detail)),
            p=r.prev_hash,
            h=r.hash,
            s=r.seq,
        )
    raw(store, "UPDATE audit_anchor SET count = :c, head_hash = :h", c=len(forged), h=forged[-1].hash)


def test_store_checkpoint_survives_appends_and_catches_a_recomputed_rewrite(store: Store) -> None:
    for i in range(4):
        store.append_audit(AuditEntry(f"user{i}", "thing.do", "Queue", f"q{i}", {"i": i}))
    cp = store.audit_head()
    for i in range(3):
        store.append_audit(AuditEntry("later", "thing.do", "Queue", f"r{i}", {"i": i}))
    assert store.verify_audit(checkpoint=cp).ok
    _rewrite_in_db(store, 2, {"i": 99})
    assert store.verify_audit().ok  # the anchor was recomputed: the store alone cannot tell
    res = store.verify_audit(checkpoint=cp)
    assert (res.ok, res.first_bad_seq) == (False, 4) and "rewritten" in res.problem


# ------------------------------------------------------------------ keys and signatures


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    key = tmp_path / "witness"
    pub = ckpt.generate_key(key)
    assert pub == tmp_path / "witness.pub"
    assert key.stat().st_mode & 0o777 == 0o600
    assert b"PRIVATE KEY" in key.read_bytes() and b"PUBLIC KEY" in pub.read_bytes()
    with pytest.raises(ckpt.CheckpointError, match="refusing to overwrite"):
        ckpt.generate_key(key)
    key.chmod(0o644)
    with pytest.raises(ckpt.CheckpointError, match="readable by others"):
        ckpt.load_private_key(key)


def test_signed_checkpoint_round_trips_and_forgeries_are_refused(tmp_path: Path) -> None:
    key = tmp_path / "k"
    pub = ckpt.load_public_key(ckpt.generate_key(key))
    cp = ckpt.sign(ckpt.load_private_key(key), count=7, head_hash="a" * 64, server="http://x")
    data = json.loads(json.dumps(cp.to_dict()))
    assert ckpt.check(data, pub) == cp
    with pytest.raises(ckpt.CheckpointError, match="forged or altered"):
        ckpt.check({**data, "count": 8}, pub)  # the attacker moves the witness forward
    with pytest.raises(ckpt.CheckpointError, match="forged or altered"):
        ckpt.check({**data, "signature": "AAAA" + data["signature"][4:]}, pub)
    other = tmp_path / "other"
    with pytest.raises(ckpt.CheckpointError, match="not by the given public key"):
        ckpt.check(data, ckpt.load_public_key(ckpt.generate_key(other)))
    with pytest.raises(ckpt.CheckpointError, match="headHash"):
        ckpt.check({**data, "headHash": "zz"}, pub)


def test_checkpoint_files_hold_one_object_or_one_per_line() -> None:
    one = {"count": 1}
    assert ckpt.read_checkpoints(json.dumps(one, indent=2)) == [one]
    assert ckpt.read_checkpoints('{"count": 1}\n\n{"count": 2}\n') == [{"count": 1}, {"count": 2}]
    with pytest.raises(ckpt.CheckpointError, match="line 2: not JSON"):
        ckpt.read_checkpoints('{"count": 1}\nnope\n')
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint"):
        ckpt.read_checkpoints("\n")
