"""One admitted workload as the Kubernetes backend carries it out (``KubeRun``).

Why a module of its own: the backend keeps these, and the restart path (``recovery``: runs
adopted from the cluster), the elastic runs and the shrink build or read them; with the value
here, none of them imports the backend back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpupool.kube import workloads
from gpupool.kube.outcomes import Outcome
from gpupool.kube.runtime.tracker import Top
from gpupool.service.backends import RunState


@dataclass(slots=True)
class KubeRun:
    """One admitted workload as the backend carries it out."""

    name: str
    top: Top
    placement: dict[str, Any]
    started_at: float
    duration_s: float | None
    decision: str
    kw: workloads.KubeWorkload | None = None
    bound: bool = False
    first_try: float | None = None
    next_try: float = 0.0
    tries: int = 0
    last_error: str = ""
    outcome: Outcome | None = None
    #: every pod was seen Ready once (the podsReady timeout no longer applies, as in Kueue)
    ready: bool = False
    #: adopted after a restart: ``kw`` is translated when a pod of it is first to be bound
    untranslated: bool = False
    #: a Job admitted with fewer pods: the patch that gives it back its counts when it is
    #: suspended again (kept from admission: the cache may not show the reduced Job yet)
    restore: dict[str, Any] | None = None

    def state(self) -> RunState:
        o = self.outcome
        return RunState(
            self.name,
            self.placement,
            self.started_at,
            self.duration_s,
            o is not None,
            o.outcome if o else "",
            o.message if o else "",
            o.exit_code if o and o.outcome == "Failed" else None,
            o.reason if o and o.outcome == "Failed" else "",
        )
