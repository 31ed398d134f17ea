"""Synthetic GPU utilisation per task type, for the virtual backend and the simulator.

Why: the whole measured-utilisation path (sampling, rollups, metrics, the held-but-idle alert,
the weekly report) must be visible on a laptop without GPUs. A virtual workload computes at a
level that depends on what it is: training keeps its GPUs busy, inference is bursty, a
development or notebook session mostly holds them. The level is deterministic (the task type
plus a small offset from the workload's name), so a demo or a simulation replays exactly.

A workload can declare its own level with the annotation ``gpupool.io/synthetic-utilization``
(SM percent, 0-100): ``"0"`` is a notebook that holds its GPUs and computes nothing.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

#: the annotation that sets a virtual workload's SM utilisation (percent)
ANNOTATION = "gpupool.io/synthetic-utilization"

#: SM percent and the share of the device memory in use, by task type
LEVELS: Mapping[str, tuple[float, float]] = {
    "training": (90.0, 0.85),
    "fine-tuning": (80.0, 0.75),
    "evaluation": (60.0, 0.50),
    "batch": (70.0, 0.60),
    "inference": (45.0, 0.55),
}
#: a type not listed (a future one): a middling level, never idle
DEFAULT_LEVEL = (50.0, 0.5)
#: the name moves a type's level by at most this many points either way
SPREAD = 5.0


@dataclass(frozen=True, slots=True)
class Level:
    """What a virtual workload's devices show: SM percent and the memory share in use."""

    sm_percent: float
    memory_fraction: float


def level(task_type: str, name: str, annotations: Mapping[str, str] | None = None) -> Level:
    """The workload's synthetic level; raises ValueError naming the annotation for a bad value."""
    sm, mem = LEVELS.get(task_type, DEFAULT_LEVEL)
    raw = (annotations or {}).get(ANNOTATION)
    if raw is not None:
        try:
            declared = float(raw)
        except ValueError:
            raise ValueError(f"{ANNOTATION}: must be a percentage 0-100, got {raw!r}") from None
        if not 0.0 <= declared <= 100.0:
            raise ValueError(f"{ANNOTATION}: must be a percentage 0-100, got {raw!r}")
        return Level(declared, mem)
    offset = (zlib.crc32(name.encode()) % 2001 - 1000) / 1000 * SPREAD
    return Level(min(100.0, max(0.0, sm + offset)), mem)


__all__ = ["ANNOTATION", "DEFAULT_LEVEL", "LEVELS", "SPREAD", "Level", "level"]
