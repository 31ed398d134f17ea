"""The sampling pass and its background thread, and the ``GpuHeldIdle`` alert rule.

Why a loop of its own beside the alert loop: sampling runs more often than alerts are
evaluated (15 s against 30 s by default), and a slow Prometheus must not delay the alert rules.
Leader-only, as the alert loop: a standby's running set is a copy, and two replicas adding to the
same hour would count it twice. Each pass reads the devices, attributes the readings
(``UtilisationTracker``), adds the hours gathered to the store and, once per retention check,
prunes the hours older than the retention.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.service.core import Service
from gpupool.service.utilisation import About, HeldIdle, UtilisationSettings, UtilisationTracker, idle_for_of
from gpupool.service.utilisation_sources import (
    NvmlReadings,
    PrometheusReadings,
    ReadingSource,
    SyntheticReadings,
)
from gpupool.store.incidents import Firing

log = logging.getLogger(__name__)

#: the alert rule's name (an incident carries it)
RULE = "GpuHeldIdle"


def _annotations(manifest: Mapping[str, Any]) -> dict[str, str]:
    meta = manifest.get("metadata") if isinstance(manifest, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return {str(k): str(v) for k, v in ann.items()} if isinstance(ann, Mapping) else {}


def _span(seconds: float) -> str:
    """A stretch as a person reads it: seconds, minutes or hours."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def source_for(svc: Service, settings: UtilisationSettings) -> ReadingSource | None:
    """The source that can see this service's devices (None: nothing measures them)."""
    if settings.prometheus_url:
        return PrometheusReadings(settings.prometheus_url, settings.exporter)
    be, ctl = svc.backend, svc.controller
    if be.name == "local":
        return NvmlReadings(be.discovery, be.node)  # type: ignore[attr-defined]
    if be.name == "virtual":
        return SyntheticReadings(
            ctl.running_view, ctl.nodes, lambda n: _annotations(svc.store.get_workload(n).manifest)
        )
    return None


class UtilisationLoop:
    """Samples in the background and owns the tracker; see the module docstring."""

    def __init__(
        self,
        svc: Service,
        settings: UtilisationSettings | None = None,
        source: ReadingSource | None = None,
        tracker: UtilisationTracker | None = None,
    ) -> None:
        self.svc = svc
        self.settings = settings or UtilisationSettings.from_env()
        self.source = source if source is not None else source_for(svc, self.settings)
        self.tracker = tracker or UtilisationTracker(self.settings, svc.metrics.registry)
        self.last_error = ""
        self._pruned_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mu = threading.Lock()

    @property
    def source_name(self) -> str:
        """What measures the devices: ``nvml``, ``prometheus``, ``synthetic`` or ``none``."""
        names = {NvmlReadings: "nvml", PrometheusReadings: "prometheus", SyntheticReadings: "synthetic"}
        return names.get(type(self.source), "none") if self.source is not None else "none"

    def _about(self, name: str) -> About:
        rec = self.svc.store.get_workload(name)
        try:
            limit = idle_for_of(_annotations(rec.manifest), self.settings.idle_for_s)
        except ValueError as exc:  # said once per workload; the service default applies
            log.warning("workload %s: %s; using the default idleFor", name, exc)
            limit = self.settings.idle_for_s
        return About(rec.owner, limit)

    def sample_now(self, now: float | None = None) -> None:
        """One pass (leader or single replica only): read, attribute, write the hours, prune."""
        leader = self.svc.leader
        if self.source is None or (leader is not None and not leader.is_leader):
            return
        with self._mu:
            ctl = self.svc.controller
            t = ctl.clock() if now is None else now
            running = ctl.running_view()
            try:
                readings = self.source.read()
            except Exception:  # nothing read: every stretch breaks (unknown is not idle)
                self.tracker.observe(t, running, {}, self._about)
                raise
            self.tracker.observe(t, running, readings, self._about)
            rollups, hours = ctl.store.utilisation, self.tracker.drain()
            try:
                rollups.add(hours)
            except Exception:  # the store away: the hours wait for the next pass
                self.tracker.give_back(hours)
                raise
            if self._pruned_at is None or t - self._pruned_at >= min(3600.0, self.settings.retention_s):
                self._pruned_at = t
                rollups.prune(datetime.fromtimestamp(t - self.settings.retention_s, UTC))

    def rule(self, svc: Service, policy: object, now: float) -> list[Firing]:
        """The ``GpuHeldIdle`` alert rule (passed to the alert loop with the other rules)."""
        price = {u.pool.name: u.pool.price_per_gpu_hour for u in svc.read.pool_usage()}
        return [self._firing(h, price.get(h.pool, 0.0)) for h in self.tracker.held_idle()]

    def _firing(self, h: HeldIdle, price: float) -> Firing:
        owner = f", owner {h.owner}" if h.owner else ""
        cost = h.gpus * h.held_s / 3600 * price
        idle_cost = h.gpus * h.idle_s / 3600 * price
        return Firing(
            RULE,
            f"workload/{h.workload}",
            "warning",
            f"workload {h.workload} (queue {h.queue}{owner}) holds {h.gpus:g} GPU(s) in pool {h.pool} "
            f"below {self.settings.threshold_percent:g}% SM utilisation for {_span(h.idle_s)}; "
            f"cost so far {cost:.2f} (idle {idle_cost:.2f}) at the pool's price per GPU-hour",
        )

    def start(self) -> None:
        if self.source is None:
            return  # nothing can be measured here: no thread
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpupool-utilisation", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            try:
                self.sample_now()
                self.last_error = ""
            except Exception as exc:  # a Prometheus outage or a database error: try next pass
                log.warning("utilisation sampling failed: %s", exc, exc_info=True)
                self.last_error = f"{type(exc).__name__}: {exc}"


__all__ = ["RULE", "UtilisationLoop", "source_for"]
