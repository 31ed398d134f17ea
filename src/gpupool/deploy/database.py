"""The bundled PostgreSQL (values ``database.bundled.*``): StatefulSet, Service and Secret.

Why bundled: two scheduler replicas must share one store, or the standby that takes over starts
from an empty one; a cluster without a PostgreSQL server of its own gets one here. The Secret
holds a generated password and the scheduler's URL (key ``url``), which the Deployment reads as
``GPUPOOL_DATABASE_URL``. The chart's templates/database.yaml renders the same objects; Helm keeps
the password across upgrades (``lookup``), and the Secret and the claim survive an uninstall.
"""

from __future__ import annotations

import secrets
import string
from typing import Any

from gpupool.deploy.objects import POSTGRES, meta, selector

USER = "gpupool"
DATABASE = "gpupool"
PORT = 5432
DATA_DIR = "/var/lib/postgresql/data"
#: the postgres image's own user (Debian images): initdb needs to own its data directory
PG_UID = 999


def database_url(password: str, host: str = POSTGRES) -> str:
    """The scheduler's SQLAlchemy URL for the bundled server (the password is alphanumeric)."""
    return f"postgresql+psycopg://{USER}:{password}@{host}:{PORT}/{DATABASE}"


def new_password() -> str:
    """32 letters and digits (nothing a URL would need escaped), as the chart's ``randAlphaNum 32``."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(32))


def _statefulset(b: dict[str, Any], ns: str) -> dict[str, Any]:
    env = [
        {"name": "POSTGRES_USER", "value": USER},
        {"name": "POSTGRES_DB", "value": DATABASE},
        {"name": "POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {"name": POSTGRES, "key": "password"}}},
        # a subdirectory: the volume's root (lost+found, fsGroup-owned) is not initdb's to own
        {"name": "PGDATA", "value": f"{DATA_DIR}/pgdata"},
    ]
    ready = {"exec": {"command": ["pg_isready", "-h", "127.0.0.1", "-U", USER, "-d", DATABASE]}}
    container = {
        "name": "postgresql",
        "image": b["image"],
        "env": env,
        "ports": [{"name": "postgresql", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {**ready, "periodSeconds": 10, "timeoutSeconds": 5},
        "livenessProbe": {**ready, "initialDelaySeconds": 30, "periodSeconds": 20, "timeoutSeconds": 5},
        "resources": b["resources"],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "run", "mountPath": "/var/run/postgresql"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"]}
    if b["storageClass"]:
        claim["storageClassName"] = b["storageClass"]
    claim["resources"] = {"requests": {"storage": b["size"]}}
    pod = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": PG_UID,
            "runAsGroup": PG_UID,
            "fsGroup": PG_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "run", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(POSTGRES, ns, "database"),
        "spec": {
            "replicas": 1,
            "serviceName": POSTGRES,
            "selector": {"matchLabels": selector("database")},
            "template": {"metadata": {"labels": meta(POSTGRES, None, "database")["labels"]}, "spec": pod},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": claim}],
        },
    }


def bundled_objects(v: dict[str, Any], ns: str, password: str | None = None) -> list[dict[str, Any]]:
    """The Secret (a new password unless given), the Service and the StatefulSet; none unless
    ``database.bundled.enabled``."""
    b = v["database"]["bundled"]
    if not b["enabled"]:
        return []
    pw = password or new_password()
    secret_meta = meta(POSTGRES, ns, "database")
    secret_meta["annotations"] = {"helm.sh/resource-policy": "keep"}  # the data outlives an uninstall
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": secret_meta,
        "type": "Opaque",
        "stringData": {"password": pw, "url": database_url(pw)},
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(POSTGRES, ns, "database"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector("database"),
            "ports": [{"name": "postgresql", "port": PORT, "targetPort": "postgresql"}],
        },
    }
    return [secret, service, _statefulset(b, ns)]
