"""Adoption: work the cluster runs that the store does not know, taken over instead of stopped.

Why: a new leader may start on a store that lacks what the previous leader admitted (its own
SQLite file on an emptyDir, a restored backup, a store wiped by hand). The cluster still runs
that work, and its owners carry the admission gpupool recorded (``gpupool.io/admission``:
workload, placement, decision). Stopping it and admitting it again, as recovery once did,
restarts every running job on a failover and may move it. Instead the runs the backend vouches
for are *held*: when the workload reaches the store again (the Kubernetes source submits every
object it watches), it is admitted with the placement the cluster shows, which the backend's
``start`` recognises as the admission already running (same decision), so no pod is touched.

While runs are held, scheduling cycles wait: the engine does not yet charge their devices and
would give them away. The wait ends when the backend says every object has been read
(``claims_settled``); what is still held then belongs to no workload and is stopped, as any
stray run is. A backend without ``vouches`` (virtual, local) holds nothing: its strays are
stopped at once, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpupool.audit import AuditEntry
from gpupool.model import Running
from gpupool.service.backends import Capability, RunState, capability
from gpupool.store import PhaseChange

log = logging.getLogger("gpupool.controller")

#: how long cycles wait for held runs to be claimed when the backend declares nothing
DEFAULT_WAIT_S = 120.0
ADOPTED = "adopted: the cluster runs it with this placement (admitted before this leader took over)"


@dataclass
class Adoption:
    """The runs held for adoption, and the rule that ends the wait."""

    held: dict[str, RunState] = field(default_factory=dict)
    #: the wait ends by then even if the backend never settles (one object it cannot read
    #: must not stop scheduling): ``adoption_wait_s`` on the backend, a declared setting
    until: float = 0.0

    def hold(
        self, backend: Any, strays: Sequence[str], runs: Mapping[str, RunState], now: float
    ) -> list[str]:
        """Hold the strays the backend vouches for; returns the others (to stop now)."""
        vouches = capability(backend, Capability.VOUCHES)
        if not callable(vouches):
            return list(strays)
        keep = {n for n in strays if (runs[n].placement or {}).get("pool") and vouches(n)}
        self.held = {n: runs[n] for n in keep}
        self.until = now + DEFAULT_WAIT_S
        if keep:
            log.warning("recovery: %d running workloads the store does not know held for adoption", len(keep))
        return [n for n in strays if n not in keep]

    def waiting(self, backend: Any, now: float) -> bool:
        """True while held runs may still be claimed (the cycle must not schedule yet)."""
        if not self.held or now >= self.until:
            return False
        settled = capability(backend, Capability.CLAIMS_SETTLED)
        return not (callable(settled) and settled())

    def claim(
        self,
        pending: Mapping[str, Any],
        store: Any,
        add_running: Callable[[Running], None],
        to_running: Callable[[Any, Mapping[str, Any]], Running],
        now: float,
        actor: str = "scheduler",
    ) -> list[Any]:
        """Admit every held run whose workload is pending again, with the cluster's placement;
        returns the store records admitted (the caller drops them from its pending set and
        starts them: the backend's ``start`` sees the same decision and leaves the pods alone)."""
        names = [n for n in self.held if n in pending]
        if not names:
            return []
        changes = [PhaseChange(n, "Admitted", ADOPTED, placement=dict(self.held[n].placement)) for n in names]
        audits = [
            AuditEntry(
                actor,
                "workload.adopt",
                "Workload",
                n,
                {"pool": self.held[n].placement.get("pool"), "reason": ADOPTED},
            )
            for n in names
        ]
        recs = store.apply_transitions(changes, audit=audits, at=datetime.fromtimestamp(now, UTC))
        for n in names:
            add_running(to_running(pending[n].model, self.held.pop(n).placement))
        log.warning("adopted %d running workloads from the cluster: %s", len(names), ", ".join(names[:10]))
        return list(recs)

    def release(self) -> list[str]:
        """The wait is over: what is still held belongs to no workload (to stop)."""
        out, self.held = list(self.held), {}
        return out


__all__ = ["ADOPTED", "Adoption"]
