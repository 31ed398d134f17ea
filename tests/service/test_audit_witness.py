"""The automatic audit witness (gpupool.service.audit_witness): the server signs checkpoints itself.

The attacker holds the database (direct SQL) but neither the server's signing key nor the
witness file: they rewrite a middle record and re-hash the chain, delete the tail, or wipe the
log, recomputing the anchor each time, so the store alone verifies. The witness catches all
three by default, and never signs the rewritten chain.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool import audit_checkpoint as ckpt
from gpupool.audit import GENESIS_HASH, AuditEntry, verify
from gpupool.service.audit_witness import (
    AuditWitness,
    ConfigMapSink,
    FileSink,
    HttpSink,
    WitnessError,
    WitnessSettings,
    banner_line,
    prepare,
    settings_from_options,
)
from gpupool.store import Store
from tests.store.test_store import clock, raw, store, url
from tests.test_audit import make_chain
from tests.test_audit_checkpoint import _rehashed, _rewrite_in_db
from tests.test_service_support import db_url, running_app, wait_for

__all__ = ["clock", "db_url", "store", "url"]


# ------------------------------------------------------------------ the three attacks, by SQL


def _edit_middle(s: Store) -> None:
    """Edit record 2, re-hash every record after it and the anchor."""
    _rewrite_in_db(s, 2, {"forged": True})


def _delete_tail(s: Store) -> None:
    """Delete the last two records and set the anchor to the new, shorter head."""
    count, _ = s.audit_head()
    keep = count - 2
    raw(s, "DELETE FROM audit WHERE seq > :k", k=keep)
    head = s.audit_records()[-1].hash
    raw(s, "UPDATE audit_anchor SET count = :c, head_hash = :h", c=keep, h=head)


def _wipe(s: Store) -> None:
    raw(s, "DELETE FROM audit")
    raw(s, "UPDATE audit_anchor SET count = 0, head_hash = :h", h=GENESIS_HASH)


#: attack -> (first bad seq as a function of the witnessed count, what verify's problem says)
ATTACKS: dict[str, tuple[Callable[[Store], None], Callable[[int], int], str]] = {
    "edit-middle": (_edit_middle, lambda n: n, "was rewritten"),
    "delete-tail": (_delete_tail, lambda n: n - 1, "records deleted"),
    "wipe": (_wipe, lambda n: 1, "the log was wiped"),
}


def _fill(s: Store, n: int) -> None:
    for i in range(n):
        s.append_audit(AuditEntry(f"user{i}", "thing.do", "Queue", f"q{i}", {"i": i}))


def _witness(s: Store, tmp_path: Path, **kw: Any) -> AuditWitness:
    key = tmp_path / "witness.key"
    if not key.exists():
        ckpt.generate_key(key)
    sink = FileSink(tmp_path / "witness.jsonl")
    return AuditWitness(s, sink, ckpt.load_private_key(key), server="http://test", **kw)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_each_rewrite_is_caught_and_never_signed(store: Store, tmp_path: Path, attack: str) -> None:
    do, bad_seq, says = ATTACKS[attack]
    _fill(store, 6)
    w = _witness(store, tmp_path)
    cp = w.take_now()
    assert cp is not None and (cp.count, cp.head_hash) == store.audit_head()
    do(store)
    assert store.verify_audit().ok  # the anchor was recomputed: the store alone is fooled
    r, seen = w.verify()
    assert seen == cp
    assert (r.ok, r.first_bad_seq) == (False, bad_seq(cp.count)), r
    assert says in r.problem and "witness checkpoint of seq 6" in r.problem
    # the next scheduled pass refuses to sign the rewritten chain: the witness keeps the truth
    assert w.take_now() is None and "not signed" in w.last_error
    assert _lines(tmp_path / "witness.jsonl") == [cp.to_dict()]


def test_appends_are_witnessed_and_an_unchanged_chain_adds_no_line(store: Store, tmp_path: Path) -> None:
    w = _witness(store, tmp_path)
    assert w.take_now() is None  # an empty log: nothing to witness
    _fill(store, 3)
    first = w.take_now()
    assert w.take_now() == first  # nothing appended since: no new line
    _fill(store, 2)
    second = w.take_now()
    assert first is not None and second is not None and (first.count, second.count) == (3, 5)
    assert [c["count"] for c in _lines(tmp_path / "witness.jsonl")] == [3, 5]
    assert w.verify()[0].ok


def test_a_forged_or_cut_back_witness_fails_verification(store: Store, tmp_path: Path) -> None:
    _fill(store, 3)
    w = _witness(store, tmp_path)
    cp = w.take_now()
    assert cp is not None
    path = tmp_path / "witness.jsonl"
    path.write_text(json.dumps({**cp.to_dict(), "count": 2}) + "\n")  # moved back, not re-signed
    r, _ = w.verify()
    assert not r.ok and "forged or altered" in r.problem and str(path) in r.problem
    path.write_text("")
    r, _ = w.verify()
    assert not r.ok and "cut back" in r.problem
    assert w.take_now() is None and "cut back" in w.last_error


# ------------------------------------------------------------------ the schedule, leader only


def test_started_witness_takes_one_at_once_and_one_at_shutdown(store: Store, tmp_path: Path) -> None:
    _fill(store, 2)
    path = tmp_path / "witness.jsonl"
    w = _witness(store, tmp_path, every_s=3600.0)
    w.start()
    try:
        wait_for(lambda: _lines(path), 30, "the start checkpoint")
        _fill(store, 3)
    finally:
        w.stop()
    assert [c["count"] for c in _lines(path)] == [2, 5]


def test_only_the_leader_writes_the_witness(store: Store, tmp_path: Path) -> None:
    _fill(store, 2)
    leads = {"now": False}
    path = tmp_path / "witness.jsonl"
    w = _witness(store, tmp_path, every_s=3600.0, retry_s=0.01, is_leader=lambda: leads["now"])
    assert w.take_now() is None and not path.exists()
    w.start()
    try:
        leads["now"] = True  # it takes the lease: the witness starts at its next look
        wait_for(lambda: _lines(path), 30, "a checkpoint once leading")
        leads["now"] = False
        _fill(store, 1)
    finally:
        w.stop()  # a standby's shutdown signs nothing
    assert [c["count"] for c in _lines(path)] == [2]


# ------------------------------------------------------------------ through the API, both databases


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_api_verify_catches_each_rewrite_by_default(tmp_path: Path, db_url: str, attack: str) -> None:
    do, _, says = ATTACKS[attack]
    key = tmp_path / "k"
    ckpt.generate_key(key)
    witness = WitnessSettings(str(tmp_path / "w.jsonl"), key, every_s=3600.0)
    with running_app(tmp_path / "state", db_url, audit_witness=witness) as api:
        wait_for(lambda: _lines(tmp_path / "w.jsonl"), 60, "the start checkpoint")
        ok = api.get("/v1/audit/verify")
        assert ok["ok"] and ok["witness"]["count"] == ok["count"] > 2, ok
        assert ok["witness"]["where"] == str(tmp_path / "w.jsonl")
        app: Any = api.c.app
        do(app.state.svc.store)
        r = api.get("/v1/audit/verify")
        assert not r["ok"] and says in r["problem"], r


def test_without_a_witness_the_api_reports_none(tmp_path: Path) -> None:
    with running_app(tmp_path / "state") as api:
        r = api.get("/v1/audit/verify")
        assert r["ok"] and r["witness"] is None


# ------------------------------------------------------------------ the HTTP endpoint


def test_http_witness_retries_a_failing_post_and_reads_the_newest(tmp_path: Path) -> None:
    key = tmp_path / "k"
    ckpt.generate_key(key)
    private = ckpt.load_private_key(key)
    kept: list[str] = []
    answers = iter([503, 200, 200])

    def handle(req: httpx.Request) -> httpx.Response:
        if req.method == "POST":
            code = next(answers)
            if code == 200:
                kept.append(req.content.decode())
            return httpx.Response(code)
        return httpx.Response(200, text="\n".join(kept)) if kept else httpx.Response(404)

    sink = HttpSink("http://witness.test/cp", backoff_s=0.0, transport=httpx.MockTransport(handle))
    assert sink.newest() is None
    for n in (4, 9):
        sink.append(ckpt.sign(private, count=n, head_hash="a" * 64, server="s"))
    assert len(kept) == 2 and sink.newest()["count"] == 9  # type: ignore[index]
    down = HttpSink(
        "http://witness.test/cp", backoff_s=0.0, transport=httpx.MockTransport(lambda r: httpx.Response(502))
    )
    with pytest.raises(
        WitnessError, match=r"http://witness.test/cp: POST failed after 3 attempts: answered 502"
    ):
        down.append(ckpt.sign(private, count=1, head_hash="a" * 64, server="s"))


# ------------------------------------------------------------------ gpupool serve's options


def test_serve_options_name_what_is_wrong(tmp_path: Path) -> None:
    s = settings_from_options("10m", None, None, tmp_path)
    assert s == WitnessSettings(str(tmp_path / "audit-witness.jsonl"), tmp_path / "audit-witness.key", 600.0)
    assert settings_from_options("off", None, None, tmp_path) is None
    for every, target, match in (
        ("soon", None, "--audit-checkpoint-every 'soon'"),
        ("0s", None, "must be > 0"),
        ("off", "/x", "--audit-witness needs the witness on"),
        ("5m", " ", "--audit-witness: give a file path"),
    ):
        with pytest.raises(ValueError, match=match):
            settings_from_options(every, target, None, tmp_path)


def test_the_default_key_is_made_once_with_mode_0600_a_named_one_must_exist(tmp_path: Path) -> None:
    s = settings_from_options("10m", None, None, tmp_path / "state")
    assert s is not None
    made = prepare(s, generate=True)
    line = banner_line(made)
    assert made.key_generated and "generated" in line and s.key_path.stat().st_mode & 0o777 == 0o600
    assert str(s.key_path) + ".pub" in line and "every 10m and at shutdown" in line
    again = prepare(s, generate=True)
    assert not again.key_generated and "generated" not in banner_line(again)
    named = settings_from_options("10m", None, tmp_path / "absent.key", tmp_path)
    assert named is not None
    with pytest.raises(
        ValueError, match=r"--audit-key: .*absent.key: no such key; make one with `gpupool audit keygen"
    ):
        prepare(named, generate=False)
    assert not (tmp_path / "absent.key").exists()
    assert "off" in banner_line(None)


def test_serve_refuses_a_bad_interval_before_starting_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli import app

    r = CliRunner().invoke(app, ["serve", "--state-dir", str(tmp_path), "--audit-checkpoint-every", "often"])
    assert r.exit_code == 2 and "--audit-checkpoint-every 'often'" in r.output
    assert not (tmp_path / "gpupool.db").exists()


# ------------------------------------------------------------------ the invariant, property-tested


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_rewrite_at_or_before_the_checkpoint_is_caught(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 12), label="records")
    k = data.draw(st.integers(1, n), label="witnessed")
    recs = make_chain(n)
    cp = (k, recs[k - 1].hash)
    grown = make_chain(n + data.draw(st.integers(0, 3), label="appended"))
    assert verify(grown, checkpoint=cp).ok
    i = data.draw(st.integers(1, k), label="rewritten seq")
    assert not verify(_rehashed(recs, i - 1, {"forged": i}), checkpoint=cp).ok
    m = data.draw(st.integers(0, k - 1), label="kept")
    res = verify(recs[:m], checkpoint=cp)
    assert not res.ok and res.first_bad_seq == m + 1


# ------------------------------------------------------------------ a ConfigMap, on the fake API server


def test_configmap_witness_keeps_the_newest_and_catches_a_rewrite(store: Store, tmp_path: Path) -> None:
    from gpupool.kube.client import make_client
    from gpupool.kube.fake.server import FakeApiServer

    srv = FakeApiServer(controllers=False, kubelet=False)
    srv.start()
    try:
        client = make_client(str(srv.write_kubeconfig(tmp_path / "kubeconfig")))
        httpx.post(
            srv.url + "/api/v1/namespaces", json={"metadata": {"name": "audit-witness"}}
        ).raise_for_status()
        sink = ConfigMapSink("audit-witness", "gpupool", keep=2, client=client)
        assert sink.newest() is None and sink.where == "configmap://audit-witness/gpupool"
        key = tmp_path / "k"
        ckpt.generate_key(key)
        w = AuditWitness(store, sink, ckpt.load_private_key(key), server="http://test")
        for n in (2, 3, 4):
            _fill(store, n)
            assert w.take_now() is not None
        cm = httpx.get(srv.url + "/api/v1/namespaces/audit-witness/configmaps/gpupool").json()
        assert sorted(cm["data"]) == [f"cp-{5:020d}", f"cp-{9:020d}"]  # the oldest dropped
        _edit_middle(store)
        r, seen = w.verify()
        assert seen is not None and seen.count == 9 and not r.ok and "was rewritten" in r.problem
        assert "configmap://audit-witness/gpupool" in r.problem
    finally:
        srv.stop()


def test_a_malformed_configmap_target_is_named(tmp_path: Path) -> None:
    for bad in ("configmap://", "configmap://ns", "configmap://ns/a/b"):
        with pytest.raises(ValueError, match=r"--audit-witness .*configmap://NAMESPACE/NAME"):
            settings_from_options("10m", bad, None, tmp_path)
    assert settings_from_options("10m", "configmap://ns/cm", None, tmp_path) is not None


def test_serve_gives_a_configmap_witness_its_kubernetes_client(tmp_path: Path) -> None:
    # the service no longer imports gpupool.kube (tests/test_layers: the package order): the
    # command line hands it the client factory, for configmap:// targets only
    from gpupool.cli import server_audit
    from gpupool.kube.client import make_client

    cm = server_audit.settings("10m", "configmap://ns/cm", None, tmp_path)
    assert cm is not None and cm.kube_client is make_client
    plain = server_audit.settings("10m", None, None, tmp_path)
    assert plain is not None and plain.kube_client is None
    with pytest.raises(WitnessError, match="configmap://ns/cm: no Kubernetes client"):
        ConfigMapSink("ns", "cm").newest()


def test_verify_names_a_malformed_witness_before_asking_the_server(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli import app

    pub = ckpt.generate_key(tmp_path / "k")
    args = ["audit", "verify", "--witness", "configmap://ns", "--public-key", str(pub)]
    r = CliRunner().invoke(app, args, env={"GPUPOOL_SERVER": "http://127.0.0.1:9"})
    assert (
        r.exit_code == 2
        and "--witness 'configmap://ns': a ConfigMap is configmap://NAMESPACE/NAME" in r.output
    )
    r = CliRunner().invoke(app, ["audit", "verify", "--witness", str(tmp_path / "w.jsonl")])
    assert r.exit_code == 2 and "--public-key" in r.output
