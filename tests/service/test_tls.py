"""HTTPS (issue 30, "TLS"): ``gpupool serve --tls-cert --tls-key`` serves only HTTPS, every
answer carries HSTS, and the CLI verifies the server against ``--ca-file`` / ``GPUPOOL_CA``,
refusing in one line, naming ``--ca-file``, a certificate it cannot verify.

The certificates are made here (trustme): a CA, and a server certificate it signed for
127.0.0.1.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.deploy.values import NAMESPACE, RELEASE, default_values
from gpupool.service.hsts import HSTS_VALUE
from tests.deploy.test_deploy_failover import CHART, HELM, _helm, _objs, _rendered, _values
from tests.test_service_support import Server, running_app

trustme = pytest.importorskip("trustme")
runner = CliRunner()


class Certs:
    """A CA and a certificate it signed for 127.0.0.1, as PEM files under ``root``."""

    def __init__(self, root: Path) -> None:
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1", "localhost")
        self.ca, self.cert, self.key = root / "ca.pem", root / "tls.crt", root / "tls.key"
        ca.cert_pem.write_to_path(str(self.ca))
        leaf.private_key_pem.write_to_path(str(self.key))
        self.cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
        self.other_ca = root / "other-ca.pem"  # a CA that signed nothing here
        trustme.CA().cert_pem.write_to_path(str(self.other_ca))

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Certs]]:
    root = tmp_path_factory.mktemp("tls")
    certs = Certs(root)
    srv = Server(root / "state", args=["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)])
    srv.scheme, srv.verify = "https", certs.context()
    srv.start(timeout=180.0)  # a loaded 2-core machine
    try:
        yield srv, certs
    finally:
        srv.stop()


def cli(srv: Server, *args: str, **env: str) -> tuple[int, str]:
    base = {"GPUPOOL_SERVER": srv.base, "GPUPOOL_TOKEN": srv.token, "GPUPOOL_CONFIG": "/nonexistent"}
    r = runner.invoke(app, list(args), env={**base, "COLUMNS": "300", **env})
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def test_https_answers_carry_hsts_and_the_banner_says_https(https: tuple[Server, Certs]) -> None:
    srv, _ = https
    with srv.client() as c:
        for path, status in (("/readyz", 200), ("/v1/workloads", 200), ("/v1/nothing-here", 404)):
            r = c.get(path)
            assert r.status_code == status, r.text
            assert r.headers["strict-transport-security"] == HSTS_VALUE.decode(), path
        r = httpx.get(srv.base + "/v1/workloads", verify=srv.verify)  # no token: the 401 too
        assert r.status_code == 401 and "strict-transport-security" in r.headers
    assert f"serving on https://127.0.0.1:{srv.port}" in srv.log.read_text()


def test_plain_http_is_not_served_on_the_tls_port(https: tuple[Server, Certs]) -> None:
    srv, _ = https
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{srv.port}/readyz", timeout=10.0)


def test_the_cli_verifies_with_ca_file_or_gpupool_ca(https: tuple[Server, Certs]) -> None:
    srv, certs = https
    code, out = cli(srv, "--ca-file", str(certs.ca), "get", "workloads")
    assert code == 0, out
    code, out = cli(srv, "get", "queues", GPUPOOL_CA=str(certs.ca))
    assert code == 0, out
    code, out = cli(srv, "--ca-file", str(certs.ca), "wait-ready", "--timeout", "60")
    assert code == 0 and "is ready" in out, out


@pytest.mark.parametrize("ca", [None, "other"], ids=["system-trust", "wrong-ca"])
def test_an_unverifiable_certificate_is_one_line_naming_ca_file(
    https: tuple[Server, Certs], ca: str | None
) -> None:
    srv, certs = https
    args = ["--ca-file", str(certs.other_ca)] if ca else []
    code, out = cli(srv, *args, "get", "workloads")
    assert code == 1, out  # as for a server it cannot reach
    assert f"cannot verify the TLS certificate of {srv.base}" in out and "--ca-file" in out, out
    assert len(out.strip().splitlines()) == 1, out


def test_a_missing_ca_file_is_named(https: tuple[Server, Certs], tmp_path: Path) -> None:
    srv, _ = https
    code, out = cli(srv, "--ca-file", str(tmp_path / "nope.pem"), "get", "workloads")
    assert code == 2 and "--ca-file" in out and "no such file" in out, out


def test_hsts_only_over_https(tmp_path: Path) -> None:
    """RFC 6797: the header counts only over a secure connection, so plain HTTP never sends it."""
    with running_app(tmp_path) as api:
        assert "strict-transport-security" not in api.c.get("/readyz").headers
        r = api.c.get("https://testserver/readyz")
        assert r.headers["strict-transport-security"] == HSTS_VALUE.decode()


def test_serve_refuses_half_a_tls_pair_or_a_wrong_key_naming_the_flag(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    other_key = tmp_path / "other.key"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    state = ["--state-dir", str(tmp_path / "state"), "--port", "1"]
    cases = [
        (["--tls-cert", str(certs.cert)], "--tls-cert needs --tls-key"),
        (["--tls-key", str(certs.key)], "--tls-key needs --tls-cert"),
        (["--tls-cert", str(tmp_path / "nope.crt"), "--tls-key", str(certs.key)], "--tls-cert"),
        (["--tls-cert", str(certs.cert), "--tls-key", str(other_key)], "not a PEM certificate and its key"),
    ]
    for args, words in cases:
        r = runner.invoke(app, ["serve", *state, *args], env={"COLUMNS": "300"})
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, (args, r.output)
    assert not (tmp_path / "state" / "gpupool.db").exists()  # refused before anything started


# -- the chart and manifests: tls.secretName ------------------------------------------------------
def _scheduler_pod(v: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    dep = _objs(v)[("Deployment", RELEASE)]
    pod = dep["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "scheduler")


def test_the_manifests_mount_the_secret_and_pass_the_flags() -> None:
    pod, c = _scheduler_pod(_values(**{"tls.secretName": "gpupool-api-tls"}))
    args = c["args"]
    assert args[args.index("--tls-cert") + 1] == "/etc/gpupool/api-tls/tls.crt"
    assert args[args.index("--tls-key") + 1] == "/etc/gpupool/api-tls/tls.key"
    assert args[args.index("--advertise-url") + 1] == "https://$(POD_IP):8080"
    assert c["livenessProbe"]["httpGet"]["scheme"] == c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert {"name": "api-tls", "mountPath": "/etc/gpupool/api-tls", "readOnly": True} in c["volumeMounts"]
    assert {"name": "api-tls", "secret": {"secretName": "gpupool-api-tls"}} in pod["volumes"]
    pod, c = _scheduler_pod(default_values())  # by default: HTTP, nothing mounted
    assert "--tls-cert" not in c["args"] and c["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert all(vol["name"] != "api-tls" for vol in pod["volumes"])


@HELM
def test_helm_renders_the_tls_deployment_the_generator_does() -> None:
    v = _values(**{"tls.secretName": "gpupool-api-tls"})
    rendered = _rendered(_helm("tls.secretName=gpupool-api-tls"))
    assert rendered[("Deployment", RELEASE)] == _objs(v)[("Deployment", RELEASE)]


@HELM
def test_helm_servicemonitor_scrapes_https_verified_with_the_secrets_ca() -> None:
    cmd = ["helm", "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    cmd += ["--api-versions", "monitoring.coreos.com/v1", "--set", "tls.secretName=gpupool-api-tls"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    endpoint = _rendered(out)[("ServiceMonitor", RELEASE)]["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "serverName": f"{RELEASE}.{NAMESPACE}.svc",
        "ca": {"secret": {"name": "gpupool-api-tls", "key": "ca.crt"}},
    }
