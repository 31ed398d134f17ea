"""Which pod fills which slot of a gang's placement (pure functions over pod dicts).

Why slots are matched and not just counted: a placement says pod (group, index) goes to node n
on devices d; for kinds that number their pods (a Job's completion index, a PyTorchJob's
replica type and index, a StatefulSet's ordinal) the pod with that number must get that slot
(rank 0 of a training job is not interchangeable with rank 3 when the topology matters); other
pods fill the remaining slots in a stable order (by name), so a retry after a restart assigns
the same pod to the same slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from gpupool.kube import annotations as kube_ann
from gpupool.kube import workloads
from gpupool.kube.runtime.tracker import is_terminal, node_of

Pod = Mapping[str, Any]


class GangRun(Protocol):
    name: str
    placement: dict[str, Any]
    decision: str
    kw: workloads.KubeWorkload | None


def _ann(pod: Pod) -> Mapping[str, Any]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def deleting(pod: Pod) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def live(pods: Iterable[Pod]) -> list[Pod]:
    """Pods that still run or may run (not finished, not being deleted)."""
    return [p for p in pods if not is_terminal(p) and not deleting(p)]


def attempt_pods(pods: Iterable[Pod], decision: str) -> list[Pod]:
    """The pods bound for this admission (``gpupool.io/decision`` equal to ``decision``)."""
    return [p for p in pods if _ann(p).get(kube_ann.DECISION) == decision]


def _slot_key(pp: Mapping[str, Any]) -> tuple[str, int]:
    return (str(pp["group"]), int(pp["index"]))


def decision_of(placement: Mapping[str, Any]) -> str:
    """Which admission a bound pod belongs to: the placement's admission time, written on the
    pod at bind (``gpupool.io/decision``), so the pods of an earlier run of the same workload
    (still listed until their owner cleans them up) are never mistaken for this run's."""
    return repr(float(placement.get("admittedAt") or 0.0))


def assign_slots(run: GangRun, pods: Sequence[Pod]) -> list[tuple[Pod, Mapping[str, Any]]] | None:
    """(pod, placement entry) for every slot still to bind; [] when all are bound; None while
    the gang must wait because its pods do not all exist yet (a gang binds all at once)."""
    slots = {_slot_key(pp): pp for pp in run.placement.get("pods") or ()}
    free = dict(slots)
    for p in attempt_pods(pods, run.decision):
        b = kube_ann.read_bound(p)
        if b is not None and node_of(p) and (b.group, b.index) in free:
            del free[(b.group, b.index)]
    if not free:
        return []
    waiting = sorted(
        (p for p in live(pods) if not node_of(p)), key=lambda p: str((p.get("metadata") or {}).get("name"))
    )
    if len(waiting) < len(free):
        return None
    out: list[tuple[Pod, Mapping[str, Any]]] = []
    rest: list[Pod] = []
    for p in waiting:
        s = workloads.pod_slot(p, run.kw) if run.kw is not None else None
        key = (s.group, s.index) if s is not None else None
        if key is not None and key in free:
            out.append((p, free.pop(key)))
        else:
            rest.append(p)
    for p, key in zip(rest, sorted(free), strict=False):
        out.append((p, free[key]))
    return out


__all__ = ["GangRun", "assign_slots", "attempt_pods", "decision_of", "deleting", "live"]
