"""A real local Kubernetes control plane: etcd, kube-apiserver and kube-controller-manager
started as processes from the binaries ``make kube-bin`` builds (issue 24).

Why: every Kubernetes claim gpupool makes was checked only against its own fake API server.
This starts the upstream components with the settings a cluster has (RBAC and Node
authorization, the default admission plugins, service-account tokens, the controllers), so
tests can meet real validation, defaulting, RBAC and the Job controller.

Shape, and why:

- Everything lives in one temporary directory (etcd data, keys, certificates, logs, the
  kubeconfig) and is removed on ``stop()``; nothing is written to the user's kubeconfig.
- Every listener is on 127.0.0.1 at a port the kernel picked free, so parallel test workers
  and other agents on the machine do not collide.
- The processes run in their own sessions and are stopped by their own ids (SIGTERM, then
  SIGKILL after a grace period), so a stop leaves no process behind and touches no other.
- Waits have generous deadlines (the machines are shared and loaded) and fail with the tail
  of the component's log, so a start that cannot succeed says why.
- Authentication is a static token file (an admin in ``system:masters``, and the controller
  manager as ``system:kube-controller-manager``, the identity its RBAC roles are bound to);
  the serving certificate is signed by a CA generated here, which is also the root CA the
  controller manager publishes to pods.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

# The version tools/kube/go.mod pins (a test checks the two agree); the binaries are looked up
# under this name in the caches.
KUBERNETES_VERSION = "v1.36.3"

BINARY_NAMES = ("etcd", "kube-apiserver", "kube-controller-manager")

# The service network; its first address is the `kubernetes` Service's ClusterIP, which the
# serving certificate names so in-cluster clients could verify it.
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"

# Identities of the optional components: kube-scheduler under the user its bootstrap RBAC role
# binding names, Kueue's manager as the service account its own ClusterRoleBinding names.
KUEUE_NAMESPACE = "kueue-system"
KUEUE_USER = f"system:serviceaccount:{KUEUE_NAMESPACE}:kueue-controller-manager"
EXTRA_USERS = (
    ("system:kube-scheduler", ""),
    (KUEUE_USER, f"system:serviceaccounts,system:serviceaccounts:{KUEUE_NAMESPACE}"),
)


class RealClusterError(RuntimeError):
    """The control plane could not be started (the message names the component and why)."""


class MissingBinaries(RealClusterError):
    """The binaries are not built: the message says where they were looked for."""


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of the control-plane executables (all from one directory)."""

    directory: Path

    def path(self, name: str) -> Path:
        """The executable ``name`` in this directory."""
        return self.directory / name


def _repo_root() -> Path | None:
    """The source checkout this module runs from (editable install), if it is one: its
    ``.cache/kube`` is where ``make kube-bin`` puts the binaries."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "tools" / "kube" / "go.mod").is_file() else None


def binary_dirs(version: str = KUBERNETES_VERSION) -> list[Path]:
    """Where the binaries are looked for, in order: ``$GPUPOOL_KUBE_BIN_DIR`` (one directory,
    taken as given), the checkout's ``.cache/kube/<version>``, then the machine-wide cache
    ``$GPUPOOL_KUBE_BIN_CACHE/<version>`` (default ``~/.cache/gpupool/kube``) that
    ``make kube-bin`` fills so a fresh clone reuses them."""
    explicit = os.environ.get("GPUPOOL_KUBE_BIN_DIR")
    if explicit:
        return [Path(explicit)]
    dirs = []
    root = _repo_root()
    if root is not None:
        dirs.append(root / ".cache" / "kube" / version)
    shared = os.environ.get("GPUPOOL_KUBE_BIN_CACHE") or str(Path.home() / ".cache" / "gpupool" / "kube")
    dirs.append(Path(shared) / version)
    return dirs


def find_binaries(version: str = KUBERNETES_VERSION) -> KubeBinaries:
    """The first directory holding every control-plane executable; ``MissingBinaries`` names
    the directories tried and what each lacked."""
    tried = []
    for directory in binary_dirs(version):
        missing = [n for n in BINARY_NAMES if not os.access(directory / n, os.X_OK)]
        if not missing:
            return KubeBinaries(directory)
        tried.append(f"{directory} (no {', '.join(missing)})")
    raise MissingBinaries(
        f"Kubernetes {version} binaries not built (run `make kube-bin`); looked in: " + "; ".join(tried)
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the kernel's pick; a race with another process
    binding it before the component does is possible but rare, and then the start fails with
    the component's "address in use" in the error)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_private_key(path: Path, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def write_certificates(directory: Path) -> None:
    """Write a CA (``ca.crt``/``ca.key``), the apiserver's serving certificate signed by it
    (``serving.crt``/``serving.key``, valid for 127.0.0.1, localhost and the in-cluster names)
    and the service-account signing key pair (``sa.key``/``sa.pub``).

    Why a CA rather than one self-signed leaf: clients verify the server against ``ca.crt``,
    and the same CA is the controller manager's ``--root-ca-file`` (the ``kube-root-ca.crt``
    ConfigMap pods get), as in a cluster. EC P-256 keys keep generation fast on a loaded
    machine; the service-account key is RSA, the algorithm every token consumer accepts."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupool-local-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    serving_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName(n)
        for n in (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    ]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", KUBERNETES_SERVICE_IP)]
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(directory / "ca.key", ca_key)
    (directory / "serving.crt").write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(directory / "serving.key", serving_key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


class Addon(Protocol):
    """A component started after the controller manager, once the API answers."""

    @property
    def name(self) -> str: ...

    def start(self, cp: RealControlPlane, deadline: float) -> None: ...


class RealControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on loopback, for tests and local runs.

    Use as a context manager (``with RealControlPlane() as cp: ... cp.kubeconfig``) or call
    ``start()``/``stop()``; ``stop()`` is idempotent and also runs when ``start()`` fails.
    ``controllers`` is passed to the controller manager's ``--controllers`` (``*``: all that
    need no cloud provider)."""

    def __init__(
        self,
        binaries: KubeBinaries | None = None,
        *,
        controllers: str = "*",
        start_timeout: float = 240.0,
        stop_timeout: float = 20.0,
        addons: Sequence[Addon] = (),
    ) -> None:
        self.binaries = binaries or find_binaries()
        self.controllers = controllers
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.workdir: Path | None = None
        self.admin_token = secrets.token_hex(24)
        self._kcm_token = secrets.token_hex(24)
        self.server = ""
        self._components: list[_Component] = []
        # components started after the controller manager, in order (kube-scheduler and Kueue's
        # manager: ``gpupool.kube.kueue_local.addons``); each gets a token of its own in the
        # token file. Passed in, so this module needs none of them.
        self.addons = tuple(addons)
        self.tokens = {user: secrets.token_hex(24) for user, _ in EXTRA_USERS}

    @property
    def scheduler(self) -> bool:
        """Does a kube-scheduler run beside it?"""
        return any(a.name == "kube-scheduler" for a in self.addons)

    @property
    def kueue(self) -> bool:
        """Does Kueue's manager run beside it?"""
        return any(a.name == "kueue" for a in self.addons)

    # -- paths --------------------------------------------------------------------------------

    def _dir(self) -> Path:
        if self.workdir is None:
            raise RealClusterError("control plane not started")
        return self.workdir

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``system:masters`` token, CA-verified), written once the
        API server is ready."""
        return self._dir() / "admin.kubeconfig"

    @property
    def processes(self) -> dict[str, int]:
        """The running components' process ids by name (to check a stop left none behind)."""
        return {c.name: c.process.pid for c in self._components}

    @property
    def ca_file(self) -> Path:
        """The CA that signed the API server's serving certificate."""
        return self._dir() / "pki" / "ca.crt"

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> RealControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start etcd, then the API server, then the controller manager, each waited for
        (within ``start_timeout`` in all); on any failure everything started is stopped and
        ``RealClusterError`` carries the failing component's log tail."""
        if self.workdir is not None:
            raise RealClusterError("control plane already started")
        self.workdir = Path(tempfile.mkdtemp(prefix="gpupool-kube-"))
        deadline = time.monotonic() + self.start_timeout
        try:
            pki = self.workdir / "pki"
            pki.mkdir()
            write_certificates(pki)
            etcd_url = self._start_etcd(deadline)
            self._start_apiserver(etcd_url, deadline)
            self._start_controller_manager(deadline)
            for addon in self.addons:
                addon.start(self, deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the components in reverse order (SIGTERM, SIGKILL after ``stop_timeout``),
        then remove the working directory."""
        for component in reversed(self._components):
            self._terminate(component)
        self._components = []
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _terminate(self, component: _Component) -> None:
        proc = component.process
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait(self.stop_timeout)

    # -- components ---------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], prefix: tuple[str, ...] = ()) -> _Component:
        log = self._dir() / f"{name}.log"
        with log.open("wb") as out:
            # Own session: a Ctrl-C in the terminal reaches us, not the components directly, so
            # they are stopped in order; and stop() signals exactly these processes.
            process = subprocess.Popen(
                [*prefix, str(self.binaries.path(name)), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        component = _Component(name, process, log)
        self._components.append(component)
        return component

    def _wait(self, component: _Component, what: str, probe: Callable[[], bool], deadline: float) -> None:
        """Poll ``probe`` until it is true; fail when the process exits or the deadline passes."""
        delay = 0.1
        while True:
            if component.process.poll() is not None:
                raise RealClusterError(
                    f"{component.name} exited with {component.process.returncode} before {what}:\n"
                    + _tail(component.log)
                )
            if probe():
                return
            if time.monotonic() > deadline:
                raise RealClusterError(
                    f"{component.name}: no {what} within {self.start_timeout:.0f} s:\n" + _tail(component.log)
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _start_etcd(self, deadline: float) -> str:
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._spawn(
            "etcd",
            [
                "--name=gpupool",
                f"--data-dir={self._dir() / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=gpupool={peer_url}",
                "--initial-cluster-state=new",
                # A throwaway test store: skipping fsync keeps writes fast on a loaded disk.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            body = _get(f"{client_url}/health")
            return body is not None and json.loads(body).get("health") == "true"

        self._wait(etcd, "health", healthy, deadline)
        return client_url

    def _start_apiserver(self, etcd_url: str, deadline: float) -> None:
        pki = self._dir() / "pki"
        tokens = self._dir() / "tokens.csv"
        # token,user,uid,"groups": the admin, and the controller manager under the user name
        # its bootstrap ClusterRoleBinding (system:kube-controller-manager) names.
        tokens.write_text(
            f'{self.admin_token},admin,admin,"system:masters"\n'
            f"{self._kcm_token},system:kube-controller-manager,kube-controller-manager\n"
            + "".join(
                f"{self.tokens[user]},{user},{user}" + (f',"{groups}"' if groups else "") + "\n"
                for user, groups in EXTRA_USERS
            )
        )
        tokens.chmod(0o600)
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        apiserver = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--advertise-address=127.0.0.1",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={pki / 'serving.crt'}",
                f"--tls-private-key-file={pki / 'serving.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--cert-dir={self._dir() / 'apiserver-certs'}",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        self._wait(
            apiserver,
            "/readyz",
            lambda: _get(f"{self.server}/readyz", context, headers) == b"ok",
            deadline,
        )
        self._write_kubeconfig(self.kubeconfig, "admin", self.admin_token)

    def _start_controller_manager(self, deadline: float) -> None:
        pki = self._dir() / "pki"
        kubeconfig = self._dir() / "controller-manager.kubeconfig"
        self._write_kubeconfig(kubeconfig, "system:kube-controller-manager", self._kcm_token)
        port = free_port()
        kcm = self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kubeconfig}",
                # Delegated authentication/authorization of its own /metrics etc. through the API
                # server; /healthz is always allowed, which is what the start waits on.
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self._dir() / 'controller-manager-certs'}",
                f"--controllers={self.controllers}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                # Each controller acts under its own service account, with its own RBAC role.
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        # Its serving certificate is self-signed in --cert-dir and only a liveness signal is
        # read here, so it is not verified.
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        self._wait(
            kcm,
            "/healthz",
            lambda: _get(f"https://127.0.0.1:{port}/healthz", insecure) == b"ok",
            deadline,
        )

    def _write_kubeconfig(self, path: Path, user: str, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpupool-local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "gpupool-local", "context": {"cluster": "gpupool-local", "user": user}}],
            "current-context": "gpupool-local",
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.chmod(0o600)
        tmp.replace(path)


def _get(
    url: str, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None
) -> bytes | None:
    """The body of a 200 answer, else ``None`` (not listening yet, not ready, TLS not up)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return bytes(response.read()) if response.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None
