"""kube-scheduler and Kueue's manager beside the real local control plane (issue 24), so
gpupool can be compared with the system users compare it with, on the same kind of cluster.

Why Kueue runs as a host process and how its webhook is reached: in a cluster Kueue is a
Deployment behind a Service, and the API server calls its webhooks through that Service. Here
nothing runs pods for real (the node agent only simulates them) and there is no kube-proxy or
cluster DNS, so the manager runs as a process on 127.0.0.1 and its webhooks are registered with
a URL client config (``https://127.0.0.1:<port>/<path>``) and the CA bundle of a certificate
signed by the control plane's CA. Kueue's internal certificate management (which writes a
Secret for the Service's DNS name and injects the CA) is switched off in its Configuration.

Kueue v0.17 then reads its metrics serving certificate from the fixed path
``/etc/kueue/metrics/certs`` and exits when it is missing. Rather than write into the machine's
``/etc``, the manager runs in a private mount namespace (``unshare --mount``) where ``/etc`` is an
overlay whose upper layer is in the control plane's temporary directory; nothing outside it is
changed.

What is installed, all read at run time from Kueue's module source (``config/components``; no
copy is kept here): its CRDs, its namespace, the manager's ClusterRole and secrets Role with
their bindings to the service account the manager authenticates as (a static token), and the
webhooks of the Kueue API group and of ``batch`` Jobs, the only integration switched on (the
Pod, Deployment and StatefulSet webhooks would refuse every pod while that integration is off).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpupool.kube.realcluster import (
    KUEUE_NAMESPACE,
    KUEUE_USER,
    MissingBinaries,
    RealClusterError,
    RealControlPlane,
    _get,
    _write_private_key,
    free_port,
)

KUEUE_VERSION = "v0.17.0"
KUEUE_API = "kueue.x-k8s.io"
# The API groups whose webhooks the manager serves with only the batch/job integration on.
WEBHOOK_GROUPS = frozenset({KUEUE_API, "batch"})
_PREFIX = "kueue-"


def kueue_components(version: str = KUEUE_VERSION) -> Path:
    """Kueue's ``config/components`` in the Go module cache (``$GOMODCACHE``, else
    ``$GOPATH/pkg/mod``, else ``~/go/pkg/mod``), which ``make kube-bin`` downloads."""
    cache = os.environ.get("GOMODCACHE") or str(
        Path(os.environ.get("GOPATH") or Path.home() / "go") / "pkg/mod"
    )
    path = Path(cache) / f"sigs.k8s.io/kueue@{version}" / "config" / "components"
    if not (path / "crd" / "bases").is_dir():
        raise RealClusterError(f"Kueue {version}'s config not found at {path} (run `make kube-bin`)")
    return path


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _leaf_certificate(pki: Path, out: Path) -> None:
    """``tls.crt``/``tls.key`` for 127.0.0.1 signed by the control plane's CA."""
    ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise RealClusterError("the control plane's CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue-webhook")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(out / "tls.key", key)


def _admin(cp: RealControlPlane) -> httpx.Client:
    return httpx.Client(
        base_url=cp.server,
        verify=ssl.create_default_context(cafile=str(cp.ca_file)),
        headers={"Authorization": f"Bearer {cp.admin_token}"},
        timeout=60,
    )


_PATHS = {
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "Namespace": "/api/v1/namespaces",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}


def create_all(http: httpx.Client, objs: Iterable[dict[str, Any]]) -> None:
    """Create each object (an existing one is left as it is); a refusal names the object."""
    for obj in objs:
        kind, md = obj["kind"], obj["metadata"]
        if kind in _PATHS:
            url = _PATHS[kind]
        else:
            group = "/apis/rbac.authorization.k8s.io/v1" if kind in ("Role", "RoleBinding") else "/api/v1"
            plural = {"Role": "roles", "RoleBinding": "rolebindings", "ServiceAccount": "serviceaccounts"}[
                kind
            ]
            url = f"{group}/namespaces/{md['namespace']}/{plural}"
        r = http.post(url, json=obj)
        if r.status_code not in (200, 201, 409):
            raise RealClusterError(f"creating {kind} {md['name']}: {r.status_code} {r.text[:400]}")


def _rbac(components: Path) -> list[dict[str, Any]]:
    """The manager's namespace, service account, roles and bindings, named as Kueue's default
    kustomization names them (``kueue-`` prefix, namespace ``kueue-system``)."""
    rbac = components / "rbac"
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}
    ]
    for name in ("service_account.yaml", "role.yaml", "role_binding.yaml", "manager_secrets_role.yaml"):
        objs += _docs(rbac / name)
    sa = KUEUE_USER.rsplit(":", 1)[1]
    for obj in objs[1:]:
        md = obj["metadata"]
        md["name"] = _PREFIX + md["name"]
        if "namespace" in md:
            md["namespace"] = KUEUE_NAMESPACE
        if "roleRef" in obj:
            obj["roleRef"]["name"] = _PREFIX + obj["roleRef"]["name"]
            obj["subjects"] = [{"kind": "ServiceAccount", "name": sa, "namespace": KUEUE_NAMESPACE}]
    objs.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "kueue-manager-secrets-rolebinding", "namespace": KUEUE_NAMESPACE},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "kueue-manager-secrets-role",
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": KUEUE_NAMESPACE}],
        }
    )
    return objs


def webhook_configs(components: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations with each client config a URL on 127.0.0.1:``port`` and
    ``ca_pem`` as its bundle; only the webhooks of ``WEBHOOK_GROUPS`` are kept."""
    bundle = base64.b64encode(ca_pem).decode()
    out = []
    for doc in _docs(components / "webhook" / "manifests.yaml"):
        hooks = []
        for hook in doc.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups or not groups <= WEBHOOK_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            hooks.append(hook)
        doc["metadata"]["name"] = _PREFIX + doc["metadata"]["name"]
        doc["webhooks"] = hooks
        out.append(doc)
    return out


def _wait_established(http: httpx.Client, names: list[str], deadline: float) -> None:
    for name in names:
        while True:
            r = http.get(f"{_PATHS['CustomResourceDefinition']}/{name}")
            conds = (r.json().get("status") or {}).get("conditions") or [] if r.status_code == 200 else []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise RealClusterError(f"CRD {name} not Established")
            time.sleep(0.2)


def _need(cp: RealControlPlane, name: str) -> None:
    if not os.access(cp.binaries.path(name), os.X_OK):
        raise MissingBinaries(f"no {name} in {cp.binaries.directory} (run `make kube-bin`)")


def start_scheduler(cp: RealControlPlane, deadline: float) -> None:
    """kube-scheduler as ``system:kube-scheduler`` (the bootstrap RBAC roles bind it)."""
    _need(cp, "kube-scheduler")
    kubeconfig = cp._dir() / "scheduler.kubeconfig"
    cp._write_kubeconfig(kubeconfig, "system:kube-scheduler", cp.tokens["system:kube-scheduler"])
    port = free_port()
    proc = cp._spawn(
        "kube-scheduler",
        [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={cp._dir() / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
        ],
    )
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE
    cp._wait(proc, "/healthz", lambda: _get(f"https://127.0.0.1:{port}/healthz", insecure) == b"ok", deadline)


def _kueue_config(
    workdir: Path, webhook_port: int, health_port: int, metrics_port: int, extra: dict[str, Any] | None = None
) -> Path:
    """The manager's Configuration; ``extra`` (the control plane's ``kueue_config``) is merged
    over it at the top level, so a bench can switch on e.g. ``waitForPodsReady``."""
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(workdir / "webhook-certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        # Kueue's default client rate (its config/components/manager) is kept.
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job"]},
    }
    config.update(extra or {})
    path = workdir / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_kueue(cp: RealControlPlane, deadline: float, overrides: Mapping[str, Any] | None = None) -> None:
    """Install Kueue's CRDs, RBAC and webhooks, then run its manager until ``/readyz`` answers
    (the webhook server is listening by then)."""
    _need(cp, "kueue")
    components = kueue_components()
    workdir = cp._dir() / "kueue"
    overlay = workdir / "etc-overlay"
    for d in (overlay / "upper", overlay / "work"):
        d.mkdir(parents=True)
    _leaf_certificate(cp._dir() / "pki", workdir / "webhook-certs")
    webhook_port, health_port, metrics_port = free_port(), free_port(), free_port()
    with _admin(cp) as http:
        crds = [d for f in sorted((components / "crd" / "bases").glob("*.yaml")) for d in _docs(f)]
        create_all(http, crds)
        _wait_established(http, [c["metadata"]["name"] for c in crds], deadline)
        create_all(http, _rbac(components))
        create_all(http, webhook_configs(components, webhook_port, cp.ca_file.read_bytes()))
    kubeconfig = workdir / "kueue.kubeconfig"
    cp._write_kubeconfig(kubeconfig, KUEUE_USER, cp.tokens[KUEUE_USER])
    config = _kueue_config(workdir, webhook_port, health_port, metrics_port, dict(overrides or {}))
    mount = (
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={overlay / 'upper'},workdir={overlay / 'work'} /etc"
        f" && mkdir -p /etc/kueue/metrics && ln -s {workdir / 'webhook-certs'} /etc/kueue/metrics/certs"
        ' && exec "$0" "$@"'
    )
    proc = cp._spawn(
        "kueue",
        [
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--visibility-server-port={free_port()}",
            # The on-demand visibility API needs an APIService routed to the manager; unused here.
            "--feature-gates=VisibilityOnDemand=false",
            "--zap-log-level=2",
        ],
        prefix=("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount),
    )
    cp._wait(proc, "/readyz", lambda: _get(f"http://127.0.0.1:{health_port}/readyz") == b"ok", deadline)


@dataclass(frozen=True)
class SchedulerAddon:
    """kube-scheduler as a ``RealControlPlane`` addon."""

    name: str = "kube-scheduler"

    def start(self, cp: RealControlPlane, deadline: float) -> None:
        start_scheduler(cp, deadline)


@dataclass(frozen=True)
class KueueAddon:
    """Kueue's manager as a ``RealControlPlane`` addon; ``config`` is merged over its
    Configuration (e.g. ``waitForPodsReady`` for a gang bench)."""

    config: Mapping[str, Any] = field(default_factory=dict)
    name: str = "kueue"

    def start(self, cp: RealControlPlane, deadline: float) -> None:
        start_kueue(cp, deadline, self.config)


def addons(
    scheduler: bool, kueue: bool, kueue_config: Mapping[str, Any] | None = None
) -> tuple[SchedulerAddon | KueueAddon, ...]:
    """What to start beside the control plane: Kueue needs kube-scheduler to bind what it admits."""
    out: list[SchedulerAddon | KueueAddon] = []
    if scheduler or kueue:
        out.append(SchedulerAddon())
    if kueue:
        out.append(KueueAddon(dict(kueue_config or {})))
    return tuple(out)
