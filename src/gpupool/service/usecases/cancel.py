"""The cancel use-case: a caller cancels a workload it may see and cancel.

Who calls it: the HTTP cancel and delete routes (gpupool.service.routes.workloads); the
answer is the workload record, which each caller shows in its own form. A workload outside
the caller's subtree is "not found" (404), one it may see but not cancel "forbidden" (403),
as gpupool.service.core.Service says.
"""

from __future__ import annotations

from gpupool.auth import Action, Principal, Resource
from gpupool.service.core import Service
from gpupool.store import WorkloadRecord


def cancel_workload(svc: Service, p: Principal, name: str) -> WorkloadRecord:
    """Cancel ``name`` for ``p`` (idempotent: a finished workload is returned as it is)."""
    rec = svc.visible_workload(p, name)
    svc.check(p, Action.CANCEL, Resource("Workload", rec.name, queue=rec.queue, owner=rec.owner))
    return svc.controller.cancel(rec.name, p.name)
