"""Hostile and bulk input is refused early, naming the limit (issue 30, "Bounded parsing").

A YAML "billion laughs" (nine levels of nine aliases: 1 KiB of text, 10^9 nodes expanded) made
``gpupool validate -f`` and ``submit -f`` run for minutes; a Cluster of 100,000 nodes and an
apply of any size were accepted. The limits are gpupool.manifests.limits.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.cli.files import load_documents
from gpupool.manifests import ManifestError, parse_documents, safe_yaml
from gpupool.manifests.limits import (
    MAX_APPLY_OBJECTS,
    MAX_CLUSTER_NODES,
    MAX_YAML_ALIASES,
    MAX_YAML_DEPTH,
)
from tests.test_service_support import API, free_port, running_app, wl

REPO = Path(__file__).resolve().parents[2]


def billion_laughs(levels: int = 9) -> str:
    """Nine levels of nine aliases under a Workload's labels: 9^9 (~3.9e8) strings expanded."""
    names = [f"l{i}" for i in range(levels + 1)]
    lines = [f"apiVersion: {API}", "kind: Workload", "metadata:", "  name: laughs", "spec:"]
    lines.append(f"  l0: &l0 [{', '.join(['lol'] * 9)}]")
    for prev, cur in itertools.pairwise(names):
        lines.append(f"  {cur}: &{cur} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


def within(seconds: float, fn: Any) -> tuple[float, Any]:
    """``fn()``'s (duration, result or exception); fails when it does not end in ``seconds``
    (a daemon thread, so an endless parse fails the test instead of hanging the run)."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # the test looks at what it raised
            out.append(exc)

    t0 = time.monotonic()
    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(seconds)
    took = time.monotonic() - t0
    assert out, f"still running after {seconds} s"
    return took, out[0]


def test_billion_laughs_is_refused_within_2_s_naming_the_file_and_limit(tmp_path: Path) -> None:
    f = tmp_path / "laughs.yaml"
    f.write_text(billion_laughs())
    took, result = within(2.0, lambda: load_documents([f]))
    assert isinstance(result, ManifestError), result
    text = "\n".join(result.errors)
    assert str(f) in text and "document 1" in text and "MAX_YAML_NODES" in text, text
    assert took < 2.0


@pytest.mark.parametrize("command", ["validate", "submit"])
def test_the_cli_refuses_billion_laughs_in_one_line(tmp_path: Path, command: str) -> None:
    """The commands themselves, in a process of their own (the server is a closed port: the
    file must be refused before anything is sent)."""
    f = tmp_path / "laughs.yaml"
    f.write_text(billion_laughs())
    env = {"GPUPOOL_SERVER": f"http://127.0.0.1:{free_port()}", "GPUPOOL_TOKEN": "gpt_x", "COLUMNS": "300"}
    code = "from gpupool.cli.main import main; main()"
    r = subprocess.run(
        [sys.executable, "-c", code, command, "-f", str(f)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
        env={**os.environ, **env, "GPUPOOL_CONFIG": "/nonexistent"},
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "MAX_YAML_NODES" in out and "laughs.yaml" in out and "Traceback" not in out, out


def test_too_many_aliases_too_deep_and_recursive_are_refused() -> None:
    many = "base: &b {x: 1}\nitems:\n" + "".join("  - *b\n" for _ in range(MAX_YAML_ALIASES + 1))
    deep = "[" * (MAX_YAML_DEPTH + 1) + "]" * (MAX_YAML_DEPTH + 1)
    for text, limit in ((many, "MAX_YAML_ALIASES"), (deep, "MAX_YAML_DEPTH"), ("&a [*a]", "recursive")):
        with pytest.raises(ManifestError) as exc:
            parse_documents(text, "f.yaml")
        assert limit in str(exc.value) and "f.yaml" in str(exc.value), exc.value


def test_the_second_document_is_named() -> None:
    text = "a: 1\n---\n" + billion_laughs()
    _, result = within(10.0, lambda: parse_documents(text, "set.yaml"))
    assert isinstance(result, ManifestError) and "document 2 expands to more than" in str(result), result


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=3), st.booleans())
def test_within_the_limits_it_reads_what_safe_load_reads(docs: list[Any], flow: bool) -> None:
    """The bounded loader is yaml.safe_load_all on every document within the limits, aliases
    included (safe_dump writes one for each value that appears twice)."""
    shared = [docs[0], docs[0]]  # the same object twice: dumped as an anchor and an alias
    text = yaml.safe_dump_all([*docs, shared], default_flow_style=flow)
    assert list(safe_yaml.load_all(text)) == list(yaml.safe_load_all(text))


def cluster(nodes: int) -> dict[str, Any]:
    group = {"name": "g", "count": nodes, "gpu": {"model": "H100", "count": 8, "memory": "80Gi"}}
    group |= {"cpu": 64, "memory": "512Gi"}
    return {
        "apiVersion": API,
        "kind": "Cluster",
        "metadata": {"name": "big"},
        "spec": {"nodeGroups": [group]},
    }


def test_a_10000_node_cluster_is_refused_naming_the_limit() -> None:
    with pytest.raises(ManifestError) as exc:
        parse_documents(yaml.safe_dump(cluster(10_000)), "big.yaml")
    assert "spec: 10,000 nodes" in str(exc.value) and "MAX_CLUSTER_NODES" in str(exc.value)
    parse_documents(yaml.safe_dump(cluster(MAX_CLUSTER_NODES)), "ok.yaml")  # the limit itself is fine


def test_the_api_refuses_a_big_cluster_422_and_an_oversized_apply_413(tmp_path: Path) -> None:
    with running_app(tmp_path) as api:
        r = api.req("POST", "/v1/apply", json={"items": [cluster(10_000)]})
        assert r.status_code == 422, r.text
        assert "MAX_CLUSTER_NODES" in r.text
        items = [wl(f"w{i}") for i in range(MAX_APPLY_OBJECTS + 1)]
        r = api.req("POST", "/v1/apply", json={"items": items})
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert "MAX_APPLY_OBJECTS" in err["message"] and f"{MAX_APPLY_OBJECTS:,}" in err["message"]
        assert err["errors"][0]["field"] == "items"
        r = api.req("POST", "/v1/apply", json={"items": items, "dryRun": True})
        assert r.status_code == 413, r.text
        assert api.get("/v1/workloads")["items"] == []  # nothing of the set was applied
