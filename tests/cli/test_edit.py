"""``gpupool edit KIND NAME`` with ``EDITOR`` set to a small script (issue 29): the object as
``get -o yaml`` prints it, previewed and applied on save; nothing applied when nothing changed;
an invalid edit kept, its path printed with the located error. Against a real ``gpupool serve``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from gpupool.cli import app
from tests.test_service_support import Server

runner = CliRunner()

#: an editor that sets spec.weight of the file it is given to argv[1] (or leaves it as it is)
#: an editor that sets spec.weight of the file it is given to argv[1] (or leaves it as it is);
#: "race": someone else changes the object while it is open, and the edit sets weight 7
EDITOR = """
import os, sys, httpx, yaml
path = sys.argv[-1]
obj = yaml.safe_load(open(path))
if sys.argv[1] == "race":
    h = {"Authorization": "Bearer " + os.environ["GPUPOOL_TOKEN"]}
    url = os.environ["GPUPOOL_SERVER"] + "/v1/config/queues/" + obj["metadata"]["name"]
    other = httpx.get(url, headers=h).json()
    other["metadata"]["labels"] = {"touched": "yes"}
    httpx.put(url, json=other, headers=h).raise_for_status()
    obj["spec"]["weight"] = 7
elif sys.argv[1] != "keep":
    obj["spec"]["weight"] = yaml.safe_load(sys.argv[1])
open(path, "w").write(yaml.safe_dump(obj))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("edit") / "state", time_scale=1.0)
    srv.start(timeout=180)  # a loaded 2-core machine starts a server slowly
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def editor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("editor") / "editor.py"
    f.write_text(EDITOR)
    return f


def edit(server: Server, editor: Path, weight: str, *args: str) -> Result:
    env = {
        "GPUPOOL_SERVER": server.base,
        "GPUPOOL_TOKEN": server.token,
        "GPUPOOL_CONFIG": "/nonexistent",
        "EDITOR": f"{sys.executable} {editor} {weight}",
        "COLUMNS": "200",
    }
    r = runner.invoke(app, ["edit", *args], env=env)
    assert "Traceback" not in r.output
    return r


def queue(server: Server, name: str) -> dict[str, object]:
    with server.client() as c:
        got: dict[str, object] = c.get(f"/v1/config/queues/{name}").json()
        return got


def test_a_saved_edit_is_previewed_and_applied(server: Server, editor: Path) -> None:
    before = queue(server, "serving")
    r = edit(server, editor, "4", "queue", "serving", "--reason", "more share")
    assert r.exit_code == 0, r.output
    assert "Preview " in r.output and "Queue/serving: configured" in r.output.splitlines()
    after = queue(server, "serving")
    assert after["spec"]["weight"] == 4  # type: ignore[index]
    assert int(after["metadata"]["resourceVersion"]) == int(before["metadata"]["resourceVersion"]) + 1  # type: ignore[index]
    with server.client() as c:
        audit = c.get("/v1/audit", params={"limit": 10_000}).json()["items"]
    applied = [a for a in audit if a["action"] == "queue.apply" and a["name"] == "serving"][-1]
    assert applied["detail"]["reason"] == "more share" and "preview" in applied["detail"]


def test_an_edit_without_a_change_applies_nothing(server: Server, editor: Path) -> None:
    before = queue(server, "llm-pretrain")
    r = edit(server, editor, "keep", "queue", "llm-pretrain")
    assert r.exit_code == 0 and "Edit cancelled, no changes made." in r.output, r.output
    assert queue(server, "llm-pretrain") == before


def test_an_invalid_edit_is_kept_and_its_path_printed_with_the_error(server: Server, editor: Path) -> None:
    before = queue(server, "vision-team")
    r = edit(server, editor, "zero", "queue", "vision-team")
    assert r.exit_code == 2, r.output
    kept = Path(re.search(r"your edit is kept in (\S+?);", r.output)[1])  # type: ignore[index]
    assert f"{kept}: document 1 (Queue/vision-team): spec.weight" in r.output
    assert yaml.safe_load(kept.read_text())["spec"]["weight"] == "zero"  # the edit is not lost
    assert queue(server, "vision-team") == before
    kept.unlink()


def test_an_edit_refused_for_a_change_made_meanwhile_is_kept(server: Server, editor: Path) -> None:
    r = edit(server, editor, "race", "queue", "llm-team")
    assert r.exit_code == 1 and "(HTTP 409)" in r.output, r.output
    assert "the current resourceVersion is" in " ".join(r.output.split())
    kept = Path(re.search(r"your edit is kept in (\S+?);", r.output)[1])  # type: ignore[index]
    assert yaml.safe_load(kept.read_text())["spec"]["weight"] == 7
    now = queue(server, "llm-team")
    assert now["metadata"]["labels"] == {"touched": "yes"} and now["spec"].get("weight") != 7  # type: ignore[index,attr-defined]
    kept.unlink()


def test_only_configuration_kinds_can_be_edited(server: Server, editor: Path) -> None:
    r = edit(server, editor, "4", "workload", "anything")
    assert r.exit_code == 2 and "cannot edit workload" in r.output, r.output
