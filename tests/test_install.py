"""gpupool as a user installs it: a wheel built from this tree, installed into a fresh virtualenv.

Why a fresh virtualenv: the development venv has the source checkout on its path (``examples/``
beside it), which hides a wheel that forgot its packaged defaults. The fresh venv sees the dev
venv's third-party packages through a ``.pth`` line (no downloads) but its own ``gpupool`` first.
The same steps are the Dockerfile's (see tests/deploy/test_deploy.py), since images cannot be built here.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(
    *args: str | Path, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def build_wheel(dest: Path) -> Path:
    """Build gpupool's wheel from a copy of the tree (a build in place would leave build/ behind)."""
    src = dest / "src-copy"
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    out = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", dest / "dist")
    assert out.returncode == 0, out.stderr
    (wheel,) = (dest / "dist").glob("gpupool-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with only the built wheel installed; yields its bin directory."""
    root = tmp_path_factory.mktemp("install")
    wheel = build_wheel(root)
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    purelib = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # third-party packages from the dev venv, after the fresh venv's own site-packages
    (purelib / "zz-dev-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = _run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", wheel)
    assert out.returncode == 0, out.stderr
    yield env_dir / "bin"


def test_the_wheel_is_what_runs(installed: Path) -> None:
    out = _run(installed / "python", "-c", "import gpupool; print(gpupool.__file__)", cwd=installed)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(installed.parent), out.stdout


def test_serve_help_and_packaged_defaults_validate(installed: Path) -> None:
    out = _run(installed / "gpupool", "serve", "--help", cwd=installed)
    assert out.returncode == 0 and "--config" in out.stdout, out.stdout + out.stderr
    where = _run(
        installed / "python", "-c", "from gpupool.defaults import DEFAULTS_DIR; print(DEFAULTS_DIR)"
    ).stdout.strip()
    assert Path(where).is_relative_to(installed.parent)
    out = _run(installed / "gpupool", "validate", "-f", where, cwd=installed)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 pools, 4 queues, 5 priority classes" in out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_starts_on_its_packaged_defaults(installed: Path, tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "GPUPOOL_DATABASE_URL"}  # SQLite in state-dir
    proc = subprocess.Popen(
        [installed / "gpupool", "serve", "--port", str(port), "--state-dir", tmp_path / "state"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = None
        for _ in range(300):  # a readiness wait, not a speed claim
            if proc.poll() is not None:
                break
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1.0)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert ready is not None and ready.status_code == 200, proc.stdout.read() if proc.stdout else ""
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "defaults" in out and "objects from" in out, out


def test_the_webhook_container_serves_admission_reviews_over_tls(installed: Path, tmp_path: Path) -> None:
    """The chart's webhook container: ``gpupool deploy webhook-server`` with a certificate from
    ``gpupool.deploy.certs``, called as the API server calls it (TLS, the CA bundle, no token)."""
    import ssl

    from gpupool.deploy.certs import make_certs

    pem = make_certs(["localhost"])
    for name, data in (("tls.crt", pem.cert), ("tls.key", pem.key), ("ca.crt", pem.ca)):
        (tmp_path / name).write_bytes(data)
    port = _free_port()
    args = ["deploy", "webhook-server", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--tls-cert-file", str(tmp_path / "tls.crt"), "--tls-key-file", str(tmp_path / "tls.key")]
    proc = subprocess.Popen(
        [installed / "gpupool", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    trust = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "operation": "CREATE",
            "object": {
                "metadata": {"name": "j", "labels": {"gpupool.io/queue": "q"}},
                "spec": {"template": {"spec": {}}},
            },
        },
    }
    try:
        with httpx.Client(base_url=f"https://localhost:{port}", verify=trust, timeout=2.0) as c:
            for _ in range(300):  # a readiness wait, not a speed claim
                if proc.poll() is not None:
                    break
                try:
                    if c.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            r = c.post("/webhooks/mutate", json=review)
            assert r.status_code == 200, r.text
            assert (
                r.json()["response"]["allowed"] is True and r.json()["response"]["patchType"] == "JSONPatch"
            )
        with (
            pytest.raises(httpx.ConnectError),
            httpx.Client(verify=ssl.create_default_context(), timeout=2.0) as c,
        ):
            c.get(f"https://localhost:{port}/healthz")  # a client without the CA is refused
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


# -- the container image (not built here: no image builder on these machines) -------------------
def _stages(text: str) -> list[list[tuple[str, str]]]:
    """The Dockerfile as stages of (INSTRUCTION, arguments), continuation lines joined."""
    joined = text.replace("\\\n", " ")
    stages: list[list[tuple[str, str]]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word.upper(), " ".join(rest.split())))
    return stages


def test_the_image_installs_the_wheel_it_built_and_runs_as_non_root() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    build, runtime = _stages(text)
    assert build[0] == ("FROM", "python:${PYTHON_VERSION}-slim AS build")
    runs = " && ".join(arg for ins, arg in build if ins == "RUN")
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /dist ." in runs
    assert "--wheel-dir /deps /dist/gpupool-*.whl" in runs  # the dependencies of the wheel just built
    assert ("COPY", "--from=build /deps /tmp/wheels") in runtime
    (install,) = [arg for ins, arg in runtime if ins == "RUN" and "pip install" in arg]
    assert "--no-index --find-links /tmp/wheels gpupool" in install  # nothing from a package index
    assert "pip uninstall -y pip setuptools wheel" in install  # no build tools left in the image
    users = [arg for ins, arg in runtime if ins == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert runtime.index(("USER", users[-1])) > max(i for i, (ins, _) in enumerate(runtime) if ins == "RUN")
    assert ("ENTRYPOINT", '["gpupool"]') in runtime
    assert any(ins == "HEALTHCHECK" and "/healthz" in arg for ins, arg in runtime)
    assert "[dev]" not in text and not any(
        ins == "COPY" and arg.startswith(". ") for ins, arg in build + runtime
    )


def test_the_build_context_is_only_the_sources() -> None:
    lines = [
        ln
        for ln in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if ln and not ln.startswith("#")
    ]
    assert lines[0] == "*"  # everything out (.venv, .git, tests, state) ...
    assert {"!pyproject.toml", "!README.md", "!src"} <= set(lines)  # ... but what the build stage copies


@pytest.mark.skip(
    reason="no image builder (docker daemon) on these machines; the install steps are tested above"
)
def test_docker_build() -> None:
    subprocess.run(["docker", "build", "-t", "gpupool:test", str(REPO)], check=True, timeout=1800)


# -- upgrades ------------------------------------------------------------------------------------
def _revision(db: Path) -> str:
    import sqlite3

    with sqlite3.connect(db) as c:
        return str(c.execute("select version_num from alembic_version").fetchone()[0])


def test_a_store_of_the_previous_schema_migrates_with_the_wheels_migrations(
    installed: Path, tmp_path: Path
) -> None:
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from gpupool.store import Store

    db = tmp_path / "old.db"
    Store.open(f"sqlite:///{db}").close()
    head = _revision(db)
    cfg = Config()
    cfg.set_main_option("script_location", str(REPO / "src" / "gpupool" / "migrations"))
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    with sa.create_engine(f"sqlite:///{db}").begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "-1")  # the store as the release before this one left it
    assert _revision(db) != head
    code = f"from gpupool.store import Store; Store.open('sqlite:///{db}').close()"
    out = _run(installed / "python", "-c", code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert _revision(db) == head


def test_serve_refuses_a_store_from_a_newer_release(installed: Path, tmp_path: Path) -> None:
    import sqlite3

    from gpupool.store import Store

    db = tmp_path / "new.db"
    Store.open(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as c:
        c.execute("update alembic_version set version_num = '9999_from_the_future'")
    port = str(_free_port())
    out = _run(
        installed / "gpupool",
        "serve",
        "--database-url",
        f"sqlite:///{db}",
        "--port",
        port,
        "--state-dir",
        tmp_path / "s",
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "9999_from_the_future" in out.stdout + out.stderr
    assert _revision(db) == "9999_from_the_future"  # left as it was
