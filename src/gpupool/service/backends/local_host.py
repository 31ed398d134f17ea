"""This host as gpupool configuration, and its device health fed back to the controller.

Why configuration: the controller schedules on the nodes of the stored Cluster objects, never on
what a backend claims, so that placements, quota and audit work the same on every backend. The
local backend therefore describes this host as a Cluster object ``local`` (one node: its GPUs,
CPUs and memory less a reserve for the system), a ResourcePool ``local`` and a Queue ``default``
that may use all of it. ``gpupool serve --backend local`` seeds these on the first start and
brings the Cluster object up to date on every start (a changed GPU count, say), keeping its
annotations (cordon, devices marked unhealthy).

Why health goes through the API's own path: a device NVML reports broken is handled exactly as
one an operator marks unhealthy (``usecases.device_health.set_device_health``): stored on the Cluster
object (it survives a restart), audited, its work evicted by the failure policy and requeued,
the device held out of placement.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpupool.discovery.nvml import Device, islands_label

if TYPE_CHECKING:
    from gpupool.service.core import Service
    from gpupool.store import Store

log = logging.getLogger(__name__)
API = "gpupool.io/v1alpha1"
CLUSTER_NAME = "local"
POOL_NAME = "local"
QUEUE_NAME = "default"
FAKE_LABEL = "gpupool.io/fake-gpus"
BACKEND_LABEL = "gpupool.io/backend"
ISLANDS_LABEL = "gpupool.io/nvlink-islands"
ISOLATION_LABEL = "gpupool.io/gpu-isolation"
#: the actor of the audit records the backend writes when NVML reports a device broken
HEALTH_ACTOR = "local-backend"


def node_name() -> str:
    """This host's name as a node name (lower case letters, digits and dashes)."""
    raw = socket.gethostname().split(".")[0].lower()
    name = re.sub(r"[^a-z0-9-]+", "-", raw).strip("-")[:63]
    return name or "localhost"


def host_resources(reserve_cpus: float = 1.0, reserve_fraction: float = 0.05) -> tuple[int, int]:
    """Schedulable CPU (millicores) and memory (MiB): the host's, less a reserve for the system
    and gpupool itself (at least one CPU, and 5 % or 1 GiB of memory, whichever is more)."""
    cpus = os.cpu_count() or 1
    cpu_milli = max(1000, int((cpus - min(reserve_cpus, cpus - 1)) * 1000))
    total_kib = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total_kib = int(line.split()[1])
                    break
    except OSError:
        total_kib = 0
    total = total_kib // 1024 or 1024
    reserve = max(1024, int(total * reserve_fraction))
    return cpu_milli, max(256, total - reserve)


def cluster_manifest(
    node: str, devices: Sequence[Device], fake: bool, cpu_milli: int, memory_mib: int, isolation: str
) -> dict[str, Any]:
    """The Cluster object ``local``: one node, this host."""
    model = devices[0].model if devices else "none"
    mem = devices[0].memory_mib if devices else 0
    labels = {BACKEND_LABEL: "local", ISOLATION_LABEL: isolation}
    if fake:
        labels[FAKE_LABEL] = "true"
    if devices:
        labels[ISLANDS_LABEL] = islands_label(devices)
    return {
        "apiVersion": API,
        "kind": "Cluster",
        "metadata": {"name": CLUSTER_NAME},
        "spec": {
            "nodes": [
                {
                    "name": node,
                    "gpu": {"model": model, "count": len(devices), "memory": f"{mem}Mi"},
                    "cpu": f"{cpu_milli}m",
                    "memory": f"{memory_mib}Mi",
                    "labels": labels,
                    "nvlinkDomain": node,
                }
            ]
        },
    }


def seed_manifests(cluster: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Cluster object, a pool of this host and a queue ``default`` guaranteed all of it."""
    n = cluster["spec"]["nodes"][0]
    return [
        dict(cluster),
        {
            "apiVersion": API,
            "kind": "ResourcePool",
            "metadata": {"name": POOL_NAME},
            "spec": {
                "description": f"the GPUs of host {n['name']}"
                + (" (fake)" if FAKE_LABEL in n["labels"] else ""),
                "nodeSelector": {BACKEND_LABEL: "local"},
            },
        },
        {
            "apiVersion": API,
            "kind": "Queue",
            "metadata": {"name": QUEUE_NAME},
            "spec": {
                "description": "everyone on this host (add queues and quotas with gpupool apply)",
                "quotas": [
                    {
                        "pool": POOL_NAME,
                        "guarantee": {
                            "nvidia.com/gpu": n["gpu"]["count"],
                            "cpu": n["cpu"],
                            "memory": n["memory"],
                        },
                    }
                ],
            },
        },
    ]


def write_config_dir(path: Path, manifests: Sequence[Mapping[str, Any]]) -> Path:
    """The seed manifests as one YAML file in ``path`` (what ``serve --config`` would read)."""
    path.mkdir(parents=True, exist_ok=True)
    text = "---\n".join(yaml.safe_dump(dict(m), sort_keys=False, allow_unicode=True) for m in manifests)
    (path / "local.yaml").write_text(text, encoding="utf-8")
    return path


def sync_cluster(store: Store, cluster: Mapping[str, Any]) -> bool:
    """Bring the stored Cluster ``local`` to this host's description, keeping its annotations.

    True when it changed (or was created). Why on every start: the host may have gained or lost
    GPUs since the first start, and the stored object is what the controller schedules on."""
    from gpupool.audit import AuditEntry
    from gpupool.manifests.convert import object_manifest

    current = next((r for r in store.list_objects("Cluster") if r.name == CLUSTER_NAME), None)
    manifest: dict[str, Any] = {k: v for k, v in cluster.items()}
    if current is not None:
        old = object_manifest(current)
        if old.get("spec") == cluster.get("spec"):
            return False
        ann = (old.get("metadata") or {}).get("annotations")
        if ann:
            manifest["metadata"] = {**cluster["metadata"], "annotations": dict(ann)}
    store.apply_object(manifest, audit=AuditEntry("system", "config.local-host", "Cluster", CLUSTER_NAME))
    return True


class HealthWatch:
    """Reads device health every ``interval_s`` and marks newly broken devices unhealthy."""

    def __init__(self, node: str, refresh: Callable[[], Mapping[int, str]], interval_s: float) -> None:
        self.node = node
        self.refresh = refresh
        self.interval_s = interval_s
        self.reported: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, svc: Service) -> None:
        self._thread = threading.Thread(target=self._run, args=(svc,), name="gpupool-gpu-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self, svc: Service) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check(svc)
            except Exception:  # health reading must never take the service down; try again
                log.exception("device health check failed")

    def check(self, svc: Service) -> list[int]:
        """Mark each device that turned unhealthy since the last check; returns their indexes."""
        from gpupool.auth import Principal, Role
        from gpupool.service.usecases.device_health import set_device_health

        if not svc.controller.ready:
            return []  # not leading (or still recovering): the leader's check will do it
        new = {i: why for i, why in self.refresh().items() if i not in self.reported}
        actor = Principal(HEALTH_ACTOR, Role.PLATFORM_ADMIN)
        for i, why in sorted(new.items()):
            log.warning("device %s/%d is unhealthy: %s", self.node, i, why)
            set_device_health(svc, actor, self.node, i, healthy=False, reason=why)
            self.reported[i] = why
        return sorted(new)


__all__ = [
    "CLUSTER_NAME",
    "FAKE_LABEL",
    "POOL_NAME",
    "QUEUE_NAME",
    "HealthWatch",
    "cluster_manifest",
    "host_resources",
    "node_name",
    "seed_manifests",
    "sync_cluster",
    "write_config_dir",
]
