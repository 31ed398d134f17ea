"""Pure tests of the hash chain: every kind of tampering is found at the first bad seq."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.audit import (
    CSV_FIELDS,
    GENESIS_HASH,
    AuditEntry,
    AuditRecord,
    chain,
    compute_hash,
    export_csv,
    export_jsonl,
    read_csv,
    read_jsonl,
    verify,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_chain(n: int) -> list[AuditRecord]:
    out: list[AuditRecord] = []
    prev = GENESIS_HASH
    for i in range(n):
        entry = AuditEntry(
            actor=f"user{i % 3}", action="queue.update", kind="Queue", name=f"q{i}", detail={"i": i, "f": 0.5}
        )
        rec = chain(entry, seq=i + 1, at=T0 + timedelta(seconds=i), prev_hash=prev)
        out.append(rec)
        prev = rec.hash
    return out


def test_valid_chain_verifies_with_anchor() -> None:
    recs = make_chain(5)
    res = verify(recs, expected_count=5, expected_head=recs[-1].hash)
    assert res.ok and res.count == 5 and res.head_hash == recs[-1].hash and res.first_bad_seq is None


def test_empty_chain() -> None:
    assert verify([], expected_count=0, expected_head=GENESIS_HASH).ok
    res = verify([], expected_count=2)
    assert not res.ok and res.first_bad_seq == 1


def test_hash_is_independent_of_detail_key_order() -> None:
    kw: dict[str, Any] = {
        "seq": 1,
        "at": T0,
        "actor": "a",
        "action": "x",
        "kind": "K",
        "name": "n",
        "prev_hash": GENESIS_HASH,
    }
    assert compute_hash(detail={"a": 1, "b": 2}, **kw) == compute_hash(detail={"b": 2, "a": 1}, **kw)
    assert compute_hash(detail={"a": 1}, **kw) != compute_hash(detail={"a": 2}, **kw)


def test_hash_covers_every_field() -> None:
    base = make_chain(1)[0]
    changes: list[tuple[str, Any]] = [
        ("seq", 2),
        ("at", T0 + timedelta(microseconds=1)),
        ("actor", "x"),
        ("action", "y"),
        ("kind", "Z"),
        ("name", "w"),
        ("detail", {"i": 1}),
        ("prev_hash", "1" * 64),
    ]
    for field, value in changes:
        changed = replace(base, **{field: value})
        assert verify([changed]).ok is False, field


def test_naive_time_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        chain(AuditEntry("a", "b"), seq=1, at=datetime(2026, 1, 1), prev_hash=GENESIS_HASH)


def test_entry_needs_actor_and_action() -> None:
    with pytest.raises(ValueError, match="actor"):
        chain(AuditEntry("", "b"), seq=1, at=T0, prev_hash=GENESIS_HASH)
    with pytest.raises(ValueError, match="action"):
        chain(AuditEntry("a", ""), seq=1, at=T0, prev_hash=GENESIS_HASH)


def test_edited_record_named() -> None:
    recs = make_chain(6)
    recs[3] = replace(recs[3], actor="mallory")
    res = verify(recs)
    assert (res.ok, res.first_bad_seq) == (False, 4)
    assert "edited" in res.problem


def test_edited_and_rehashed_record_breaks_next_link() -> None:
    recs = make_chain(6)
    r = replace(recs[2], actor="mallory")
    fields: dict[str, Any] = {k: v for k, v in vars(r).items() if k != "hash"}
    recs[2] = replace(r, hash=compute_hash(**fields))
    res = verify(recs)
    assert (res.ok, res.first_bad_seq) == (False, 4)
    assert "prev_hash" in res.problem


def test_deleted_record_named() -> None:
    recs = make_chain(6)
    del recs[2]
    res = verify(recs)
    assert (res.ok, res.first_bad_seq) == (False, 3)
    assert "deleted" in res.problem


def test_inserted_record_named() -> None:
    recs = make_chain(6)
    forged = chain(AuditEntry("mallory", "x"), seq=3, at=T0, prev_hash=recs[1].hash)
    recs.insert(2, forged)  # now seqs 1,2,3(forged),3,4,...
    res = verify(recs)
    assert (res.ok, res.first_bad_seq) == (False, 4)


def test_reordered_records_named() -> None:
    recs = make_chain(6)
    recs[1], recs[2] = recs[2], recs[1]
    res = verify(recs)
    assert (res.ok, res.first_bad_seq) == (False, 2)
    assert "missing" in res.problem or "reordered" in res.problem


def test_truncated_tail_needs_anchor() -> None:
    recs = make_chain(6)
    assert verify(recs[:4]).ok  # a bare chain cannot know its tail is gone...
    res = verify(recs[:4], expected_count=6)  # ...the anchor can
    assert (res.ok, res.first_bad_seq) == (False, 5)
    assert "tail" in res.problem


def test_appended_beyond_anchor_named() -> None:
    recs = make_chain(6)
    res = verify(recs, expected_count=5)
    assert (res.ok, res.first_bad_seq) == (False, 6)


def test_replaced_tail_detected_by_head_hash() -> None:
    recs = make_chain(4)
    forged = chain(AuditEntry("mallory", "x"), seq=4, at=T0, prev_hash=recs[2].hash)
    res = verify([*recs[:3], forged], expected_count=4, expected_head=recs[3].hash)
    assert (res.ok, res.first_bad_seq) == (False, 4)


def test_jsonl_round_trip_and_tamper() -> None:
    recs = make_chain(5)
    buf = io.StringIO()
    assert export_jsonl(recs, buf) == 5
    lines = buf.getvalue().splitlines()
    assert len(lines) == 5 and lines[0].startswith("{")
    back = read_jsonl(lines)
    assert back == recs
    assert verify(back, expected_count=5, expected_head=recs[-1].hash).ok
    swapped = [lines[0], lines[2], lines[1], lines[3], lines[4]]
    assert verify(read_jsonl(swapped)).first_bad_seq == 2


def test_csv_round_trip() -> None:
    recs = make_chain(3)
    buf = io.StringIO()
    assert export_csv(recs, buf) == 3
    text = buf.getvalue()
    assert text.splitlines()[0] == ",".join(CSV_FIELDS)
    back = read_csv(io.StringIO(text))
    assert back == recs
    assert verify(back).ok


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=2, max_value=12),
    op=st.sampled_from(["delete", "swap", "edit", "truncate"]),
    data=st.data(),
)
def test_any_single_tampering_is_caught_at_or_before_the_damage(n: int, op: str, data: st.DataObject) -> None:
    recs = make_chain(n)
    i = data.draw(st.integers(min_value=0, max_value=n - 1))
    if op == "delete":
        del recs[i]
    elif op == "swap":
        j = data.draw(st.integers(min_value=0, max_value=n - 1).filter(lambda j: j != i))
        recs[i], recs[j] = recs[j], recs[i]
        i = min(i, j)
    elif op == "edit":
        recs[i] = replace(recs[i], detail={"tampered": True})
    else:
        recs = recs[:i]
    res = verify(recs, expected_count=n)
    assert not res.ok
    assert res.first_bad_seq == i + 1
