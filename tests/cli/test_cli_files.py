"""Files given with ``-f``, checked before anything is sent: undecodable bytes, bad documents and
duplicate names are one clear answer and exit 2. The server named here is a closed port, so a
command that tried to send anything would say "cannot reach" instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli.main import app
from tests.test_service_support import free_port, wl

runner = CliRunner()
GOOD = yaml.safe_dump(wl("good-one"))


def run(*args: str, stdin: bytes | None = None) -> tuple[int, str]:
    env = {
        "GPUPOOL_SERVER": f"http://127.0.0.1:{free_port()}",
        "GPUPOOL_TOKEN": "gpt_unused",
        "GPUPOOL_CONFIG": "/nonexistent",
        "COLUMNS": "200",
    }
    r = runner.invoke(app, list(args), env=env, input=stdin)
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


@pytest.mark.parametrize("command", ["validate", "schedule", "submit", "apply"])
@pytest.mark.parametrize(
    ("content", "byte", "offset"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "0x89", 0),  # binary
        ("kind: Queue\nmetadata: {name: caf\u00e9}\n".encode("latin-1"), "0xe9", 32),  # Latin-1
    ],
    ids=["binary", "latin-1"],
)
def test_non_utf8_file_is_one_line(
    tmp_path: Path, command: str, content: bytes, byte: str, offset: int
) -> None:
    f = tmp_path / "m.yaml"
    f.write_bytes(content)
    code, out = run(command, "-f", str(f))
    assert code == 2
    assert out.strip() == f"error: {f}: not UTF-8 text (byte {byte} at offset {offset})"


def test_non_utf8_file_found_in_a_directory_and_on_stdin(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_bytes(b"name: \xff\n")
    code, out = run("submit", "-f", str(tmp_path))
    assert (
        code == 2 and out.strip() == f"error: {tmp_path / 'b.yaml'}: not UTF-8 text (byte 0xff at offset 6)"
    )
    code, out = run("apply", "-f", "-", stdin=b"\xfe\xff")
    assert code == 2 and out.strip() == "error: <stdin>: not UTF-8 text (byte 0xfe at offset 0)"


def test_bench_fragmentation_trace_not_utf8(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_bytes(b"sn,cpu_milli\n\xe9\n")
    pods.write_text("name\n")
    r = runner.invoke(app, ["bench", "fragmentation", "--nodes", str(nodes), "--pods", str(pods)])
    assert r.exit_code == 2 and "not UTF-8 text (byte 0xe9 at offset 13)" in r.output


@pytest.mark.parametrize("command", ["submit", "apply"])
def test_a_bad_document_sends_nothing_and_every_error_is_listed(tmp_path: Path, command: str) -> None:
    bad = wl("bad-one")
    bad["spec"]["podGroups"] = []
    worse = wl("Worse_One")
    (tmp_path / "a.yaml").write_text(yaml.safe_dump_all([wl("good-one"), bad]))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(worse))
    code, out = run(command, "-f", str(tmp_path / "a.yaml"), "-f", str(tmp_path / "b.yaml"))
    assert code == 2, out
    assert "2 problem(s) in the manifests; nothing was sent" in out
    assert f"{tmp_path / 'a.yaml'}: document 2 (Workload/bad-one): spec.podGroups" in out
    assert f"{tmp_path / 'b.yaml'}: document 1 (Workload/Worse_One): metadata.name" in out
    assert "cannot reach" not in out


def test_duplicate_names_are_refused_before_sending(tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump_all([wl("twin"), wl("twin")]))
    code, out = run("submit", "-f", str(one))
    assert code == 2 and "duplicate Workload 'twin'" in out and "cannot reach" not in out
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(wl("twin")))
    b.write_text(yaml.safe_dump(wl("twin", gpus=2)))
    code, out = run("submit", "-f", str(a), "-f", str(b))
    assert code == 2 and "cannot reach" not in out
    assert f"{b}: document 1 (Workload/twin): metadata.name: duplicate Workload 'twin' (first in {a}" in out


def test_submit_refuses_configuration_naming_the_document(tmp_path: Path) -> None:
    f = tmp_path / "q.yaml"
    f.write_text(
        yaml.safe_dump({"apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": "q"}})
    )
    code, out = run("submit", "-f", str(f))
    assert code == 2 and "document 1 (Queue/q): submit takes Workload manifests only" in out


def test_a_good_set_is_sent(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(GOOD)
    code, out = run("submit", "-f", str(f))
    assert code == 1 and "cannot reach the gpupool server" in out  # validated, then sent
