"""Fair share with usage decay (issue 11, item 7c; Slurm's fair tree and KAI's usage decay).

Why: the fair-share order weighs what a queue uses *now*. A queue that held the whole cluster
for a day and just released it then ties with one that has waited all day. With a half-life,
historical use counts too, fading by half every ``usageHalfLife``.

The engine stays pure: the caller keeps the decayed GPU-seconds per queue (``DecayedUsage``,
advanced with the GPUs each queue held since the last cycle) and passes them in the snapshot
(``Snapshot.decayed_usage``) or with ``Engine.set_decayed_usage`` (``set_decayed_usage`` here).
``decay_shares`` turns them into a term added to each queue node's dominant share: decayed GPU-seconds divided by what the
node's GPU guarantee would accumulate if held forever (``guarantee * half_life / ln 2``), so a
queue that has used exactly its guarantee for a long time adds 1.0, the same scale as today's
share. No half-life, or no usage passed: no term, and decisions are exactly today's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gpupool.model import UNLIMITED

if TYPE_CHECKING:
    from gpupool.engine.state.quota import QuotaState
    from gpupool.model import EngineConfig, Running


def decay_shares(
    quota: QuotaState, usage: Mapping[str, float], half_life_s: float | None
) -> dict[str, float]:
    """The decay term of every queue node with decayed usage in its subtree (the node's own
    entry plus its descendants'); empty when decay is off. Unknown queue names are ignored."""
    if not half_life_s or half_life_s <= 0 or not usage:
        return {}
    sub: dict[str, float] = {}
    for q, gpu_s in usage.items():
        if q not in quota.queues or not gpu_s > 0:
            continue
        for n in quota.path[q]:
            sub[n] = sub.get(n, 0.0) + gpu_s
    out: dict[str, float] = {}
    steady = half_life_s / math.log(2)  # GPU-seconds per GPU held forever
    for n, gpu_s in sub.items():
        den = _gpu_denominator(quota, n)
        if den > 0:
            out[n] = gpu_s * 1000.0 / (den * steady)
    return out


def _gpu_denominator(quota: QuotaState, n: str) -> float:
    """Milli-GPU the share is measured against: the node's GPU guarantees over all pools, or
    (none set) the GPU capacity of every pool, as ``QuotaState.share`` does per pool."""
    g = sum(quota.G[(n, p)][0] for p in quota.pools if 0 < quota.G[(n, p)][0] < UNLIMITED)
    if g > 0:
        return float(g)
    return float(sum(quota.capacity[p][0] for p in quota.pools if p in quota.capacity))


#: decayed usage below this share of one GPU held for a half-life is dropped (a queue idle for
#: ~40 half-lives): relative to the half-life, not a number of GPU-seconds (it was 1e-9), so a
#: scenario in another unit of time drops it at the same moment
_DROP = 1e-12


class DecayedUsage:
    """GPU-seconds per queue, halved every ``half_life_s``: what the caller (controller,
    simulator) keeps between cycles and passes to the engine.

    ``advance(now, gpus)``: the queues held ``gpus`` (GPUs, per leaf queue) since the last
    call. Exactly integrated for usage that was constant over the interval:
    ``D(t + dt) = D(t) * f + g * half_life / ln 2 * (1 - f)`` with ``f = 2 ** (-dt / half_life)``.
    """

    __slots__ = ("half_life_s", "last", "usage")

    def __init__(self, half_life_s: float) -> None:
        if not half_life_s > 0 or math.isinf(half_life_s):
            raise ValueError(f"usageHalfLife: must be a positive, finite duration, got {half_life_s!r}")
        self.half_life_s = half_life_s
        self.last: float | None = None
        self.usage: dict[str, float] = {}

    def advance(self, now: float, gpus: Mapping[str, float] | Iterable[tuple[str, float]]) -> None:
        """Account the interval since the last call; the first call only sets the clock."""
        held = dict(gpus.items() if isinstance(gpus, Mapping) else gpus)
        if self.last is None or now <= self.last:
            self.last = now if self.last is None else max(self.last, now)
            return
        dt = now - self.last
        self.last = now
        f = 2.0 ** (-dt / self.half_life_s)
        gain = self.half_life_s / math.log(2) * (1.0 - f)
        for q in set(self.usage) | set(held):
            v = self.usage.get(q, 0.0) * f + held.get(q, 0.0) * gain
            if v > _DROP * self.half_life_s:
                self.usage[q] = v
            else:
                self.usage.pop(q, None)

    def as_snapshot(self) -> tuple[tuple[str, float], ...]:
        """The decayed usage as ``Snapshot.decayed_usage`` takes it (sorted: deterministic)."""
        return tuple(sorted(self.usage.items()))


def set_decayed_usage(
    quota: QuotaState, config: EngineConfig, usage: Mapping[str, float] | Iterable[tuple[str, float]]
) -> None:
    """Decayed GPU-seconds per queue (``DecayedUsage``) become a term of the fair-share key of
    every queue node of ``quota`` (``QuotaState.set_decay``), weighed by the fair-share order
    from the next cycle on; ignored while ``config.usage_half_life_s`` is unset."""
    hl = config.usage_half_life_s
    if hl is not None and not (hl > 0 and math.isfinite(hl)):
        raise ValueError(f"engine config usage_half_life_s: must be a positive number of seconds, got {hl!r}")
    pairs = usage.items() if isinstance(usage, Mapping) else usage
    quota.set_decay(decay_shares(quota, dict(pairs), hl))


def gpus_by_queue(running: Iterable[Running]) -> dict[str, float]:
    """GPUs each leaf queue holds now: what ``DecayedUsage.advance`` accounts until the next call."""
    out: dict[str, float] = {}
    for r in running:
        g = r.admission.quota_vec()[0] / 1000.0
        if g:
            out[r.workload.queue] = out.get(r.workload.queue, 0.0) + g
    return out
