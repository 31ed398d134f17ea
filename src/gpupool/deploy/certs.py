"""The webhooks' serving certificate when cert-manager is not used: ``gpupool deploy certs``.

Why gpupool's own image does it: the API server calls webhooks over TLS and trusts only the CA
bundle in the webhook configurations. A job (a Helm hook, or a plain Job with the rendered
manifests) makes a private CA and a serving certificate for the webhook Service, stores them in
a ``kubernetes.io/tls`` Secret the webhook container mounts, and writes the CA into both webhook
configurations. A Secret that still holds a valid certificate for the same names is kept, so an
upgrade does not rotate certificates (nor restart anything) for nothing.
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpupool.kube.client import JSON_PATCH, ApiError, KubeApi, Resource

SECRETS = Resource("", "v1", "secrets", "Secret")
WEBHOOK_CONFIGS = (
    Resource(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
    ),
    Resource(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
    ),
)
VALID_DAYS = 3650
RENEW_BEFORE_DAYS = 30


@dataclass(frozen=True, slots=True)
class Pem:
    """A CA and a serving certificate with its key, PEM-encoded."""

    ca: bytes
    cert: bytes
    key: bytes


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names the API server may use for a Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_certs(names: list[str], now: dt.datetime | None = None) -> Pem:
    """A fresh private CA (P-256) and a serving certificate for ``names`` signed by it."""
    now = now or dt.datetime.now(dt.UTC)
    until = now + dt.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("gpupool-webhook-ca"))
        .issuer_name(_name("gpupool-webhook-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(names[-1]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return Pem(ca.public_bytes(pem), cert.public_bytes(pem), key_pem)


def still_good(secret: dict[str, Any], names: list[str], now: dt.datetime | None = None) -> bool:
    """True when the Secret's certificate covers ``names`` for at least RENEW_BEFORE_DAYS more."""
    now = now or dt.datetime.now(dt.UTC)
    data = secret.get("data") or {}
    try:
        cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        base64.b64decode(data["ca.crt"])
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (KeyError, ValueError, x509.ExtensionNotFound):
        return False
    left = cert.not_valid_after_utc - now
    return set(names) <= set(sans.get_values_for_type(x509.DNSName)) and left > dt.timedelta(
        days=RENEW_BEFORE_DAYS
    )


def secret_object(name: str, namespace: str, pem: Pem) -> dict[str, Any]:
    """The ``kubernetes.io/tls`` Secret the webhook container mounts (plus ``ca.crt``)."""

    def b64(b: bytes) -> str:
        return base64.b64encode(b).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "gpupool"},
        },
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(pem.cert), "tls.key": b64(pem.key), "ca.crt": b64(pem.ca)},
    }


def ensure_secret(api: KubeApi, namespace: str, service: str, secret: str) -> tuple[bool, str]:
    """Make the Secret, or keep it while its certificate is good; (made, CA bundle in base64)."""
    names = service_names(service, namespace)
    try:
        current: dict[str, Any] | None = api.get(SECRETS, namespace, secret)
    except ApiError as exc:
        if exc.code != 404:
            raise
        current = None
    made = current is None or not still_good(current, names)
    if made:
        obj = secret_object(secret, namespace, make_certs(names))
        if current is None:
            current = api.create(SECRETS, namespace, obj)
        else:
            obj["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
            current = api.request("PUT", SECRETS.path(namespace, secret), body=obj)
    return made, _bundle(current, namespace, secret)


def _bundle(secret: dict[str, Any] | None, namespace: str, name: str) -> str:
    bundle = str(((secret or {}).get("data") or {}).get("ca.crt", ""))
    if not bundle:
        raise ValueError(f"Secret {namespace}/{name}: no ca.crt")
    return bundle


def write_ca_bundle(api: KubeApi, webhook: str, bundle: str) -> int:
    """Put ``bundle`` into every webhook of both configurations named ``webhook``; how many."""
    n = 0
    for res in WEBHOOK_CONFIGS:
        cfg = api.get(res, None, webhook)
        ops = [
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
            for i in range(len(cfg.get("webhooks") or []))
        ]
        if ops:
            api.patch(res, None, webhook, ops, content_type=JSON_PATCH)
        n += len(ops)
    return n


def read_bundle(api: KubeApi, namespace: str, secret: str) -> str:
    """The CA bundle of an existing Secret (the chart's post-install step)."""
    return _bundle(api.get(SECRETS, namespace, secret), namespace, secret)
