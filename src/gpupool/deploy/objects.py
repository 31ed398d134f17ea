"""The scheduler's workload objects at given chart values: Deployment, Services, PDB, webhooks, cert job.

Why they mirror ``charts/gpupool/templates`` one function per template: the plain manifests
under ``deploy/manifests`` are these objects at the default values, and a reader comparing a
template with its function should find the same fields in the same order.
"""

from __future__ import annotations

from typing import Any

from gpupool.deploy.values import RELEASE

WEBHOOK_SECRET = f"{RELEASE}-webhook-tls"
WEBHOOK_SERVICE = f"{RELEASE}-webhook"
STATE_DIR = "/var/lib/gpupool"
CONFIG_DIR = "/etc/gpupool/config"
TLS_DIR = "/etc/gpupool/tls"
UID = 10001


def labels(component: str | None = None) -> dict[str, str]:
    """The labels every object carries (and a component's, for its pods and Services)."""
    out = {
        "app.kubernetes.io/name": "gpupool",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/part-of": "gpupool",
    }
    return {**out, "app.kubernetes.io/component": component} if component else out


def selector(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gpupool",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": component,
    }


def meta(name: str, namespace: str | None, component: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if namespace is not None:
        out["namespace"] = namespace
    out["labels"] = labels(component)
    return out


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security() -> dict[str, Any]:
    """Non-root (the image's user), RuntimeDefault seccomp; the volumes are group-writable."""
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _image(v: dict[str, Any]) -> str:
    return f"{v['image']['repository']}:{v['image']['tag']}"


def _probe(path: str, port: str, scheme: str = "HTTP", period: int = 10) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port, "scheme": scheme},
        "periodSeconds": period,
        "timeoutSeconds": 3,
    }


def scheduler_args(v: dict[str, Any]) -> list[str]:
    """``gpupool serve`` on the Kubernetes backend; the Lease is in the pod's own namespace."""
    s = v["scheduler"]
    args = ["serve", "--backend", "kubernetes", "--host", "0.0.0.0", "--port", "8080"]
    args += ["--state-dir", STATE_DIR, "--config", CONFIG_DIR, "--advertise-url", "http://$(POD_IP):8080"]
    args += ["--log-level", s["logLevel"]]
    if v["metrics"]["public"]:
        args.append("--metrics-public")
    return args + list(s["extraArgs"])


def _env(v: dict[str, Any]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    db = v["database"]
    if db["existingSecret"]:
        env.append(
            {
                "name": "GPUPOOL_DATABASE_URL",
                "valueFrom": {"secretKeyRef": {"name": db["existingSecret"], "key": "url"}},
            }
        )
    elif db["url"]:
        env.append({"name": "GPUPOOL_DATABASE_URL", "value": db["url"]})
    return env


def scheduler_container(v: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "scheduler",
        "image": _image(v),
        "imagePullPolicy": v["image"]["pullPolicy"],
        "args": scheduler_args(v),
        "env": _env(v),
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", "http", period=20),
        "readinessProbe": _probe("/readyz", "http"),
        "resources": v["scheduler"]["resources"],
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "state", "mountPath": STATE_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
    }


def webhook_container(v: dict[str, Any]) -> dict[str, Any]:
    port = v["webhook"]["port"]
    args = ["deploy", "webhook-server", "--port", str(port)]
    args += ["--tls-cert-file", f"{TLS_DIR}/tls.crt", "--tls-key-file", f"{TLS_DIR}/tls.key"]
    return {
        "name": "webhook",
        "image": _image(v),
        "imagePullPolicy": v["image"]["pullPolicy"],
        "args": args,
        "ports": [{"name": "webhook", "containerPort": port, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", "webhook", "HTTPS", period=20),
        "readinessProbe": _probe("/healthz", "webhook", "HTTPS"),
        "resources": v["webhook"]["resources"],
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "tls", "mountPath": TLS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def deployment(v: dict[str, Any], ns: str) -> dict[str, Any]:
    """Two replicas (one leads, by Lease), spread over nodes; both serve the webhooks."""
    spread = {
        "weight": 100,
        "podAffinityTerm": {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": selector("scheduler")},
        },
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": RELEASE,
        "securityContext": pod_security(),
        "containers": [scheduler_container(v), webhook_container(v)],
        "volumes": [
            {"name": "state", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "config", "configMap": {"name": f"{RELEASE}-config"}},
            {"name": "tls", "secret": {"secretName": WEBHOOK_SECRET}},
        ],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [spread]}},
        "nodeSelector": v["nodeSelector"],
        "tolerations": v["tolerations"],
    }
    if v["imagePullSecrets"]:
        pod_spec["imagePullSecrets"] = v["imagePullSecrets"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(RELEASE, ns, "scheduler"),
        "spec": {
            "replicas": v["replicaCount"],
            "selector": {"matchLabels": selector("scheduler")},
            "template": {"metadata": {"labels": labels("scheduler")}, "spec": pod_spec},
        },
    }


def services(v: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    """The API (and /metrics) Service, and the webhook Service the API server calls."""
    api = {
        "type": "ClusterIP",
        "selector": selector("scheduler"),
        "ports": [{"name": "http", "port": 8080, "targetPort": "http"}],
    }
    hook = {
        "type": "ClusterIP",
        "selector": selector("scheduler"),
        "ports": [{"name": "webhook", "port": 443, "targetPort": "webhook"}],
    }
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": meta(RELEASE, ns, "scheduler"), "spec": api},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(WEBHOOK_SERVICE, ns, "webhook"),
            "spec": hook,
        },
    ]


def disruption_budget(ns: str) -> dict[str, Any]:
    """A drain keeps one replica: the webhooks must answer while pods are created."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(RELEASE, ns, "scheduler"),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": selector("scheduler")}},
    }
