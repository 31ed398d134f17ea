"""The chart's default values, as data: ``charts/gpupool/values.yaml`` must say exactly this.

Why in Python too: ``gpupool deploy manifests`` renders the chart's objects at these values
without helm, and a test compares this dict with the chart's values.yaml, so the two install
paths start from the same settings.
"""

from __future__ import annotations

import copy
from typing import Any

from gpupool import __version__ as VERSION

RELEASE = "gpupool"
NAMESPACE = "gpupool-system"

_DEFAULTS: dict[str, Any] = {
    "replicaCount": 1,
    "image": {"repository": "gpupool", "tag": VERSION, "pullPolicy": "IfNotPresent"},
    "imagePullSecrets": [],
    "persistence": {"enabled": True, "size": "1Gi", "storageClass": "", "existingClaim": ""},
    "database": {
        "url": "",
        "existingSecret": "",
        "bundled": {
            "enabled": False,
            "image": "postgres:16",
            "size": "8Gi",
            "storageClass": "",
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        },
    },
    "scheduler": {
        "logLevel": "warning",
        "extraArgs": [],
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    },
    "webhook": {
        "port": 9443,
        "failurePolicy": "Fail",
        "validationFailurePolicy": "Ignore",
        "timeoutSeconds": 5,
        "kueueQueueLabel": True,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    },
    "certManager": {"enabled": False},
    "tls": {"secretName": ""},
    "crdUpgrade": {"enabled": True},
    "metrics": {"public": True},
    "serviceMonitor": {"enabled": True, "interval": "30s"},
    "priorityClasses": {"create": True},
    "examples": {"create": True, "gpus": 8},
    "config": {},
    "nodeSelector": {},
    "tolerations": [],
}


def default_values() -> dict[str, Any]:
    """A fresh copy of the defaults (callers may change it)."""
    return copy.deepcopy(_DEFAULTS)
