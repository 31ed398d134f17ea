"""The controller's side of usage decay (docs/engine.md, "Usage decay"): it keeps the decayed
GPU-seconds per queue between cycles and hands them to the engine before each cycle.

Why here and not in the engine: the engine reads no clock and keeps no history (it is pure);
the controller owns time, so it advances the decayed usage with what ran since the last cycle.
"""

from __future__ import annotations

from gpupool.engine import Engine
from gpupool.engine.decay import DecayedUsage, gpus_by_queue
from gpupool.manifests import Bundle
from gpupool.model import EngineConfig


def decay_for(bundle: Bundle, current: DecayedUsage | None) -> DecayedUsage | None:
    """The decayed usage to keep under ``bundle``'s half-life: None when it sets none; the
    history so far when there is one (a changed half-life applies from now on)."""
    hl = bundle.usage_half_life_s
    if hl is None:
        return None
    if current is not None and current.half_life_s == hl:
        return current
    fresh = DecayedUsage(hl)
    if current is not None:
        fresh.usage, fresh.last = dict(current.usage), current.last
    return fresh


def engine_config(bundle: Bundle) -> EngineConfig:
    """The engine configuration a bundle sets (today: only the usage half-life)."""
    return EngineConfig(usage_half_life_s=bundle.usage_half_life_s)


def step(decay: DecayedUsage | None, engine: Engine, now: float) -> None:
    """Account what ran since the last cycle and give the engine the decayed usage."""
    if decay is None:
        return
    decay.advance(now, gpus_by_queue(engine.running.values()))
    engine.set_decayed_usage(decay.usage)


def usage_of(decay: DecayedUsage | None) -> tuple[tuple[str, float], ...]:
    """``Snapshot.decayed_usage`` for an engine built now."""
    return decay.as_snapshot() if decay is not None else ()
