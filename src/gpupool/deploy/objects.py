"""The scheduler's workload objects at given chart values: Deployment, Services, PDB, state volume.

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
#: the API's own certificate and key (tls.secretName), when it serves HTTPS
API_TLS_DIR = "/etc/gpupool/api-tls"
UID = 10001
#: the bundled PostgreSQL's StatefulSet, Service and Secret (gpupool.deploy.database)
POSTGRES = f"{RELEASE}-postgresql"
#: the chart's PersistentVolumeClaim for the SQLite store (persistence.*)
STATE_CLAIM = f"{RELEASE}-state"
#: the chart refuses these values at render time with the same words (templates/_helpers.tpl)
REPLICAS_NEED_A_SHARED_DATABASE = (
    "replicaCount {n} needs a database the replicas share: set database.url, database.existingSecret"
    " or database.bundled.enabled=true (each replica's own SQLite store would start a failover from"
    " empty), or set replicaCount 1"
)
BUNDLED_AND_URL = (
    "database.bundled.enabled=true with database.url or database.existingSecret: use one database"
)


def shared_database(v: dict[str, Any]) -> bool:
    """Whether the replicas share a database (PostgreSQL), rather than each its SQLite file."""
    db = v["database"]
    return bool(db["url"] or db["existingSecret"] or db["bundled"]["enabled"])


def state_claim(v: dict[str, Any]) -> str | None:
    """The PersistentVolumeClaim under the state directory, or None for an emptyDir: a claim only
    holds the SQLite store, so there is none with a shared database (the state dir then keeps only
    the first start's token file)."""
    p = v["persistence"]
    if shared_database(v) or not p["enabled"]:
        return None
    return str(p["existingClaim"]) or STATE_CLAIM


def values_problem(v: dict[str, Any]) -> str | None:
    """Why the chart refuses these values, or None (the chart ``fail``s with the same words)."""
    db = v["database"]
    if db["bundled"]["enabled"] and (db["url"] or db["existingSecret"]):
        return BUNDLED_AND_URL
    if int(v["replicaCount"]) > 1 and not shared_database(v):
        return REPLICAS_NEED_A_SHARED_DATABASE.format(n=v["replicaCount"])
    return None


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
    """``gpupool serve`` on the Kubernetes backend; the Lease is in the pod's own namespace.
    With ``tls.secretName`` it serves HTTPS only, with the Secret's certificate."""
    s = v["scheduler"]
    scheme = "https" if v["tls"]["secretName"] else "http"
    args = ["serve", "--backend", "kubernetes", "--host", "0.0.0.0", "--port", "8080"]
    args += [
        "--state-dir",
        STATE_DIR,
        "--config",
        CONFIG_DIR,
        "--advertise-url",
        f"{scheme}://$(POD_IP):8080",
    ]
    args += ["--replicas", str(v["replicaCount"]), "--log-level", s["logLevel"]]
    if v["metrics"]["public"]:
        args.append("--metrics-public")
    if v["tls"]["secretName"]:
        args += ["--tls-cert", f"{API_TLS_DIR}/tls.crt", "--tls-key", f"{API_TLS_DIR}/tls.key"]
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
    elif db["bundled"]["enabled"]:
        env.append(
            {"name": "GPUPOOL_DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": POSTGRES, "key": "url"}}}
        )
    return env


def scheduler_container(v: dict[str, Any]) -> dict[str, Any]:
    scheme = "HTTPS" if v["tls"]["secretName"] else "HTTP"  # the kubelet does not verify it
    mounts: list[dict[str, Any]] = [
        {"name": "state", "mountPath": STATE_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
    ]
    if v["tls"]["secretName"]:
        mounts.append({"name": "api-tls", "mountPath": API_TLS_DIR, "readOnly": True})
    return {
        "name": "scheduler",
        "image": _image(v),
        "imagePullPolicy": v["image"]["pullPolicy"],
        "args": scheduler_args(v),
        "env": _env(v),
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "livenessProbe": _probe("/healthz", "http", scheme, period=20),
        "readinessProbe": _probe("/readyz", "http", scheme),
        "resources": v["scheduler"]["resources"],
        "securityContext": _container_security(),
        "volumeMounts": mounts,
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


def _state_volume(v: dict[str, Any]) -> dict[str, Any]:
    claim = state_claim(v)
    if claim is None:
        return {"name": "state", "emptyDir": {}}
    return {"name": "state", "persistentVolumeClaim": {"claimName": claim}}


def deployment(v: dict[str, Any], ns: str) -> dict[str, Any]:
    """``replicaCount`` replicas (one leads, by Lease), spread over nodes; all serve the webhooks.
    With the store on a ReadWriteOnce claim, Recreate: a rolling update's second pod could not
    mount it (and two schedulers must never open one SQLite file)."""
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
            _state_volume(v),
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
    if v["tls"]["secretName"]:
        pod_spec["volumes"].append({"name": "api-tls", "secret": {"secretName": v["tls"]["secretName"]}})
    spec: dict[str, Any] = {"replicas": v["replicaCount"]}
    if state_claim(v) is not None:
        spec["strategy"] = {"type": "Recreate"}
    spec["selector"] = {"matchLabels": selector("scheduler")}
    spec["template"] = {"metadata": {"labels": labels("scheduler")}, "spec": pod_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(RELEASE, ns, "scheduler"),
        "spec": spec,
    }


def state_claims(v: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    """The chart's claim for the SQLite store (none with existingClaim or a shared database).
    Kept by ``helm uninstall`` (resource-policy keep), so a reinstall finds its state again."""
    if state_claim(v) != STATE_CLAIM:
        return []
    p = v["persistence"]
    m = meta(STATE_CLAIM, ns, "scheduler")
    m["annotations"] = {"helm.sh/resource-policy": "keep"}
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"]}
    if p["storageClass"]:
        spec["storageClassName"] = p["storageClass"]
    spec["resources"] = {"requests": {"storage": p["size"]}}
    return [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": m, "spec": spec}]


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


def disruption_budgets(v: dict[str, Any], ns: str) -> list[dict[str, Any]]:
    """With 2+ replicas (on a shared database) a drain keeps one: the webhooks must answer while
    pods are created. None for one replica: ``minAvailable: 1`` would block every drain of its node."""
    if int(v["replicaCount"]) < 2:
        return []
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta(RELEASE, ns, "scheduler"),
            "spec": {"minAvailable": 1, "selector": {"matchLabels": selector("scheduler")}},
        }
    ]
