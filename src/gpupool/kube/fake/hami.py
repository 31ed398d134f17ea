"""A stand-in for HAMi's device plugin: checks a bound pod's device annotation against the node's
register and the pod's ``nvidia.com/gpu`` requests, flips ``hami.io/bind-phase``, and keeps a
ledger of who holds which device so tests can assert no device is double-booked.

Why a ledger and not just the check: the plugin on a real node trusts the scheduler; a scheduler
bug that gives one whole GPU to two pods would pass each pod's own check. The ledger catches it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
REGISTER = "hami.io/node-nvidia-register"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
BIND_PHASE = "hami.io/bind-phase"
NODE_LOCK = "hami.io/mutex.lock"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class Grant:
    """One device of one container of a pod: its UUID, memory (MiB) and cores (%)."""

    uuid: str
    memory_mib: int
    cores: int


class AdmissionError(ValueError):
    """Why the plugin refuses the pod (the kubelet fails it with UnexpectedAdmissionError)."""


def node_devices(node: Obj) -> dict[str, Obj] | None:
    """uuid -> register entry of a node, or None when the node has no HAMi register."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(REGISTER)
    if not raw:
        return None
    try:
        return {d["id"]: d for d in json.loads(raw)}
    except (ValueError, KeyError, TypeError):
        return {}


def gpu_request(container: Obj) -> int:
    res = container.get("resources") or {}
    val = (res.get("limits") or {}).get(GPU, (res.get("requests") or {}).get(GPU, 0))
    try:
        return int(str(val))
    except ValueError:
        return 0


def parse_allocation(value: str, pod: Obj, devices: dict[str, Obj]) -> list[list[Grant]]:
    """The per-container grants of ``hami.io/vgpu-devices-to-allocate`` after HAMi's checks."""
    spec = pod.get("spec") or {}
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    if not value.endswith(";"):
        raise AdmissionError(f"{TO_ALLOCATE}: must end with ';' (one ';'-terminated entry per container)")
    entries = value[:-1].split(";")
    if len(entries) != len(containers):
        raise AdmissionError(
            f"{TO_ALLOCATE}: {len(entries)} container entries for {len(containers)} containers"
        )
    out = []
    for c, entry in zip(containers, entries, strict=True):
        grants = [_grant(dev, devices) for dev in entry.split(":") if dev]
        if len(grants) != gpu_request(c):
            raise AdmissionError(
                f"device number not matched: container {c.get('name')!r} requests "
                f"{gpu_request(c)} {GPU}, annotation has {len(grants)}"
            )
        out.append(grants)
    return out


def _grant(dev: str, devices: dict[str, Obj]) -> Grant:
    parts = dev.split(",")
    if len(parts) != 4:
        raise AdmissionError(f"{TO_ALLOCATE}: device {dev!r} is not 'UUID,NVIDIA,<memMiB>,<cores>'")
    uuid, _vendor, mem, cores = parts
    if uuid not in devices:
        raise AdmissionError(f"{TO_ALLOCATE}: device {uuid} is not on this node")
    try:
        g = Grant(uuid, int(mem), int(cores))
    except ValueError:
        raise AdmissionError(f"{TO_ALLOCATE}: device {dev!r}: memory and cores must be integers") from None
    if g.memory_mib > int(devices[uuid].get("devmem", 0)) or not 0 <= g.cores <= 100:
        raise AdmissionError(
            f"{TO_ALLOCATE}: device {uuid}: {g.memory_mib} MiB / {g.cores}% exceeds the device"
        )
    return g


@dataclass
class Ledger:
    """Who holds which device right now: uuid -> {pod uid: Grant}."""

    holders: dict[str, dict[str, tuple[str, Grant]]] = field(default_factory=dict)

    def take(
        self, pod_uid: str, pod_name: str, grants: list[list[Grant]], devices: dict[str, Obj]
    ) -> list[str]:
        """Record the grants; returns the violations they cause (exclusive sharing, over-commit)."""
        problems = []
        for g in (g for cg in grants for g in cg):
            held = self.holders.setdefault(g.uuid, {})
            held[pod_uid] = (pod_name, g)
            dev = devices.get(g.uuid) or {}
            devmem, split = int(dev.get("devmem", 0)), int(dev.get("count", 10))
            if len(held) > 1 and any(_exclusive(x, devmem) for _, x in held.values()):
                problems.append(f"device {g.uuid} held whole by one of {sorted(n for n, _ in held.values())}")
            if sum(x.memory_mib for _, x in held.values()) > devmem:
                problems.append(
                    f"device {g.uuid} memory over-committed by {sorted(n for n, _ in held.values())}"
                )
            if sum(x.cores for _, x in held.values()) > 100 or len(held) > split:
                problems.append(f"device {g.uuid} cores or slots over-committed")
        return problems

    def release(self, pod_uid: str) -> None:
        for held in self.holders.values():
            held.pop(pod_uid, None)


def _exclusive(g: Grant, devmem: int) -> bool:
    return g.cores >= 100 or (devmem > 0 and g.memory_mib >= devmem)


def lock_holder(node: Obj) -> tuple[str, str] | None:
    """(namespace, pod) named by the node lock ``<RFC3339>,<ns>,<pod>``, or None."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_LOCK)
    if not raw:
        return None
    parts = raw.split(",")
    return (parts[1], parts[2]) if len(parts) >= 3 else None
