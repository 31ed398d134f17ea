"""Device exclusivity, checked from what the cluster shows: no GPU is held by more pods than it
can take.

Why a checker apart from the bind-time proof (``KubernetesBackend._jobs_of``): the proof runs on
gpupool's own caches, and a cache that is wrong (a missed watch event, a restart that adopted a
stale view, a second writer) would let the proof pass while the cluster is double-booked. The
checker reads only the pods' own annotations (``gpupool.io/node``, ``gpu-uuids`` or
``gpu-indices``, ``gpu-milli``, ``gpu-memory-mib``), as a kubelet's device plugin would, so the
tests, ``gpupool bench kube`` and the service's metric all see the same truth.

A pod holds its devices from the moment it is bound until it is gone or has ended: a pod that is
terminating still runs its containers, so it counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.kube import annotations as kube_ann

WHOLE = 1000  # milli-GPU of one device
TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Overbooked:
    """One device held beyond its capacity: by whom, and by how much."""

    node: str
    device: str  #: the GPU's UUID, or ``#<index>`` when the pods name no UUID
    pods: tuple[str, ...]  #: ``namespace/name`` of every pod holding it
    milli: int  #: milli-GPU the pods hold together (a whole device is 1000)
    memory_mib: int  #: device memory the pods hold together
    capacity_mib: int | None = None  #: the device's memory, when known

    def message(self) -> str:
        what = f"{self.milli / WHOLE:g} GPUs of compute"
        if self.capacity_mib is not None and self.memory_mib > self.capacity_mib:
            what += f", {self.memory_mib} of {self.capacity_mib} MiB of memory"
        return f"device {self.device} on {self.node} held by {', '.join(self.pods)} ({what})"


def holds_devices(pod: Mapping[str, Any]) -> bool:
    """A bound pod that has not ended (a terminating one included)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return bool(spec.get("nodeName")) and status.get("phase") not in TERMINAL


def _pod_key(pod: Mapping[str, Any]) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', '')}/{md.get('name', '')}"


def holdings(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[tuple[str, int, int]]]:
    """(node, device) -> [(pod, milli, memory MiB)] for every pod that holds devices now."""
    out: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    for pod in pods:
        if not holds_devices(pod):
            continue
        b = kube_ann.read_bound(pod)
        if b is None or not b.devices:
            continue
        names = b.uuids if len(b.uuids) == len(b.devices) else tuple(f"#{i}" for i in b.devices)
        for dev in names:
            out.setdefault((b.node, dev), []).append((_pod_key(pod), b.gpu_milli, b.gpu_memory_mib))
    return out


def overbooked(
    pods: Iterable[Mapping[str, Any]],
    memory_of: Mapping[tuple[str, str], int] | None = None,
) -> list[Overbooked]:
    """Every device whose holders take more than one device's compute, or (where ``memory_of``
    knows the device's memory) more than its memory; sorted, so two reads compare equal."""
    found = []
    for (node, dev), held in sorted(holdings(pods).items()):
        milli = sum(m for _, m, _ in held)
        memory = sum(mem for _, _, mem in held)
        cap = (memory_of or {}).get((node, dev))
        whole_shared = len(held) > 1 and any(m >= WHOLE for _, m, _ in held)
        if milli > WHOLE or whole_shared or (cap is not None and memory > cap):
            found.append(Overbooked(node, dev, tuple(sorted(p for p, _, _ in held)), milli, memory, cap))
    return found


@dataclass
class PassTally:
    """The proof of exclusivity before a bind, for one bind pass.

    ``held(node, exclude)`` is the milli-GPU every pod on the node holds per device (live and
    terminating, the workload's own earlier pods included), leaving out only ``exclude``, the
    pods about to be bound. A gang may bind when, on each of its devices, that plus what this
    pass already gave out plus its own share is at most one device."""

    held: Callable[[str, Collection[Any]], Mapping[int, int]]
    taking: dict[tuple[str, int], int] = field(default_factory=dict)

    def claim(self, wants: Iterable[tuple[str, Sequence[int], int]], exclude: Collection[Any]) -> bool:
        """Take ``(node, devices, milli)`` for every pod of a gang, or nothing when any device
        would be held beyond its capacity (the caller waits for the pods holding it to go)."""
        mine: dict[tuple[str, int], int] = {}
        for node, devices, milli in wants:
            for d in devices:
                mine[(node, d)] = mine.get((node, d), 0) + milli
        nodes: dict[str, Mapping[int, int]] = {}
        for (node, d), milli in mine.items():
            if node not in nodes:
                nodes[node] = self.held(node, exclude)
            if nodes[node].get(d, 0) + self.taking.get((node, d), 0) + milli > WHOLE:
                return False
        for key, milli in mine.items():
            self.taking[key] = self.taking.get(key, 0) + milli
        return True


__all__ = ["Overbooked", "PassTally", "holdings", "holds_devices", "overbooked"]
