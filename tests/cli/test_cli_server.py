"""The CLI against a real ``gpupool serve`` (child process, real HTTP): manifest sets applied whole
or not at all, and the audit log checked against signed checkpoints kept outside the database.

The audit test rewrites the server's database as an attacker would, so it runs last.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpupool.audit import canonical_json, compute_hash, record_from_dict
from tests.service.test_service_http import cli
from tests.test_service_support import REPO, Server, wait_for, wl


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("cli") / "state", time_scale=1.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _exists(server: Server, name: str) -> bool:
    with server.client() as c:
        return c.get(f"/v1/workloads/{name}").status_code == 200


def test_apply_and_submit_print_one_line_per_object(server: Server, tmp_path: Path) -> None:
    code, out = cli(server, "apply", "-f", str(REPO / "examples/cluster"))
    assert code == 0, out
    assert "Queue/llm-research: unchanged" in out.splitlines()
    f = tmp_path / "two.yaml"
    f.write_text(yaml.safe_dump_all([wl("set-a", duration="1h"), wl("set-b", duration="1h")]))
    code, out = cli(server, "submit", "-f", str(f))
    assert code == 0 and out.splitlines() == ["Workload/set-a: created", "Workload/set-b: created"]
    code, out = cli(server, "submit", "-f", str(f), "-o", "json")
    assert code == 0 and [r["result"] for r in json.loads(out)] == ["unchanged", "unchanged"]


def test_a_locally_bad_set_creates_nothing(server: Server, tmp_path: Path) -> None:
    bad = wl("local-bad")
    bad["spec"]["podGroups"] = []
    f = tmp_path / "mixed.yaml"
    f.write_text(yaml.safe_dump_all([wl("local-good"), bad]))
    code, out = cli(server, "submit", "-f", str(f))
    assert code == 2 and "nothing was sent" in out and "spec.podGroups" in out
    assert not _exists(server, "local-good")


def test_a_set_the_server_refuses_is_applied_not_at_all(server: Server, tmp_path: Path) -> None:
    f = tmp_path / "refused.yaml"
    # a request no pool can ever hold: only the server knows the cluster's nodes
    f.write_text(yaml.safe_dump_all([wl("srv-good"), wl("srv-bad", gpus=4096)]))
    code, out = cli(server, "submit", "-f", str(f))
    assert code == 1 and "(HTTP 4" in out and "fits no node" in out, out
    assert "nothing was applied" in out
    assert not _exists(server, "srv-good")


def test_get_prints_data_not_markup_and_the_kubectl_habits(server: Server, tmp_path: Path) -> None:
    pc = {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "PriorityClass",
        "metadata": {"name": "bracketed"},
        "spec": {"value": 5, "description": "runs after [/batch] work in [h100-training]"},
    }
    f = tmp_path / "pc.yaml"
    f.write_text(yaml.safe_dump(pc))
    assert cli(server, "apply", "-f", str(f))[0] == 0
    code, out = cli(server, "get", "priorityclasses")
    assert code == 0, out
    assert "runs after [/batch] work in [h100-training]" in out
    labelled = wl("habit-a", duration="1h")
    labelled["metadata"]["labels"] = {"team": "habits"}
    f.write_text(yaml.safe_dump_all([labelled, wl("habit-b", duration="1h")]))
    assert cli(server, "submit", "-f", str(f))[0] == 0
    code, out = cli(server, "get", "workloads", "-l", "team=habits", "-o", "name")
    assert code == 0 and out.splitlines() == ["workload/habit-a"]
    code, out = cli(server, "get", "wl", "--sort-by", ".name", "-o", "jsonpath={.items[*].name}")
    names = out.split()
    assert code == 0 and names == sorted(names) and {"habit-a", "habit-b"} <= set(names)
    code, out = cli(server, "get", "workloads", "-o", "wide")
    assert code == 0 and out.splitlines()[0].split()[:5] == ["NAME", "QUEUE", "PHASE", "OWNER", "PRIORITY"]


def test_submit_reports_every_problem_before_sending_with_the_servers_names(
    server: Server, tmp_path: Path
) -> None:
    typo = wl("typo-a", queue="llm-reserch")
    odd = wl("typo-b")
    odd["spec"]["podGroup"] = []
    f = tmp_path / "typo.yaml"
    f.write_text(yaml.safe_dump_all([wl("typo-good"), typo, odd]))
    code, out = cli(server, "submit", "-f", str(f))
    assert code == 2 and "nothing was sent" in out
    assert "queue 'llm-reserch' does not exist (did you mean 'llm-research'?)" in out
    assert "spec.podGroup: unknown field (did you mean 'podGroups'?)" in out
    assert not _exists(server, "typo-good")


def test_submit_takes_a_kueue_job_as_the_kubernetes_backend_converts_it(
    server: Server, tmp_path: Path
) -> None:
    from gpupool.kube.workloads import workload_from_object

    container = {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "kjob", "labels": {"kueue.x-k8s.io/queue-name": "llm-research"}},
        "spec": {"template": {"spec": {"containers": [container]}}},
    }
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))
    code, out = cli(server, "submit", "-f", str(f))
    expected = workload_from_object({**job, "metadata": {**job["metadata"], "namespace": "default"}})
    assert expected is not None
    name = expected.manifest["metadata"]["name"]
    assert code == 0 and out.splitlines() == [f"Workload/{name}: created"]
    with server.client() as c:
        got = c.get(f"/v1/workloads/{name}").json()
    assert got["queue"] == "llm-research"


def _rewrite_record(db: Path, seq: int, records: list[dict[str, object]]) -> None:
    """The database writer's forgery: edit record ``seq``, recompute every later hash and the anchor."""
    recs = [record_from_dict(r) for r in records]
    prev = recs[seq - 2].hash if seq > 1 else "0" * 64
    with sqlite3.connect(db) as conn:
        for r in recs[seq - 1 :]:
            detail = {"forged": True} if r.seq == seq else dict(r.detail)
            h = compute_hash(
                seq=r.seq,
                at=r.at,
                actor=r.actor,
                action=r.action,
                kind=r.kind,
                name=r.name,
                detail=detail,
                prev_hash=prev,
            )
            conn.execute(
                "UPDATE audit SET detail = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                (canonical_json(detail), prev, h, r.seq),
            )
            prev = h
        conn.execute("UPDATE audit_anchor SET count = ?, head_hash = ?", (len(recs), prev))


def test_audit_checkpoint_witnesses_a_rewrite_the_anchor_hides(server: Server, tmp_path: Path) -> None:
    key = tmp_path / "witness-key"
    code, out = cli(server, "audit", "keygen", "--out", str(key))
    assert code == 0 and "key id" in out and key.stat().st_mode & 0o777 == 0o600
    cp_file, log = tmp_path / "cp.json", tmp_path / "checkpoints.jsonl"
    code, out = cli(
        server, "audit", "checkpoint", "--key", str(key), "--out", str(cp_file), "--append", str(log)
    )
    assert code == 0, out
    cp = json.loads(cp_file.read_text())
    assert set(cp) == {"count", "headHash", "at", "server", "keyId", "signature"} and cp["count"] > 2
    pub = str(key) + ".pub"

    # more records after the checkpoint: it still holds
    f = tmp_path / "later.yaml"
    f.write_text(yaml.safe_dump(wl("after-checkpoint", duration="1h")))
    assert cli(server, "submit", "-f", str(f))[0] == 0
    wait_for(lambda: cli(server, "get", "workload", "after-checkpoint", "-o", "json")[1].count("Running"), 15)
    assert cli(server, "audit", "checkpoint", "--key", str(key), "--append", str(log))[0] == 0
    assert len(log.read_text().splitlines()) == 2
    code, out = cli(server, "audit", "verify", "--checkpoint", str(cp_file), "--public-key", pub)
    assert code == 0 and "intact" in out and "matches 1 signed checkpoint" in out, out
    code, out = cli(server, "audit", "verify", "--checkpoint", str(log), "--public-key", pub)
    assert code == 0 and "matches 2 signed checkpoint" in out, out

    # a forged checkpoint (moved, not re-signed) is refused
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({**cp, "count": cp["count"] - 1}))
    code, out = cli(server, "audit", "verify", "--checkpoint", str(forged), "--public-key", pub)
    assert code == 1 and "forged or altered" in out

    # the server's own witness (gpupool serve's default: a file and a key in --state-dir)
    witness, server_pub = server.state_dir / "audit-witness.jsonl", server.state_dir / "audit-witness.key.pub"
    code, out = cli(server, "audit", "verify")
    assert code == 0 and "matches the server's witness checkpoint" in out and str(witness) in out, out
    code, out = cli(server, "audit", "verify", "--witness", str(witness), "--public-key", str(server_pub))
    assert code == 0 and "matches 1 signed checkpoint" in out, out

    # the writer rewrites record 2, the chain after it and the anchor: the witness catches it by default
    with server.client() as c:
        records = c.get("/v1/audit", params={"limit": 10_000}).json()["items"]
    _rewrite_record(server.state_dir / "gpupool.db", 2, records)
    code, out = cli(server, "audit", "verify")
    assert code == 1 and "was rewritten" in out and "witness checkpoint of seq" in out, out
    code, out = cli(server, "audit", "verify", "--witness", str(witness), "--public-key", str(server_pub))
    assert code == 1 and "was rewritten" in out, out
    code, out = cli(server, "audit", "verify", "--checkpoint", str(cp_file), "--public-key", pub)
    assert code == 1 and f"broken at seq {cp['count']}" in out and "was rewritten" in out, out
    assert httpx.get(server.base + "/readyz").status_code == 200
