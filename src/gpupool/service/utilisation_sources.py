"""Where device readings come from, one source per backend (see gpupool.service.utilisation).

Why each is a small class with ``read() -> {(node, index): Reading}``: the tracker attributes
readings to workloads the same way whatever measured them, and each source is tested alone —
NVML with a stand-in module, Prometheus against a local HTTP stub, the synthetic levels with
nothing at all.

- ``NvmlReadings``: the local backend's devices through NVML (``discovery.utilisation()``).
- ``PrometheusReadings``: Kubernetes, from the DCGM exporter's ``DCGM_FI_DEV_GPU_UTIL`` (%) and
  ``DCGM_FI_DEV_FB_USED`` (MiB), or HAMi's ``HostCoreUtilization`` (%) and
  ``HostGPUMemoryUsage`` (bytes), read with an instant query (``/api/v1/query``).
- ``SyntheticReadings``: the virtual backend (no GPUs): each running workload's devices show its
  task type's level (gpupool.discovery.synthetic); a shared device shows the sum of its shares.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import httpx

from gpupool.discovery import synthetic
from gpupool.discovery.nvml import Discovery, Reading
from gpupool.model import Node, Running
from gpupool.service.utilisation import DeviceKey

log = logging.getLogger(__name__)

#: per exporter: (utilisation metric, memory metric, bytes per memory unit, node labels, index labels)
EXPORTERS: Mapping[str, tuple[str, str, int, tuple[str, ...], tuple[str, ...]]] = {
    "dcgm": (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        1 << 20,
        ("Hostname", "node", "kubernetes_node"),
        ("gpu",),
    ),
    "hami": ("HostCoreUtilization", "HostGPUMemoryUsage", 1, ("nodeid", "node"), ("deviceidx",)),
}


class ReadingSource(Protocol):
    """Readings of the devices this source can see, by (node, index)."""

    def read(self) -> dict[DeviceKey, Reading]:
        """What each device computes now; a device it cannot read is left out."""


class NvmlReadings:
    """The local backend's devices: ``discovery`` on the host named ``node``."""

    def __init__(self, discovery: Discovery, node: str) -> None:
        self.discovery, self.node = discovery, node

    def read(self) -> dict[DeviceKey, Reading]:
        return {(self.node, i): r for i, r in self.discovery.utilisation().items()}


class PrometheusReadings:
    """One instant query per metric against Prometheus' HTTP API."""

    def __init__(self, url: str, exporter: str = "dcgm", client: httpx.Client | None = None) -> None:
        if exporter not in EXPORTERS:
            raise ValueError(f"exporter: must be one of {', '.join(EXPORTERS)}, got {exporter!r}")
        self.url = url.rstrip("/")
        self.exporter = exporter
        self.client = client or httpx.Client(timeout=10.0)

    def _query(self, metric: str) -> list[dict[str, Any]]:
        resp = self.client.get(f"{self.url}/api/v1/query", params={"query": metric})
        resp.raise_for_status()
        body = resp.json()
        if body.get("status") != "success":
            raise ValueError(
                f"Prometheus answered {body.get('status')!r} for {metric}: {body.get('error', '')}"
            )
        result = body.get("data", {}).get("result", [])
        return result if isinstance(result, list) else []

    def _by_device(self, metric: str) -> dict[DeviceKey, float]:
        _, _, _, node_labels, index_labels = EXPORTERS[self.exporter]
        out: dict[DeviceKey, float] = {}
        for series in self._query(metric):
            labels, value = series.get("metric", {}), series.get("value", [None, None])
            node = next((labels[k] for k in node_labels if labels.get(k)), None)
            index = next((labels[k] for k in index_labels if labels.get(k) not in (None, "")), None)
            try:
                key, v = (str(node), int(str(index))), float(value[1])
            except (TypeError, ValueError, IndexError):
                continue  # a series without a node or device index: not one device
            if node is not None:
                out[key] = max(out.get(key, v), v)  # one device exported twice (two scrapes): the higher
        return out

    def read(self) -> dict[DeviceKey, Reading]:
        util_metric, mem_metric, unit, _, _ = EXPORTERS[self.exporter]
        util, mem = self._by_device(util_metric), self._by_device(mem_metric)
        return {k: Reading(min(100.0, max(0.0, u)), int(mem.get(k, 0.0) * unit)) for k, u in util.items()}


class SyntheticReadings:
    """The virtual backend's devices, from the running set and each workload's task type."""

    def __init__(
        self,
        running: Callable[[], Mapping[str, Running]],
        nodes: Callable[[], list[Node]],
        annotations: Callable[[str], Mapping[str, str]],
    ) -> None:
        self.running, self.nodes, self.annotations = running, nodes, annotations
        self._levels: dict[str, synthetic.Level] = {}

    def _level(self, r: Running) -> synthetic.Level:
        got = self._levels.get(r.name)
        if got is None:
            try:
                got = synthetic.level(str(r.workload.type), r.name, self.annotations(r.name))
            except ValueError as exc:  # a bad annotation: say so, show the type's level
                log.warning("workload %s: %s", r.name, exc)
                got = synthetic.level(str(r.workload.type), r.name)
            self._levels[r.name] = got
        return got

    def read(self) -> dict[DeviceKey, Reading]:
        running = self.running()
        self._levels = {n: v for n, v in self._levels.items() if n in running}
        mem_mib = {n.name: n.gpu_memory_mib for n in self.nodes()}
        sm: dict[DeviceKey, float] = defaultdict(float)
        mem: dict[DeviceKey, float] = defaultdict(float)
        for r in running.values():
            lv = self._level(r)
            for p in r.admission.pods:
                for d in p.devices:
                    key = (p.node, d)
                    share = p.gpu_milli / 1000
                    sm[key] += lv.sm_percent * share
                    limit = p.gpu_memory_mib if share < 1 and p.gpu_memory_mib else mem_mib.get(p.node, 0)
                    mem[key] += lv.memory_fraction * limit * (1 << 20)
        return {k: Reading(min(100.0, v), int(mem[k])) for k, v in sm.items()}


__all__ = ["EXPORTERS", "NvmlReadings", "PrometheusReadings", "ReadingSource", "SyntheticReadings"]
