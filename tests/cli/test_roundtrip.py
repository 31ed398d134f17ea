"""What ``gpupool get KIND NAME -o yaml|json`` prints applies back (issue 29, "Round trip").

Every kind ``get`` shows is either applied back ``unchanged`` (and, edited, ``configured``) or is
named here as a view that is not a manifest; ``metadata.resourceVersion`` is a precondition
(stale: 409 naming the current version; absent: none), other server-set metadata and ``status``
are ignored. Against a real ``gpupool serve`` (child process, real HTTP), as a user meets it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from gpupool.cli import app
from gpupool.cli.client.objects import KINDS, RESOURCES
from gpupool.manifests import ManifestError
from gpupool.manifests.convert import parse_manifest, resource_version, without_server_metadata
from tests.test_service_support import API, Server, wl

runner = CliRunner()

#: each kind ``get`` prints that ``apply`` takes back, and the object of the example cluster
#: the round trip reads (a priority class gpupool ships, not stored, included)
APPLIED = {
    "pools": "h100-training",
    "queues": "llm-research",
    "priorityclasses": "training",
    "clusters": "demo",
    "workloads": "rt-job",
}
#: what ``get`` prints of these is a view, not a manifest (nodes are part of the Cluster)
VIEWS = {"nodes", "approvals", "tokens", "quota"}
MANIFEST_KIND = {
    "pools": "ResourcePool",
    "queues": "Queue",
    "priorityclasses": "PriorityClass",
    "clusters": "Cluster",
    "workloads": "Workload",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("roundtrip") / "state", time_scale=1.0)
    srv.start(timeout=180)  # a loaded 2-core machine starts a server slowly
    try:
        yield srv
    finally:
        srv.stop()


def run(server: Server, *args: str, stdin: str | None = None) -> Result:
    env = {
        "GPUPOOL_SERVER": server.base,
        "GPUPOOL_TOKEN": server.token,
        "GPUPOOL_CONFIG": "/nonexistent",
        "COLUMNS": "200",
    }
    r = runner.invoke(app, list(args), env=env, input=stdin)
    assert "Traceback" not in r.output
    return r


def get_text(server: Server, res: str, name: str, fmt: str = "yaml") -> str:
    r = run(server, "get", res, name, "-o", fmt)
    assert r.exit_code == 0, r.output
    return r.stdout


def apply_file(server: Server, path: Path, text: str) -> Result:
    path.write_text(text)
    return run(server, "apply", "-f", str(path))


@pytest.fixture(scope="module")
def with_workload(server: Server) -> Server:
    r = run(server, "submit", "-f", "-", stdin=yaml.safe_dump(wl(APPLIED["workloads"], duration="2h")))
    assert r.exit_code == 0, r.output
    return server


def test_every_kind_get_prints_is_named_here() -> None:
    """A kind added to ``get`` must be added to the round trip (or named as a view)."""
    assert set(RESOURCES.values()) == set(APPLIED) | VIEWS
    assert set(KINDS) == set(APPLIED) | VIEWS


@pytest.mark.parametrize("fmt", ["yaml", "json"])
@pytest.mark.parametrize("res", sorted(APPLIED))
def test_get_then_apply_is_unchanged(with_workload: Server, tmp_path: Path, res: str, fmt: str) -> None:
    server, name = with_workload, APPLIED[res]
    text = get_text(server, res, name, fmt)
    r = apply_file(server, tmp_path / f"obj.{fmt}", text)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [f"{MANIFEST_KIND[res]}/{name}: unchanged"]
    assert get_text(server, res, name, fmt) == text  # nothing written: same resourceVersion


def test_server_set_metadata_and_status_are_ignored(server: Server, tmp_path: Path) -> None:
    obj = yaml.safe_load(get_text(server, "pools", APPLIED["pools"]))
    obj["metadata"].update(
        uid="0b7f", creationTimestamp="2026-01-01T00:00:00Z", generation=3, managedFields=[{"manager": "x"}]
    )
    obj["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    r = apply_file(server, tmp_path / "pool.yaml", yaml.safe_dump(obj))
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [f"ResourcePool/{APPLIED['pools']}: unchanged"]


def _edited_queue(text: str, weight: float) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(text)
    obj["spec"]["weight"] = weight
    return obj


def test_an_edit_is_configured_and_a_stale_version_is_409_naming_the_current(
    server: Server, tmp_path: Path
) -> None:
    read = get_text(server, "queue", "vision-team")
    version = int(yaml.safe_load(read)["metadata"]["resourceVersion"])
    r = apply_file(server, tmp_path / "q1.yaml", yaml.safe_dump(_edited_queue(read, 3)))
    assert r.exit_code == 0 and r.stdout.splitlines() == ["Queue/vision-team: configured"], r.output
    now = yaml.safe_load(get_text(server, "queue", "vision-team"))
    assert now["spec"]["weight"] == 3 and int(now["metadata"]["resourceVersion"]) == version + 1

    # a second edit of the same read: someone changed it meanwhile (the first edit)
    stale = tmp_path / "q2.yaml"
    r = apply_file(server, stale, yaml.safe_dump(_edited_queue(read, 5)))
    assert r.exit_code == 1, r.output
    assert f"the current resourceVersion is {version + 1}, the manifest has {version}" in r.output
    assert "(HTTP 409)" in r.output and "nothing was applied" in r.output
    assert "drop metadata.resourceVersion to overwrite" in r.output
    assert yaml.safe_load(get_text(server, "queue", "vision-team"))["spec"]["weight"] == 3

    # without a resourceVersion there is no precondition, as with kubectl apply
    blind = _edited_queue(read, 5)
    del blind["metadata"]["resourceVersion"]
    r = apply_file(server, stale, yaml.safe_dump(blind))
    assert r.exit_code == 0 and r.stdout.splitlines() == ["Queue/vision-team: configured"], r.output


def test_the_api_answers_409_naming_every_stale_object(server: Server) -> None:
    with server.client() as c:
        pools = c.get("/v1/config/pools").json()["items"][:2]
        for p in pools:
            p["metadata"]["resourceVersion"] = str(int(p["metadata"]["resourceVersion"]) + 7)
        r = c.post("/v1/apply", json={"items": pools})
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert [e["field"] for e in err["errors"]] == ["metadata.resourceVersion"] * 2
    assert [e["message"].split(": the current")[0] for e in err["errors"]] == [
        f"items[{i}]: document 1 (ResourcePool/{p['metadata']['name']}): metadata.resourceVersion: "
        f"ResourcePool {p['metadata']['name']!r} changed since it was read"
        for i, p in enumerate(pools)
    ]
    assert all("the current resourceVersion is" in e["problem"] for e in err["errors"])
    assert err["message"].startswith("2 object(s) changed since they were read; nothing was applied")


def test_a_built_in_priority_class_edited_is_stored_as_an_override(server: Server, tmp_path: Path) -> None:
    obj = yaml.safe_load(get_text(server, "priorityclass", "evaluation"))
    assert obj["metadata"]["annotations"] == {"gpupool.io/builtin": "true"}
    obj["spec"]["value"] = 150
    f = tmp_path / "pc.yaml"
    r = apply_file(server, f, yaml.safe_dump(obj))
    assert r.exit_code == 0 and r.stdout.splitlines() == ["PriorityClass/evaluation: configured"], r.output
    stored = yaml.safe_load(get_text(server, "priorityclass", "evaluation"))
    assert stored["spec"]["value"] == 150 and "annotations" not in stored["metadata"]
    # the same file again, and what get prints now, change nothing
    assert run(server, "apply", "-f", str(f)).stdout.splitlines() == ["PriorityClass/evaluation: unchanged"]
    r = apply_file(server, f, get_text(server, "priorityclass", "evaluation"))
    assert r.stdout.splitlines() == ["PriorityClass/evaluation: unchanged"], r.output


def test_a_view_is_refused_naming_the_document(server: Server, tmp_path: Path) -> None:
    node = json.loads(run(server, "get", "nodes", "-o", "json").stdout)["items"][0]["name"]
    r = apply_file(server, tmp_path / "node.yaml", get_text(server, "node", node))
    assert r.exit_code == 2 and "nothing was sent" in r.output
    assert f"{tmp_path / 'node.yaml'}: document 1" in r.output and "apiVersion" in r.output


_meta_value = st.one_of(
    st.text(max_size=8), st.integers(), st.lists(st.dictionaries(st.text(max_size=4), st.text(max_size=4)))
)


@settings(max_examples=60, deadline=None)
@given(
    version=st.one_of(st.integers(0, 2**40), st.integers(0, 2**40).map(str)),
    extra=st.dictionaries(
        st.sampled_from(["uid", "creationTimestamp", "generation", "managedFields"]), _meta_value
    ),
    labels=st.dictionaries(
        st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.from_regex(r"[a-z0-9]{0,8}", fullmatch=True)
    ),
)
def test_server_set_metadata_never_changes_what_a_manifest_says(
    version: int | str, extra: dict[str, Any], labels: dict[str, str]
) -> None:
    """Validated with or without what the server sets, a manifest is the same object, and what
    is stored of it carries none of it (so ``get`` then ``apply`` compares equal)."""
    meta: dict[str, Any] = {"name": "q", "labels": labels}
    plain = {"apiVersion": API, "kind": "Queue", "metadata": meta, "spec": {"weight": 2}}
    served = {**plain, "metadata": {**meta, "resourceVersion": version, **extra}}
    a, b = parse_manifest(plain), parse_manifest(served)
    assert (a.kind, a.name, a.metadata, a.spec) == (b.kind, b.name, b.metadata, b.spec)
    assert without_server_metadata(served) == plain
    assert resource_version(served) == int(version)


@settings(max_examples=40, deadline=None)
@given(
    bad=st.one_of(
        st.text(min_size=1).filter(lambda v: not (v.isascii() and v.isdigit())), st.just(-1), st.just(True)
    )
)
def test_a_resource_version_the_server_never_returned_is_a_located_error(bad: Any) -> None:
    served = {
        "apiVersion": API,
        "kind": "Queue",
        "metadata": {"name": "q", "resourceVersion": bad},
        "spec": {},
    }
    with pytest.raises(ManifestError) as exc:
        parse_manifest(served, "items[3]")
    assert exc.value.errors[0].startswith("items[3]: document 1 (Queue/q): metadata.resourceVersion: must be")
