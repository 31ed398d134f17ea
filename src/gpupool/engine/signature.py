"""The one scheduling signature: which pending workloads the engine treats alike.

Why one definition: the engine's fail cache, the simulator's window classes and the
controller's window classes all rest on the same claim, that two workloads with one signature
fare alike but for their order. Three hand-written lists of fields drifted apart (a field
added to ``Workload`` reached one of them and not the others); here the signature is derived
from the model, so a new field is part of it unless it is named below, with the reason.

- ``scheduling_signature``: every field of ``Workload`` but its name and arrival, which only
  identify and order it (``ordering.workload_order_key``). With ``duration="band"`` the
  declared duration counts only by its band, a third of a decade (``victim_cost.duration_band``,
  the one thing the preemption wait reads of it); with ``duration="none"`` not at all. These are
  the simulator's classes: its window rule handles backfill by exact durations itself, and with
  ``"none"`` also the wait horizon, by band (``engine.windows``, "The window rule").
- ``placement_signature``: the part of it placement reads (``placement.Placer``,
  ``holds.plan_hold``), the fail cache's key with the pool: whether a shape fits in a pool does
  not depend on its queue or priority. Placement also reads the declared duration, for backfill
  only; the fail cache keys backfill attempts apart.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Literal

from gpupool.engine.preemption.victim_cost import duration_band
from gpupool.model import Workload

#: the fields that name and order a workload: never part of its signature
IDENTITY = ("name", "arrival")
#: the fields placement reads (with ``gang_min``: how many pods must be placed together)
PLACEMENT = ("pod_groups", "gpu_models", "topology", "tolerations", "node_selector", "gang_min")

SIGNATURE_FIELDS = tuple(f.name for f in fields(Workload) if f.name not in IDENTITY)
_DURATION = SIGNATURE_FIELDS.index("expected_duration_s")
_signature = attrgetter(*SIGNATURE_FIELDS)
_placement = attrgetter(*PLACEMENT)

Signature = tuple[object, ...]


#: how a signature counts the declared duration: exactly, by its band, or not at all
DurationKey = Literal["exact", "band", "none"]


def scheduling_signature(w: Workload, *, duration: DurationKey = "exact") -> Signature:
    """Everything the engine reads of ``w`` but its name and arrival (``duration``: the
    declared duration exactly, by its band only, or not at all)."""
    sig: Signature = _signature(w)
    if duration == "exact":
        return sig
    d = _DURATION
    if duration == "band":
        return (*sig[:d], duration_band(w.expected_duration_s), *sig[d + 1 :])
    return (*sig[:d], *sig[d + 1 :])


def placement_signature(w: Workload) -> Signature:
    """The fields placement reads: a shape that failed in a pool fails there again in the
    same cycle, whichever queue it came from."""
    sig: Signature = _placement(w)
    return sig
