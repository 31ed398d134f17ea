"""The workload annotations of measured utilisation, read and checked in one place.

- ``gpupool.io/idle-for``: how long the workload's GPUs may stay below the utilisation
  threshold before GpuHeldIdle fires (a duration such as ``30m``; ``off``: never);
- ``gpupool.io/synthetic-utilization``: the SM percent a virtual-backend workload shows
  (gpupool.discovery.synthetic).

Why checked at submit: a typo in either would otherwise be found by the sampler much later and
silently replaced by the default; a submission with one is refused naming the annotation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpupool import quantity as qty
from gpupool.discovery import synthetic
from gpupool.manifests.base import ManifestErrors

IDLE_FOR_ANNOTATION = "gpupool.io/idle-for"


def positive_duration(raw: object, where: str) -> float:
    """Seconds from ``30m``, ``2h``, ``90`` (seconds); ValueError naming ``where`` otherwise."""
    try:
        v = qty.parse_duration(raw)
    except (qty.QuantityError, ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    if not v > 0 or not math.isfinite(v):
        raise ValueError(f"{where}: must be a duration > 0 (e.g. 30m), got {raw!r}")
    return v


def idle_for_of(annotations: Mapping[str, str], default_s: float) -> float | None:
    """The declared ``idleFor`` in seconds (None: ``off``; the default when not declared)."""
    raw = annotations.get(IDLE_FOR_ANNOTATION)
    if raw is None:
        return default_s
    if str(raw).strip().lower() == "off":
        return None
    return positive_duration(raw, f"metadata.annotations.{IDLE_FOR_ANNOTATION}")


def check_annotations(annotations: Mapping[str, str], source: str, err: ManifestErrors) -> None:
    """Add a located error for each utilisation annotation that cannot be read."""
    try:
        idle_for_of(annotations, 1.0)
    except ValueError as exc:
        err.add(f"{source}: metadata.annotations.{IDLE_FOR_ANNOTATION}", str(exc).split(": ", 1)[-1])
    try:
        synthetic.level("batch", "", annotations)
    except ValueError as exc:
        err.add(f"{source}: metadata.annotations.{synthetic.ANNOTATION}", str(exc).split(": ", 1)[-1])


__all__ = ["IDLE_FOR_ANNOTATION", "check_annotations", "idle_for_of", "positive_duration"]
