"""Fault injection on the HTTP side: random 409 on writes, 5xx on anything, latency, dropped watches.

Why a seeded RNG: a test that injects faults must fail the same way on every run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gpupool.kube.fake.errors import ApiError

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass
class FaultConfig:
    """What goes wrong and how often. Rates are probabilities per request (0..1)."""

    conflict_rate: float = 0.0
    error_rate: float = 0.0
    latency_s: float = 0.0
    drop_watches_after_s: float | None = None
    seed: int = 1
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("conflict_rate", "error_rate"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"FaultConfig.{name} must be within 0..1, got {v}")
        if self.latency_s < 0:
            raise ValueError(f"FaultConfig.latency_s must be >= 0, got {self.latency_s}")
        self._rng = random.Random(self.seed)

    @property
    def active(self) -> bool:
        return bool(self.conflict_rate or self.error_rate or self.latency_s or self.drop_watches_after_s)

    def injected_error(self, method: str) -> ApiError | None:
        """The error to answer this request with instead of serving it, or None."""
        if self.error_rate and self._rng.random() < self.error_rate:
            if self._rng.random() < 0.5:
                return ApiError(500, "fake fault injection: internal error", "InternalError")
            return ApiError(503, "fake fault injection: service unavailable", "ServiceUnavailable")
        if method in WRITE_METHODS and self.conflict_rate and self._rng.random() < self.conflict_rate:
            return ApiError(
                409,
                "Operation cannot be fulfilled: fake fault injection: the object has been "
                "modified; please apply your changes to the latest version and try again",
                "Conflict",
            )
        return None
