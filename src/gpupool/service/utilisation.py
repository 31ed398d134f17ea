"""Measured GPU utilisation (利用率, 显存): what allocated GPUs compute, per workload, and which
workloads hold GPUs without computing (资源被长期占用).

Why measured and not allocated: an allocation says a GPU is held; only the device says whether
it computes. Readings come per device from where they can be seen (``utilisation_sources``:
NVML on the local backend, the DCGM exporter or HAMi through Prometheus on Kubernetes, a
synthetic level per task type on the virtual backend) and are attributed here to the workloads
that hold those devices in the controller's running set.

Held but idle: a workload whose allocated GPUs all stay below ``threshold_percent`` for its
``idleFor`` (the annotation ``gpupool.io/idle-for`` on the workload, else the service default).
The stretch starts at the first reading below the threshold and breaks at a reading above it
or a pass with no reading (unknown is not idle), so the decision depends only on the readings'
times and the declared ``idleFor``: scaling every time by the same factor changes nothing.

Rollups: every pass adds the time since the previous reading to the workload's hour (split at
hour boundaries): sampled seconds, allocated GPU-seconds, used GPU-seconds (allocated x SM
utilisation), memory byte-seconds and the memory peak; idle seconds count once a stretch has
lasted its ``idleFor`` (and then from the stretch's start, in the hours it covered).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Gauge

from gpupool.discovery.nvml import Reading
from gpupool.manifests.utilisation import IDLE_FOR_ANNOTATION, idle_for_of, positive_duration
from gpupool.model import Running
from gpupool.store.utilisation import SUMS, Rollup

HOUR_S = 3600.0

#: a device by node name and index
DeviceKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class UtilisationSettings:
    """The service's utilisation settings (environment: ``GPUPOOL_UTILISATION_*``)."""

    #: a workload whose every GPU is below this SM percent counts as idle
    threshold_percent: float = 5.0
    #: how long a workload may stay idle before GpuHeldIdle fires, unless it declares its own
    idle_for_s: float = 30 * 60.0
    #: seconds between two sampling passes (wall clock)
    interval_s: float = 15.0
    #: hourly rollups older than this are pruned
    retention_s: float = 90 * 86400.0
    #: Prometheus to read the DCGM exporter's or HAMi's metrics from (Kubernetes); None: off
    prometheus_url: str | None = None
    #: which exporter's metrics to read there: ``dcgm`` or ``hami``
    exporter: str = "dcgm"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> UtilisationSettings:
        """Settings from ``GPUPOOL_UTILISATION_{THRESHOLD,IDLE_FOR,INTERVAL,RETENTION,
        PROMETHEUS_URL,EXPORTER}``; a bad value raises ValueError naming the variable."""
        out = cls()
        p = "GPUPOOL_UTILISATION_"
        if v := environ.get(p + "THRESHOLD"):
            out = replace(out, threshold_percent=_percent(v, p + "THRESHOLD"))
        if v := environ.get(p + "IDLE_FOR"):
            out = replace(out, idle_for_s=positive_duration(v, p + "IDLE_FOR"))
        if v := environ.get(p + "INTERVAL"):
            out = replace(out, interval_s=positive_duration(v, p + "INTERVAL"))
        if v := environ.get(p + "RETENTION"):
            out = replace(out, retention_s=positive_duration(v, p + "RETENTION"))
        if v := environ.get(p + "PROMETHEUS_URL"):
            if not v.startswith(("http://", "https://")):
                raise ValueError(f"{p}PROMETHEUS_URL: must be an http:// or https:// URL, got {v!r}")
            out = replace(out, prometheus_url=v.rstrip("/"))
        if v := environ.get(p + "EXPORTER"):
            if v not in ("dcgm", "hami"):
                raise ValueError(f"{p}EXPORTER: must be dcgm or hami, got {v!r}")
            out = replace(out, exporter=v)
        return out


def _percent(raw: str, where: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{where}: must be a percentage 0-100, got {raw!r}") from None
    if not 0.0 <= v <= 100.0:
        raise ValueError(f"{where}: must be a percentage 0-100, got {raw!r}")
    return v


@dataclass(frozen=True, slots=True)
class About:
    """What the tracker needs to know of a workload beyond its placement."""

    owner: str = ""
    idle_for_s: float | None = None


@dataclass(frozen=True, slots=True)
class HeldIdle:
    """A workload held idle for at least its ``idleFor`` (what GpuHeldIdle reports)."""

    workload: str
    queue: str
    pool: str
    owner: str
    gpus: float
    idle_since: float
    idle_s: float
    held_s: float


@dataclass(slots=True)
class _Held:
    """One running workload as the tracker follows it."""

    queue: str
    pool: str
    gpus: float
    about: About
    admitted_at: float
    last_t: float | None = None
    below_since: float | None = None
    #: idle seconds of the current stretch by hour, until the stretch lasts its idleFor
    pending: dict[float, float] = field(default_factory=dict)
    sm_percent: float = 0.0
    memory_bytes: int = 0


def hour_split(t0: float, t1: float) -> list[tuple[float, float]]:
    """``[t0, t1)`` as (hour start, seconds) per clock hour it covers."""
    out: list[tuple[float, float]] = []
    t = t0
    while t < t1:
        h = math.floor(t / HOUR_S) * HOUR_S
        end = min(t1, h + HOUR_S)
        out.append((h, end - t))
        t = end
    return out


class UtilisationTracker:
    """Attributes device readings to running workloads; keeps their idle stretches, the hourly
    sums not yet written, and the per-workload gauges (a finished workload's series go)."""

    def __init__(self, settings: UtilisationSettings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self._held: dict[str, _Held] = {}
        self._hours: dict[tuple[float, str], Rollup] = {}
        labels = ["pool", "queue", "workload"]
        reg = registry if registry is not None else CollectorRegistry()
        self.sm = Gauge(
            "gpupool_gpu_utilization",
            "Measured SM utilisation of a running workload's GPUs (0-1, mean over its devices)",
            labels,
            registry=reg,
        )
        self.memory = Gauge(
            "gpupool_gpu_memory_used_bytes",
            "GPU memory in use on a running workload's devices (bytes, summed)",
            labels,
            registry=reg,
        )

    def observe(
        self,
        now: float,
        running: Mapping[str, Running],
        readings: Mapping[DeviceKey, Reading],
        about: Callable[[str], About],
    ) -> None:
        """One pass: attribute ``readings`` to ``running`` at time ``now``."""
        for name in [n for n in self._held if n not in running]:
            self.forget(name)
        for name, r in running.items():
            keys = [(p.node, d) for p in r.admission.pods for d in p.devices]
            got = [readings[k] for k in keys if k in readings]
            h = self._held.get(name)
            if h is None:
                h = self._held[name] = self._new(r, about(name))
            if not keys or len(got) < len(keys):
                h.last_t, h.below_since, h.pending = None, None, {}  # unknown: not idle, a new start
                continue
            self._step(name, h, now, got)

    def _new(self, r: Running, about: About) -> _Held:
        gpus = sum(p.gpu_milli * len(p.devices) for p in r.admission.pods) / 1000
        return _Held(r.workload.queue, r.admission.pool, gpus, about, r.admission.admitted_at)

    def _step(self, name: str, h: _Held, now: float, got: list[Reading]) -> None:
        sm = sum(x.sm_percent for x in got) / len(got)
        mem = sum(x.memory_used_bytes for x in got)
        below = max(x.sm_percent for x in got) < self.settings.threshold_percent
        if h.last_t is not None and now > h.last_t:
            self._accrue(name, h, h.last_t, now, sm, mem, idle=below and h.below_since is not None)
        if not below:
            h.below_since, h.pending = None, {}
        elif h.below_since is None:
            h.below_since = now
        h.last_t, h.sm_percent, h.memory_bytes = now, sm, mem
        self.sm.labels(h.pool, h.queue, name).set(sm / 100)
        self.memory.labels(h.pool, h.queue, name).set(mem)

    def _accrue(self, name: str, h: _Held, t0: float, t1: float, sm: float, mem: int, idle: bool) -> None:
        for hour, s in hour_split(t0, t1):
            self._add(hour, name, h, sampled_s=s, gpu_s=h.gpus * s, used_gpu_s=h.gpus * s * sm / 100,
                      memory_byte_s=mem * s, memory_max_bytes=mem)  # fmt: skip
            if idle:
                h.pending[hour] = h.pending.get(hour, 0.0) + s
        limit = h.about.idle_for_s
        if idle and h.below_since is not None and limit is not None and t1 - h.below_since >= limit:
            for hour, s in h.pending.items():  # the stretch lasted its idleFor: all of it counts
                self._add(hour, name, h, idle_s=s, idle_gpu_s=h.gpus * s)
            h.pending = {}

    def _add(self, hour: float, name: str, h: _Held, memory_max_bytes: int = 0, **sums: float) -> None:
        key = (hour, name)
        cur = self._hours.get(key) or Rollup(datetime.fromtimestamp(hour, UTC), name, h.queue, h.pool)
        merged = {k: getattr(cur, k) + v for k, v in sums.items()}
        self._hours[key] = replace(
            cur, memory_max_bytes=max(cur.memory_max_bytes, memory_max_bytes), **merged
        )

    def forget(self, name: str) -> None:
        """The workload ended (or left the running set): its series and stretch go; its hours
        not yet drained stay to be written."""
        h = self._held.pop(name, None)
        if h is not None:
            for g in (self.sm, self.memory):
                with contextlib.suppress(KeyError):  # never measured: no series
                    g.remove(h.pool, h.queue, name)

    def drain(self) -> list[Rollup]:
        """The hourly sums gathered since the last drain (to add to the store), and forget them."""
        out, self._hours = list(self._hours.values()), {}
        return out

    def give_back(self, rollups: list[Rollup]) -> None:
        """Drained hours the store did not take (it was away): kept to be written next pass."""
        for r in rollups:
            cur = self._hours.get((r.hour.timestamp(), r.workload))
            if cur is not None:
                sums = {f: getattr(r, f) + getattr(cur, f) for f in SUMS}
                r = replace(r, memory_max_bytes=max(r.memory_max_bytes, cur.memory_max_bytes), **sums)
            self._hours[(r.hour.timestamp(), r.workload)] = r

    def held_idle(self) -> list[HeldIdle]:
        """Workloads whose current idle stretch has lasted their ``idleFor``, by name."""
        out = []
        for name, h in sorted(self._held.items()):
            limit, since, last = h.about.idle_for_s, h.below_since, h.last_t
            if limit is None or since is None or last is None or last - since < limit:
                continue
            held = max(0.0, last - h.admitted_at) if h.admitted_at else last - since
            out.append(HeldIdle(name, h.queue, h.pool, h.about.owner, h.gpus, since, last - since, held))
        return out

    def rows(self, queues: Collection[str] | None = None) -> list[dict[str, object]]:
        """Each measured workload of ``queues`` (None: all) as the API shows it, by name."""
        out: list[dict[str, object]] = []
        for name, h in sorted(self._held.items()):
            if h.last_t is None or (queues is not None and h.queue not in queues):
                continue
            idle = h.below_since is not None and h.about.idle_for_s is not None
            held = idle and h.last_t - (h.below_since or 0.0) >= (h.about.idle_for_s or 0.0)
            out.append({
                "workload": name, "queue": h.queue, "pool": h.pool, "gpus": h.gpus,
                "smPercent": round(h.sm_percent, 1), "memoryUsedBytes": h.memory_bytes,
                "idleSince": h.below_since, "idleForSeconds": h.about.idle_for_s, "heldIdle": held,
            })  # fmt: skip
        return out


__all__ = [
    "IDLE_FOR_ANNOTATION",
    "About",
    "DeviceKey",
    "HeldIdle",
    "UtilisationSettings",
    "UtilisationTracker",
    "hour_split",
    "idle_for_of",
    "positive_duration",
]
