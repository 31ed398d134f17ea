"""The controller's configuration: install a configuration (or the backend's observed nodes)
into a fresh engine, keeping what runs; and the queue-tree lookups on the one in force.

Why apart: every path that changes what the engine schedules onto (a configuration reload, a
node change the backend observed, a node failure it reports, a recovery) ends in ``install``;
reading them together shows that the engine is always rebuilt from the same snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from gpupool.engine import Engine
from gpupool.engine.decay import DecayedUsage
from gpupool.manifests import Bundle
from gpupool.manifests.convert import bundle_from_manifests, object_manifest
from gpupool.model import Queue, ResourcePool, Running, Snapshot
from gpupool.service import usage_decay
from gpupool.service.backends import Capability, capability
from gpupool.service.controller.context import Context
from gpupool.service.controller.moves import plannable_pools
from gpupool.service.controller.pending import PendingSet
from gpupool.service.failures.nodes import (
    effective_nodes,
    fault_evictions,
    merge_reported,
    occupy_unhealthy,
    unhealthy_devices,
)
from gpupool.service.view import QueueTree

log = logging.getLogger("gpupool.controller")


class Configuration:
    """Configuration (re)loads and node changes, each rebuilding the engine around what runs.

    Owns the lookups derived from the configuration in force (the queue tree, pools and queues
    by name, the limit cache) and the decayed usage; the bundle and the engine themselves are
    the context's, read by every part. Evictions a change causes requeue through ``pending``."""

    def __init__(self, ctx: Context, pending: PendingSet) -> None:
        self.ctx = ctx
        self.pending = pending
        #: the queue tree of the configuration in force and its lookups (rebuilt in ``install``)
        self.tree = QueueTree((), lambda: self.ctx.engine)
        #: per-configuration lookups for the submit path (rebuilt in ``install``)
        self.pools_by_name: dict[str, ResourcePool] = {}
        self.queues_by_name: dict[str, Queue] = {}
        #: decayed GPU-seconds per queue, when the Cluster sets a usage half-life (usage_decay.py)
        self.usage_decay: DecayedUsage | None = None
        #: the backend's observed nodes changed since the engine was built (``nodes_changed``)
        self._nodes_dirty = False
        #: pools whose consolidation is off because the backend cannot move work: pool -> why
        self.consolidation_off: dict[str, str] = {}

    @property
    def engine(self) -> Engine:  # the context's
        return self.ctx.engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self.ctx.engine = engine

    def manifests(self) -> list[dict[str, Any]]:
        return [object_manifest(r) for r in self.ctx.store.list_objects()]

    def load(self, manifests: Sequence[dict[str, Any]]) -> Bundle:
        """The configuration ``manifests`` declare, with the nodes the backend observes."""
        return self.observed(bundle_from_manifests(list(manifests), skip_invalid=True))

    def reload(self) -> Bundle:
        """Rebuild the engine from the stored configuration, keeping what runs (after a config
        change); the bundle it installed."""
        ctx = self.ctx
        manifests = self.manifests()
        bundle = self.load(manifests)
        ctx.faults.unhealthy = unhealthy_devices(manifests)
        running = list(ctx.engine.running.values())
        self.install(bundle, self._evicting(bundle, running, ctx.clock()))
        return bundle

    def _evicting(self, bundle: Bundle, running: Sequence[Running], now: float) -> list[Running]:
        """What keeps running of ``running`` on ``bundle``'s nodes; the rest is evicted."""
        return fault_evictions(self.ctx, self.pending.queue_again, bundle.nodes, running, now)

    def observed(self, bundle: Bundle) -> Bundle:
        """On a backend that observes its nodes (Kubernetes: ``observed_nodes()``), the cluster's
        nodes replace the configured ones; the virtual backend has none and keeps them."""
        backend = self.ctx.backend
        observe = capability(backend, Capability.OBSERVED_NODES)
        if callable(observe):
            if bundle.nodes and bundle is not self.ctx.bundle:  # a configuration (re)load, not a refresh
                log.info("%d configured nodes ignored: the backend observes its nodes", len(bundle.nodes))
            bundle.nodes = list(observe())
        report = capability(backend, Capability.REPORTED_UNHEALTHY)
        if callable(report):  # the device plugin's word on each device (HAMi's register)
            merge_reported(self.ctx.faults, report())
        return bundle

    def nodes_changed(self) -> None:
        """The backend's observed nodes changed: rebuild the engine at the next cycle (once,
        however many changes arrive before it)."""
        self._nodes_dirty = True
        self.ctx.wake.set()

    def refresh_nodes(self, now: float) -> None:
        if not self._nodes_dirty:
            return
        self._nodes_dirty = False
        bundle = self.observed(self.ctx.bundle)
        self.install(bundle, self._evicting(bundle, list(self.ctx.engine.running.values()), now))

    def node_faults(self, now: float) -> None:
        """Nodes the backend reports failed (or repaired): requeue their work, rebuild the engine."""
        down = self.ctx.backend_down(now)
        if down == self.ctx.faults.down:
            return
        self.ctx.faults.down = down
        bundle = self.ctx.bundle
        self.install(bundle, self._evicting(bundle, list(self.ctx.engine.running.values()), now))

    def install(self, bundle: Bundle, running: Sequence[Running]) -> None:
        ctx = self.ctx
        ctx.bundle = bundle
        self.tree = QueueTree(bundle.queues, lambda: self.ctx.engine)
        self.usage_decay = usage_decay.decay_for(bundle, self.usage_decay)
        ctx.engine = Engine(self.snapshot(bundle, running))
        occupy_unhealthy(ctx.engine, ctx.faults.unhealthy)
        self.pools_by_name = {p.name: p for p in bundle.pools}
        self.queues_by_name = {q.name: q for q in bundle.queues}
        ctx.backend.set_nodes(bundle.nodes)

    def snapshot(
        self, bundle: Bundle, running: Sequence[Running], queues: Sequence[Queue] | None = None
    ) -> Snapshot:
        pools, off = plannable_pools(bundle.pools, self.ctx.backend)  # no Move it cannot carry out
        if off != self.consolidation_off:
            for why in (f"pool {p}: {w}" for p, w in off.items() if p not in self.consolidation_off):
                log.warning("%s", why)
            self.consolidation_off = off
        return Snapshot(
            effective_nodes(bundle.nodes, self.ctx.faults.down),
            tuple(pools),
            tuple(queues if queues is not None else bundle.queues),
            tuple(bundle.priority_classes),
            running=tuple(running),
            now=self.ctx.clock(),
            config=usage_decay.engine_config(bundle),
            decayed_usage=usage_decay.usage_of(self.usage_decay),
        )

    def rebuild_engine(self) -> None:
        ctx = self.ctx
        ctx.engine = Engine(self.snapshot(ctx.bundle, list(ctx.engine.running.values())))
        occupy_unhealthy(ctx.engine, ctx.faults.unhealthy)  # unhealthy devices stay held
