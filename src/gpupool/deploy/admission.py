"""The webhook configurations and the certificate job, at given chart values.

Why these selectors: the mutating webhook sees only what is gpupool's (objects labelled with a
queue, or in a namespace labelled with one), never the release's own namespace, so a webhook
that is down or not yet trusted (``failurePolicy: Fail``) cannot block unrelated pods, nor the
pods that would bring it back.
"""

from __future__ import annotations

from typing import Any

from gpupool.deploy.objects import WEBHOOK_SECRET, WEBHOOK_SERVICE, labels, meta, pod_security
from gpupool.deploy.rbac import certgen_rules, certgen_secret_rules
from gpupool.deploy.values import RELEASE
from gpupool.manifests import KUEUE_QUEUE_LABEL
from gpupool.manifests.mutate import QUEUE_LABEL

ADMISSION = "admissionregistration.k8s.io/v1"
CERTGEN = f"{RELEASE}-certgen"
MUTATE_RULES = [
    {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "resources": ["jobs"], "operations": ["CREATE"]},
    {
        "apiGroups": ["jobset.x-k8s.io"],
        "apiVersions": ["*"],
        "resources": ["jobsets"],
        "operations": ["CREATE"],
    },
    {
        "apiGroups": ["kubeflow.org"],
        "apiVersions": ["*"],
        "resources": ["pytorchjobs"],
        "operations": ["CREATE"],
    },
]
VALIDATE_RULES = [
    {
        "apiGroups": ["gpupool.io"],
        "apiVersions": ["v1alpha1"],
        "resources": ["resourcepools", "queues", "workloads"],
        "operations": ["CREATE", "UPDATE"],
    }
]


def _not_release(ns: str) -> dict[str, Any]:
    return {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [ns]}


def _hook(name: str, path: str, v: dict[str, Any], ns: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    w = v["webhook"]
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"service": {"name": WEBHOOK_SERVICE, "namespace": ns, "path": path, "port": 443}},
        "rules": rules,
        "failurePolicy": w["failurePolicy"],
        "sideEffects": "None",
        "timeoutSeconds": w["timeoutSeconds"],
        "namespaceSelector": {"matchExpressions": [_not_release(ns)]},
    }


def _by_label(hook: dict[str, Any], label: str) -> dict[str, Any]:
    return {**hook, "objectSelector": {"matchExpressions": [{"key": label, "operator": "Exists"}]}}


def mutating(v: dict[str, Any], ns: str) -> dict[str, Any]:
    """Labelled objects (gpupool's label, Kueue's when enabled), and every object of a bound namespace."""
    hooks = [
        _by_label(
            _hook("queue-label.mutate.gpupool.io", "/webhooks/mutate", v, ns, MUTATE_RULES), QUEUE_LABEL
        )
    ]
    if v["webhook"]["kueueQueueLabel"]:
        hooks.append(
            _by_label(
                _hook("kueue-label.mutate.gpupool.io", "/webhooks/mutate", v, ns, MUTATE_RULES),
                KUEUE_QUEUE_LABEL,
            )
        )
    bound = _hook("namespace.mutate.gpupool.io", "/webhooks/mutate/namespace", v, ns, MUTATE_RULES)
    bound["namespaceSelector"] = {
        "matchExpressions": [_not_release(ns), {"key": QUEUE_LABEL, "operator": "Exists"}]
    }
    hooks.append(bound)
    return {
        "apiVersion": ADMISSION,
        "kind": "MutatingWebhookConfiguration",
        "metadata": _webhook_meta(v, ns),
        "webhooks": hooks,
    }


def validating(v: dict[str, Any], ns: str) -> dict[str, Any]:
    hook = _hook("validate.gpupool.io", "/webhooks/validate", v, ns, VALIDATE_RULES)
    hook["namespaceSelector"] = {}  # ResourcePool and Queue are cluster-scoped: no namespace to select
    # Ignore by default: the chart's example pool and queue are created before the webhook has
    # a certificate; the CRD schema still checks every field's shape, the webhook the rest
    hook["failurePolicy"] = v["webhook"]["validationFailurePolicy"]
    return {
        "apiVersion": ADMISSION,
        "kind": "ValidatingWebhookConfiguration",
        "metadata": _webhook_meta(v, ns),
        "webhooks": [hook],
    }


def _webhook_meta(v: dict[str, Any], ns: str) -> dict[str, Any]:
    m = meta(RELEASE, None, "webhook")
    if v["certManager"]["enabled"]:
        m["annotations"] = {"cert-manager.io/inject-ca-from": f"{ns}/{WEBHOOK_SECRET}"}
    return m


def certgen_objects(v: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    """The certificate job and its account (none with cert-manager, which issues the certificate)."""
    if v["certManager"]["enabled"]:
        return []
    cluster_rules = [r.as_dict() for r in certgen_rules(RELEASE)]
    ns_rules = [r.as_dict() for r in certgen_secret_rules(WEBHOOK_SECRET)]
    subject = [{"kind": "ServiceAccount", "name": CERTGEN, "namespace": ns}]
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(CERTGEN, ns, "certgen")},
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": meta(CERTGEN, None, "certgen"),
            "rules": cluster_rules,
        },
        _binding("ClusterRoleBinding", "ClusterRole", CERTGEN, None, subject),
        {"apiVersion": rbac, "kind": "Role", "metadata": meta(CERTGEN, ns, "certgen"), "rules": ns_rules},
        _binding("RoleBinding", "Role", CERTGEN, ns, subject),
        certgen_job(v, ns),
    ]


def _binding(
    kind: str, role_kind: str, name: str, ns: str | None, subjects: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta(name, ns, None),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": subjects,
    }


def certgen_job(v: dict[str, Any], ns: str) -> dict[str, Any]:
    """``gpupool deploy certs`` once: the Secret and the CA bundle (a Helm hook in the chart)."""
    args = [
        "deploy",
        "certs",
        "--namespace",
        ns,
        "--service",
        WEBHOOK_SERVICE,
        "--secret",
        WEBHOOK_SECRET,
        "--webhook",
        RELEASE,
    ]
    container = {
        "name": "certgen",
        "image": f"{v['image']['repository']}:{v['image']['tag']}",
        "imagePullPolicy": v["image"]["pullPolicy"],
        "args": args,
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod = {
        "serviceAccountName": CERTGEN,
        "restartPolicy": "OnFailure",
        "securityContext": pod_security(),
        "containers": [container],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(CERTGEN, ns, "certgen"),
        "spec": {"backoffLimit": 6, "template": {"metadata": {"labels": labels("certgen")}, "spec": pod}},
    }


def cert_manager_objects(v: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    """A self-signed Issuer and the serving Certificate, when cert-manager issues it."""
    if not v["certManager"]["enabled"]:
        return []
    issuer = {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": meta(f"{RELEASE}-selfsigned", ns),
        "spec": {"selfSigned": {}},
    }
    dns = [f"{WEBHOOK_SERVICE}.{ns}.svc", f"{WEBHOOK_SERVICE}.{ns}.svc.cluster.local"]
    cert = {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": meta(WEBHOOK_SECRET, ns),
        "spec": {
            "secretName": WEBHOOK_SECRET,
            "dnsNames": dns,
            "issuerRef": {"name": f"{RELEASE}-selfsigned", "kind": "Issuer"},
        },
    }
    return [issuer, cert]
