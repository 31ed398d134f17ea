"""Starting the server as a service runs it: progress while ``make run`` installs, a banner that a
log file keeps whole, and the admin token kept out of logs (only where it is saved is printed)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_service_support import REPO, Server


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # a long state directory makes the banner's first line well past 80 columns
    srv = Server(tmp_path_factory.mktemp("startup") / ("state-with-a-long-directory-name" * 2))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_the_token_is_not_in_the_log_but_where_it_is_saved(logged: Server) -> None:
    log = logged.log.read_text()
    token = (logged.state_dir / "admin-token").read_text().strip()
    assert token.startswith("gpt_") and token not in log
    assert "bootstrap admin token: created (not printed: stdout is not a terminal)" in log
    assert f"saved to {logged.state_dir / 'admin-token'} (mode 0600)" in log


def test_the_banner_is_not_wrapped_in_a_log_file(logged: Server) -> None:
    lines = logged.log.read_text().splitlines()
    first = next(line for line in lines if "serving on" in line)
    assert len(first) > 80 and re.search(r"database sqlite:///\S+\)$", first), first


def test_make_run_says_it_is_installing_and_shows_pip_progress() -> None:
    text = (REPO / "Makefile").read_text()
    recipe = text.split("$(RUN_STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "@echo" in recipe and "installing" in recipe
    assert re.search(r"pip install -e \.", recipe) and "-q -e ." not in recipe


# -- the CLI answers at once: what the client leaves unimported (gpupool.cli.main says why) ----
# the server's own third-party packages, then its parts in gpupool (the client is gpupool.cli,
# the manifest models, the audit log's verifier and the model/quantities they build on)
SERVER_SIDE = (
    *("sqlalchemy", "alembic", "psycopg", "fastapi", "starlette", "uvicorn", "numpy"),
    *("sortedcontainers", "plotly", "statsmodels", "lightkube", "prometheus_client", "jwt"),
    *("gpupool.store", "gpupool.service", "gpupool.engine", "gpupool.sim", "gpupool.kube"),
    *("gpupool.cost", "gpupool.web", "gpupool.fragbench", "gpupool.bench", "gpupool.deploy"),
    *("gpupool.migrations", "gpupool.auth", "gpupool.oidc"),
)
#: what only writing a set of manifests or verifying the audit log needs: reading commands
#: (get, describe, explain, cancel) load neither (the models were two thirds of `get`'s start)
NOT_FOR_READING = ("gpupool.manifests", "gpupool.audit", "gpupool.audit_checkpoint", "cryptography")

_PROBE = """
import json, sys
from typer.testing import CliRunner
from gpupool.cli.main import app
runs = [a.split() for a in sys.argv[1:]]
codes = [CliRunner().invoke(app, a).exit_code for a in runs]
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""


def _loaded_after(*commands: str, heavy: tuple[str, ...] = SERVER_SIDE) -> tuple[list[int], list[str]]:
    """Exit codes of ``gpupool COMMAND`` for each command (one process), and the modules of
    ``heavy`` (packages or modules) that process imported."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *commands], capture_output=True, text=True, cwd=REPO, check=True
    )
    res = json.loads(out.stdout.splitlines()[-1])
    found = [m for m in res["modules"] if any(m == s or m.startswith(s + ".") for s in heavy)]
    return res["codes"], found


def test_importing_the_cli_and_asking_its_version_import_nothing_server_side() -> None:
    codes, heavy = _loaded_after("--version")
    assert codes == [0]
    assert heavy == [], heavy


DEAD = "--server http://127.0.0.1:9 --token t"  # refused at once: the command runs to its end


def test_the_client_commands_import_nothing_server_side() -> None:
    codes, heavy = _loaded_after(
        f"get workloads {DEAD}",
        f"describe workload w {DEAD}",
        f"explain w {DEAD}",
        f"submit -f examples/workloads/demo.yaml {DEAD}",
        f"apply -f examples/cluster {DEAD}",
        f"cancel w {DEAD}",
        f"logs w {DEAD}",
    )
    assert codes == [1] * 7
    assert heavy == [], heavy


def test_reading_commands_load_no_manifest_models_nor_the_audit_verifier() -> None:
    # `get` once imported apply's module (the manifest models, built with pydantic at import)
    # and the audit commands' (cryptography): two thirds of its start
    codes, heavy = _loaded_after(
        f"get workloads {DEAD}",
        f"describe workload w {DEAD}",
        f"explain w {DEAD}",
        f"cancel w {DEAD}",
        heavy=NOT_FOR_READING,
    )
    assert codes == [1] * 4
    assert heavy == [], heavy


def test_a_plain_http_server_costs_no_certificate_store(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx loads its whole CA bundle when a client is made with verify=True, a third of `get`'s
    # start, though an http:// server makes no TLS connection; an https one is still verified
    import ssl

    from gpupool.cli.client.http import Api

    made: list[object] = []
    real = ssl.create_default_context

    def counted(*args: object, **kw: object) -> ssl.SSLContext:
        made.append(kw.get("cafile"))
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.delenv("GPUPOOL_CA", raising=False)
    monkeypatch.setattr(ssl, "create_default_context", counted)
    Api("http://127.0.0.1:9", "t")
    assert made == []
    Api("https://127.0.0.1:9", "t")
    assert len(made) == 1 and made[0], made  # httpx's default: verified against its CA bundle


def test_every_command_module_registers_what_the_registry_names() -> None:
    import typer
    from typer.testing import CliRunner

    from gpupool.cli.main import COMMAND_MODULES, _loaded, app

    for module in {spec.module for spec in COMMAND_MODULES}:
        top, bench = _loaded(module)
        specs = [spec for spec in COMMAND_MODULES if spec.module == module]
        named = sorted(n for spec in specs for n in spec.commands)
        assert (sorted(top), sorted(bench)) == (named, sorted(n for s in specs for n in s.bench)), module
    listed = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    for name in (n for m in COMMAND_MODULES for n in m.commands):
        assert f" {name} " in listed, name
    assert isinstance(typer.main.get_command(app), typer.core.TyperGroup)


# -- the banner says which configuration is in force (issue 29: `serve` silently used the example) --
def test_the_banner_says_which_configuration_is_in_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpupool.cli.server import _config_line
    from gpupool.service.config import EXAMPLES, ServiceConfig

    cfg = ServiceConfig(state_dir=tmp_path, config_dir=EXAMPLES / "cluster")
    _config_line(cfg, 9, given=False)
    _config_line(cfg, 9, given=True)
    _config_line(cfg, 0, given=True)
    _config_line(cfg, 0, given=False)
    first_example, first_given, later_given, later = capsys.readouterr().out.splitlines()
    assert "9 objects from" in first_example and "the example configuration: no --config" in first_example
    assert "9 objects from" in first_given and "no --config" not in first_given
    assert "applied on a first start only" in later_given and "gpupool apply -f" in later_given
    assert later.startswith("configuration: the stored one")


def test_a_restarted_server_says_its_configuration_is_the_stored_one(logged: Server) -> None:
    logged.stop()
    logged.start()
    said = [line for line in logged.log.read_text().splitlines() if line.startswith("configuration:")]
    assert len(said) == 2 and "objects from" in said[0], said
    assert "the stored one; --config" in said[1], said
