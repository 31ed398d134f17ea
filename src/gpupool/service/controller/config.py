"""The controller's configuration: install a configuration (or the backend's observed nodes)
into a fresh engine, keeping what runs.

Why apart: every path that changes what the engine schedules onto (a configuration reload, a
node change the backend observed, a node failure it reports, a recovery) ends in ``_install``;
reading them together shows that the engine is always rebuilt from the same snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from gpupool.engine.windowed import MixEngine
from gpupool.manifests import Bundle
from gpupool.model import Queue, Running, Snapshot
from gpupool.service import failures as flt
from gpupool.service import usage_decay
from gpupool.service.controller.state import ControllerState
from gpupool.service.convert import bundle_from_manifests, object_manifest, workload_model
from gpupool.service.view import tree_of

log = logging.getLogger("gpupool.controller")


class ConfigInstall(ControllerState):
    """Configuration (re)loads and node changes, each rebuilding the engine around what runs."""

    def config_manifests(self) -> list[dict[str, Any]]:
        return [object_manifest(r) for r in self.store.list_objects()]

    def reload_config(self) -> None:
        """Rebuild the engine from the stored configuration, keeping what runs (after a config change)."""
        with self.lock:
            manifests = self.config_manifests()
            bundle = self._observed(bundle_from_manifests(manifests, skip_invalid=True))
            self.faults.unhealthy = flt.unhealthy_devices(manifests)
            running = list(self.engine.running.values())
            self._install(bundle, flt.fault_evictions(self, bundle.nodes, running, self.clock()))
            self.isolated.clear()  # the new configuration may decide them fine
            for q in self.pending.values():  # priority classes may have changed
                q.model = workload_model(
                    self._manifest_of(q.name),
                    bundle.priority_classes,
                    float(q.seq),
                    strict=False,
                    types=bundle.task_types,
                )
            self._wake.set()

    def _observed(self, bundle: Bundle) -> Bundle:
        """On a backend that observes its nodes (Kubernetes: ``observed_nodes()``), the cluster's
        nodes replace the configured ones; the virtual backend has none and keeps them."""
        observe = getattr(self.backend, "observed_nodes", None)
        if callable(observe):
            if bundle.nodes and bundle is not self.bundle:  # a configuration (re)load, not a refresh
                log.info("%d configured nodes ignored: the backend observes its nodes", len(bundle.nodes))
            bundle.nodes = list(observe())
        report = getattr(self.backend, "reported_unhealthy", None)
        if callable(report):  # the device plugin's word on each device (HAMi's register)
            flt.merge_reported(self.faults, report())
        return bundle

    def nodes_changed(self) -> None:
        """The backend's observed nodes changed: rebuild the engine at the next cycle (once,
        however many changes arrive before it)."""
        self._nodes_dirty = True
        self._wake.set()

    def _refresh_nodes(self, now: float) -> None:
        if not self._nodes_dirty:
            return
        self._nodes_dirty = False
        self._observed(self.bundle)
        running = list(self.engine.running.values())
        self._install(self.bundle, flt.fault_evictions(self, self.bundle.nodes, running, now))

    def _node_faults(self, now: float) -> None:
        """Nodes the backend reports failed (or repaired): requeue their work, rebuild the engine."""
        down = self._backend_down(now)
        if down == self.faults.down:
            return
        self.faults.down = down
        running = list(self.engine.running.values())
        self._install(self.bundle, flt.fault_evictions(self, self.bundle.nodes, running, now))

    def _install(self, bundle: Bundle, running: Sequence[Running]) -> None:
        self.bundle = bundle
        self.parents, self.children = tree_of(bundle.queues)
        self.usage_decay = usage_decay.decay_for(bundle, self.usage_decay)
        self.engine = MixEngine(self._snapshot(bundle, running))
        flt.occupy_unhealthy(self.engine, self.faults.unhealthy)
        self.pools_by_name = {p.name: p for p in bundle.pools}
        self.queues_by_name = {q.name: q for q in bundle.queues}
        self._limit_cache = {}
        self.backend.set_nodes(bundle.nodes)

    def _snapshot(
        self, bundle: Bundle, running: Sequence[Running], queues: Sequence[Queue] | None = None
    ) -> Snapshot:
        return Snapshot(
            flt.effective_nodes(bundle.nodes, self.faults.down),
            tuple(bundle.pools),
            tuple(queues if queues is not None else bundle.queues),
            tuple(bundle.priority_classes),
            running=tuple(running),
            now=self.clock(),
            config=usage_decay.engine_config(bundle),
            decayed_usage=usage_decay.usage_of(self.usage_decay),
        )

    def _rebuild_engine(self) -> None:
        self.engine = MixEngine(self._snapshot(self.bundle, list(self.engine.running.values())))
        flt.occupy_unhealthy(self.engine, self.faults.unhealthy)  # unhealthy devices stay held
