"""Configuration history: numbered revisions per object, written with the change, diffs and
rollback as a new revision (gpupool.store.revisions, gpupool.service.routes.revisions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.audit import AuditEntry
from gpupool.service.routes.revisions import field_changes
from gpupool.store import Conflict, Store
from tests.test_service_support import Api, running_app

API = "gpupool.io/v1alpha1"


def pc(name: str, value: int, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "PriorityClass",
        "metadata": {"name": name, **meta},
        "spec": {"value": value},
    }


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path}/r.db")


def test_every_change_is_the_next_revision_with_author_and_reason(store: Store) -> None:
    store.apply_object(pc("x", 5), audit=AuditEntry("alice", "priorityclass.apply", detail={"reason": "new"}))
    store.apply_object(pc("x", 5), audit=AuditEntry("bob", "priorityclass.apply"))  # unchanged
    store.apply_object(pc("x", 6, labels={"t": "a"}), audit=AuditEntry("bob", "priorityclass.apply"))
    store.delete_object("PriorityClass", "x", audit=AuditEntry("carol", "priorityclass.delete"))
    store.apply_object(pc("x", 7), audit=AuditEntry("dave", "priorityclass.apply"))
    revs = store.list_revisions("PriorityClass", "x")
    assert [(r.revision, r.action, r.author, r.reason, r.spec["value"]) for r in revs] == [
        (1, "apply", "alice", "new", 5),
        (2, "apply", "bob", "", 6),
        (3, "delete", "carol", "", 6),
        (4, "apply", "dave", "", 7),  # numbering survives a delete: a number names one state
    ]
    assert revs[1].manifest() == pc("x", 6, labels={"t": "a"})
    assert store.get_revision("PriorityClass", "x").revision == 4


def test_a_failed_set_leaves_no_revision(store: Store) -> None:
    store.apply_object(pc("a", 1), audit=AuditEntry("t", "priorityclass.apply"))
    with pytest.raises(Conflict):
        store.apply_objects(
            [
                (pc("b", 2), AuditEntry("t", "priorityclass.apply"), None),
                (pc("a", 3), AuditEntry("t", "priorityclass.apply"), 99),  # stale version
            ]
        )
    assert [r.revision for r in store.list_revisions("PriorityClass", "a")] == [1]
    with pytest.raises(Exception, match="not found"):
        store.list_revisions("PriorityClass", "b")


def test_field_changes_name_every_leaf_that_differs() -> None:
    old = {"spec": {"quotas": [{"pool": "p", "guarantee": {"gpu": 8}, "lend": 2}]}, "weight": 1}
    new = {"spec": {"quotas": [{"pool": "p", "guarantee": {"gpu": 4}}]}, "weight": 1, "note": "x"}
    assert field_changes(old, new) == [
        {"field": "note", "from": None, "to": "x"},
        {"field": "spec.quotas[0].guarantee.gpu", "from": 8, "to": 4},
        {"field": "spec.quotas[0].lend", "from": 2, "to": None},
    ]


def _queue(api: Api, name: str) -> dict[str, Any]:
    m: dict[str, Any] = api.get(f"/v1/config/queues/{name}")
    m["metadata"].pop("resourceVersion")
    return m


def test_history_diff_and_rollback_round_trip_over_the_api(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        first = _queue(api, "vision-team")
        cut = _queue(api, "vision-team")
        cut["spec"]["quotas"][0] = {"pool": "h100-training", "guarantee": {"nvidia.com/gpu": 8}}
        r = api.req("POST", "/v1/apply", json={"items": [cut], "reason": "shrink vision"})
        assert r.status_code == 200, r.text
        hist = api.get("/v1/revisions/queues/vision-team")["items"]
        assert [(h["revision"], h["author"], h["reason"]) for h in hist][1:] == [
            (2, "bootstrap-admin", "shrink vision")
        ]
        d = api.get("/v1/revisions/queues/vision-team/diff")
        assert (d["from"], d["to"]) == (1, 2)
        assert {c["field"] for c in d["changes"]} == {
            "spec.quotas[0].guarantee.nvidia.com/gpu",
            "spec.quotas[0].lendingLimit.nvidia.com/gpu",
        }
        assert "-      nvidia.com/gpu: 24" in d["unified"]
        # rollback as the CLI does it: revision 1's object applied again, as revision 3
        old = api.get("/v1/revisions/queues/vision-team/1")["manifest"]
        assert old == first
        r = api.req("POST", "/v1/apply", json={"items": [old], "reason": "rollback to 1"})
        assert r.json()["results"][0]["result"] == "configured"
        assert _queue(api, "vision-team") == first  # the object is exactly as it was
        back = api.get("/v1/revisions/queues/vision-team/diff?from=1&to=3")
        assert back["changes"] == [] and back["unified"] == ""
        assert len(api.get("/v1/revisions/queues/vision-team")["items"]) == 3  # history kept


def test_history_errors_name_the_problem(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        r = api.req("GET", "/v1/revisions/queues/vision-team/diff")
        assert r.status_code == 422 and "only revision 1" in r.text
        r = api.req("GET", "/v1/revisions/queues/vision-team/9")
        assert r.status_code == 404 and "revision 9" in r.text
        r = api.req("GET", "/v1/revisions/widgets/x")
        assert r.status_code == 404 and "unknown resource type" in r.text
        r = api.req("GET", "/v1/revisions/queues/vision-team", token="")
        assert r.status_code == 401


def test_the_migration_gives_existing_objects_revision_1(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config

    from gpupool.store.database import MIGRATIONS_DIR, create_engine, run_migrations

    engine = create_engine(f"sqlite:///{tmp_path}/old.db", False)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.connect() as conn, conn.begin():
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")  # a database from before configuration history
        conn.exec_driver_sql(
            "INSERT INTO objects (kind, name, spec, labels, annotations, resource_version, created_at, updated_at)"
            " VALUES ('PriorityClass', 'old', '{\"value\": 3}', '{}', '{}', 4, '2026-11-30 10:00:00', '2026-11-30 10:00:00')"
        )
    run_migrations(engine)
    store = Store(engine)
    [rev] = store.list_revisions("PriorityClass", "old")
    assert (rev.revision, rev.author, rev.spec, rev.resource_version) == (1, "migration", {"value": 3}, 4)
    store.apply_object(pc("old", 5), audit=AuditEntry("t", "priorityclass.apply"))
    assert [r.revision for r in store.list_revisions("PriorityClass", "old")] == [1, 2]
