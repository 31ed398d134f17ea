"""Which scheduler an object's pods will go to, read before gpupool takes the object on.

Why: gpupool admits an owner by unsuspending it (or, for kinds without suspend, by binding its
pods as they appear), and binds only pods that name it in ``spec.schedulerName``. An owner whose
pods name another scheduler (or none: kube-scheduler) would be admitted, charged to its queue
and shown Running, while its pods wait for, or are placed by, a scheduler that knows nothing of
gpupool's devices. Such an object is refused at the source with a Warning Event that names the
scheduler holding its pods, so nothing is counted that gpupool will not bind.

The mutating webhook sets ``schedulerName: gpupool`` on the templates of the owners it handles
(Job, JobSet, PyTorchJob) and on pods bound for a gpupool queue; a Deployment or StatefulSet is
left to the pod rule, so its template may name no scheduler as long as its pods carry a queue
label.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.kube.translate.kinds import Group, kind_of, mapping
from gpupool.kube.workloads import QUEUE_LABELS

DEFAULT = "default-scheduler"


def foreign(obj: Mapping[str, Any], scheduler_name: str = "gpupool") -> str | None:
    """Why gpupool would never bind this owner's pods (naming the scheduler that would), or
    None when every pod template names ``scheduler_name`` or will get it from the webhook."""
    kind = kind_of(obj)
    if kind is None:
        return None
    return _first_problem(kind.groups(kind.spec(obj)), bool(kind.suspend), scheduler_name)


def _first_problem(groups: Iterable[Group], suspendable: bool, scheduler_name: str) -> str | None:
    for g in groups:
        spec = mapping(g.template.get("spec"))
        named = spec.get("schedulerName")
        if named == scheduler_name:
            continue
        labels = mapping(mapping(g.template.get("metadata")).get("labels"))
        if not named and not suspendable and any(k in labels for k in QUEUE_LABELS):
            continue  # its pods carry a queue label: the webhook's pod rule names gpupool
        who = str(named) if named else f"{DEFAULT} (no schedulerName set)"
        return (
            f"its pods ({g.path}) go to {who}, not {scheduler_name}: gpupool binds only pods with "
            f"schedulerName {scheduler_name}; set {g.path}.spec.schedulerName or install gpupool's "
            "mutating webhook, which sets it"
        )
    return None


__all__ = ["foreign"]
