"""The CostPolicy file: what chargeback needs beyond the pools' prices.

Why a file and not a stored kind: prices already live on ResourcePool (``pricePerGPUHour``);
the rest (priority multipliers, whether idle is spread over queues, how long history is
reported, the simulated utilization table) is finance's policy, read by ``gpupool report
--policy FILE`` and by the service from ``$GPUPOOL_COST_POLICY`` or ``cost.yaml`` in its state
directory. The store's object kinds are fixed by the store, so a stored CostPolicy would be a
store change.

Example::

    apiVersion: gpupool.io/v1alpha1
    kind: CostPolicy
    metadata: {name: default}
    spec:
      currency: USD
      priorityMultipliers: {high: 1.5, low: 0.5}
      idle: guarantee          # or allocated, or none
      retentionDays: 400
      pricePerGpuHour: {training: 2.9}
      utilization: {training: 0.9}
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

API_VERSION: Final = "gpupool.io/v1alpha1"
IdleRule = Literal["guarantee", "allocated", "none"]


class CostPolicySpec(BaseModel):
    """What a CostPolicy may say; everything is optional."""

    model_config = ConfigDict(extra="forbid")

    currency: str = Field(default="USD", min_length=1, max_length=8)
    #: charge multiplier per priority class (1 when absent); a surcharge on top of the list
    #: charge, reported apart so that the list charges still reconcile with capacity
    priorityMultipliers: dict[str, Decimal] = Field(default_factory=dict)
    #: how each pool's idle cost is shared over its queues: "guarantee" (the default: by the GPU
    #: guarantees held in the pool, "reserved but unused"), "allocated" (by GPU time used in the
    #: pool) or "none" (idle stays the pool's, charged to nobody)
    idle: IdleRule | None = None
    #: the older switch: true is ``idle: guarantee``, false is ``idle: none``
    spreadIdleByGuarantee: bool | None = None
    #: history older than this many days before the report's end is not reported
    retentionDays: int | None = Field(default=None, ge=1, le=36_500)
    #: price per GPU-hour per pool, over the pool's own pricePerGPUHour (e.g. for a simulated
    #: trial whose pools carry no price, or to try a new price list on last month's history)
    pricePerGpuHour: dict[str, Decimal] = Field(default_factory=dict)
    #: simulated utilization per task type on the virtual backend (overrides the default table)
    utilization: dict[str, float] = Field(default_factory=dict)

    def idle_rule(self) -> IdleRule:
        """The idle rule in force: ``idle``, else the older switch, else by guarantee."""
        if self.idle is not None:
            return self.idle
        return "none" if self.spreadIdleByGuarantee is False else "guarantee"


#: the sentence printed with every chargeback, per rule
IDLE_RULES: Final[dict[str, str]] = {
    "guarantee": "idle shared by guarantee share; costPolicy.idle can change it",
    "allocated": "idle shared by allocated GPU time (costPolicy.idle: allocated)",
    "none": "idle not shared, charged to nobody (costPolicy.idle: none)",
}


class CostPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    apiVersion: Literal["gpupool.io/v1alpha1"] = API_VERSION
    kind: Literal["CostPolicy"] = "CostPolicy"
    metadata: dict[str, Any] = Field(default_factory=lambda: {"name": "default"})
    spec: CostPolicySpec = Field(default_factory=CostPolicySpec)


class PolicyError(ValueError):
    """A CostPolicy that cannot be used; the message names the field."""


def parse_policy(doc: Mapping[str, Any] | None, where: str = "CostPolicy") -> CostPolicySpec:
    """Validate one document; every problem named as ``where: field.path: problem``."""
    if doc is None:
        return CostPolicySpec()
    try:
        spec = CostPolicy.model_validate(doc).spec
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'document'}: {e['msg']}" for e in exc.errors()
        )
        raise PolicyError(f"{where}: {problems}") from None
    for cls, m in spec.priorityMultipliers.items():
        if not Decimal(0) <= m <= Decimal(100):
            raise PolicyError(f"{where}: spec.priorityMultipliers.{cls}: must be between 0 and 100")
    for pool, price in spec.pricePerGpuHour.items():
        if not Decimal(0) <= price <= Decimal(10**6):
            raise PolicyError(f"{where}: spec.pricePerGpuHour.{pool}: must be between 0 and 1e6")
    spread, rule = spec.spreadIdleByGuarantee, spec.idle
    if rule is not None and spread is not None and (rule == "guarantee") != spread:
        raise PolicyError(f"{where}: spec.spreadIdleByGuarantee: contradicts spec.idle {rule!r}; keep one")
    for typ, u in spec.utilization.items():
        if not 0.0 <= u <= 1.0:
            raise PolicyError(f"{where}: spec.utilization.{typ}: must be between 0 and 1")
    return spec


def load_policy(path: Path | None) -> CostPolicySpec:
    """The policy in ``path`` (the default policy when None or when the file is absent)."""
    if path is None or not path.exists():
        return CostPolicySpec()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PolicyError(f"{path}: cannot read the cost policy: {exc}") from None
    if doc is not None and not isinstance(doc, Mapping):
        raise PolicyError(f"{path}: expected one CostPolicy document (a mapping)")
    return parse_policy(doc, str(path))
