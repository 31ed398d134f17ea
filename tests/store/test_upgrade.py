"""Upgrades: a store made by an older release migrates with its data; a newer store is refused.

Why both directions: an operator who rolls the binary forward must keep every object, workload
and audit record; one who rolls it back (a bad release) must get a clear refusal naming both
schema revisions, not a crash inside Alembic or a scheduler misreading columns.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.store import Store
from gpupool.store.database import MIGRATIONS_DIR, StoreTooNew, create_engine


def _alembic() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


HEAD = str(ScriptDirectory.from_config(_alembic()).get_current_head())


def _at_revision(url: str, revision: str, *sql: str) -> None:
    """A store as a release whose newest migration is ``revision`` left it, with rows in it."""
    engine = create_engine(url, False)
    cfg = _alembic()
    with engine.connect() as conn, conn.begin():
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        for stmt in sql:
            conn.exec_driver_sql(stmt)
    engine.dispose()


def _stamp(url: str, revision: str) -> None:
    """Pretend a newer release migrated this store (its version row names a revision we lack)."""
    engine = create_engine(url, False)
    with engine.connect() as conn, conn.begin():
        conn.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{revision}'")
    engine.dispose()


FIRST_RELEASE_ROWS = (
    "INSERT INTO objects (kind, name, spec, labels, annotations, resource_version, created_at, updated_at)"
    " VALUES ('Queue', 'team-a', '{\"weight\": 2}', '{}', '{}', 3, '2026-11-01 10:00:00', '2026-11-01 10:00:00')",
    "INSERT INTO workloads (seq, name, queue, priority_class, owner, manifest, phase, placement, reason,"
    " submitted_at, admitted_at, finished_at, resource_version)"
    " VALUES (1, 'train-1', 'team-a', NULL, 'alice', '{\"kind\": \"Workload\"}', 'Pending', NULL,"
    " 'waiting', '2026-11-01 10:00:01', NULL, NULL, 1)",
)


def test_a_store_from_the_first_release_migrates_and_keeps_its_data(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    _at_revision(url, "0001", *FIRST_RELEASE_ROWS)
    with Store.open(url) as store:
        with store.engine.connect() as conn:
            assert MigrationContext.configure(conn).get_current_revision() == HEAD != "0001"
        queue = store.get_object("Queue", "team-a")
        assert (queue.spec, queue.resource_version) == ({"weight": 2}, 3)
        w = store.get_workload("train-1")
        assert (w.queue, w.owner, w.phase, w.reason) == ("team-a", "alice", "Pending", "waiting")
        # the newer tables work on the old data: the queue got its first revision
        assert [r.revision for r in store.list_revisions("Queue", "team-a")] == [1]


def test_a_store_newer_than_this_release_is_refused_naming_both_revisions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    _at_revision(url, "head", *FIRST_RELEASE_ROWS)
    _stamp(url, "0999")
    with pytest.raises(StoreTooNew) as info:
        Store.open(url)
    text = str(info.value)
    assert "0999" in text and f"newest revision is {HEAD}" in text
    # refused before anything ran: the version row is still the newer release's
    engine = create_engine(url, False)
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == "0999"
    engine.dispose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_refuses_a_newer_store_with_one_clear_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    _at_revision(url, "head")
    _stamp(url, "0999")
    res = CliRunner().invoke(
        app,
        ["serve", "--database-url", url, "--port", str(_free_port()), "--state-dir", str(tmp_path / "s")],
    )
    assert res.exit_code != 0
    out = " ".join(res.output.split())
    assert "cannot open the database" in out and "0999" in out and HEAD in out
    assert "Traceback" not in res.output
