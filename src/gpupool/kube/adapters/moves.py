"""Consolidation moves on Kubernetes (the engine's ``Move``, issue 27): an eviction plus a
reserved re-bind.

Why these steps, in this order:

* **The admission record on the owner is replaced first** (``gpupool.io/admission``: the new
  placement, its decision, the restart time), so the next bind pass, and a backend restarted
  after this point, bind the owner's pods to the reserved placement and never to the old one.
* **Then the Job's live pods go**, marked ``DisruptionTarget`` (reason
  ``PreemptionByScheduler``, the message naming the consolidation) and deleted with their grace
  period (``Evictor.disrupt``). The Job controller makes replacements at once; the binder binds
  them to the reserved nodes and devices. Deleting pods still hold their devices in the
  tracker's count (``Tracker.device_use``), so the beneficiary, admitted on the freed node in
  the same cycle, binds only once they are gone: no device is held by two running pods.
* **A Warning Event ``Consolidated``** on the owner says where the job went and for whom.

A restart between the first two steps leaves the old pods running under a record that no longer
names them: the bind pass disrupts a Job's live pods bound for an earlier admission (``stale``).

Only a batch/v1 Job is moved here: its controller replaces deleted pods and its completion index
keeps each pod in its slot. Other kinds are refused (``refusal``): bare pods have no controller
to recreate them, serving owners share their pods between a base and its extras, and the other
training kinds' operators restart or fail the whole job on a deleted pod. The controller stops a
refused run whole and requeues it (``service/controller/moves.py``).

Differs from a Kueue preemption (which re-suspends the Job): the Job stays unsuspended, so as in
KAI a Job whose ``podFailurePolicy`` does not ignore ``DisruptionTarget`` counts the deleted pods
against its ``backoffLimit``, as with a shrink.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.kube import annotations as kube_ann
from gpupool.kube.gangs import live
from gpupool.kube.runtime.evictor import ADMISSION, Evictor, read_admission
from gpupool.kube.runtime.tracker import node_of
from gpupool.kube.workloads import SOURCE, SOURCE_API_VERSION

log = logging.getLogger("gpupool.kube.moves")

#: the owner kinds whose runs can be moved (see the module)
MOVABLE_KINDS = frozenset({"Job"})


def refusal(kind: str) -> str:
    """Why a run whose top owner is of ``kind`` cannot be moved here ('' when it can)."""
    if kind in MOVABLE_KINDS:
        return ""
    if kind == "Pod":
        return "bare pods have no controller to recreate them on the reserved placement"
    return f"a {kind} is not moved by pod deletion (only a batch/v1 Job is)"


def movable(manifest: Mapping[str, Any]) -> bool:
    """Can the run of this stored workload manifest be moved here (``Workload.movable``)? Only
    when its source object is a batch/v1 Job (the annotation the source writes). Why asked
    before a move is planned: the engine then plans no move the backend would refuse, which
    stops the run whole and requeues it, losing more than the consolidation gains."""
    md = manifest.get("metadata")
    notes = md.get("annotations") if isinstance(md, Mapping) else None
    if not isinstance(notes, Mapping):
        return False
    kind = str(notes.get(SOURCE, "")).split("/", 1)[0]
    return kind in MOVABLE_KINDS and notes.get(SOURCE_API_VERSION) == "batch/v1"


def stale(pods: Sequence[Mapping[str, Any]], decision: str) -> list[Mapping[str, Any]]:
    """A Job's live bound pods of an earlier admission than ``decision``: a move whose record
    was written but whose pods were not disrupted (the process stopped in between). They hold
    devices the engine no longer charges to the run, and the Job makes no replacement while
    they live; the bind pass disrupts them (``Mover.sweep``)."""
    if not decision:
        return []
    out = []
    for p in live(pods):
        was = ((p.get("metadata") or {}).get("annotations") or {}).get(kube_ann.DECISION)
        if node_of(p) and was and was != decision:
            out.append(p)
    return out


def where(placement: Mapping[str, Any]) -> str:
    """The nodes and devices of a placement, for the Event: ``n-002 [4,5,6,7]``."""
    by_node: dict[str, list[int]] = {}
    for p in placement.get("pods") or ():
        by_node.setdefault(str(p.get("node", "")), []).extend(int(d) for d in p.get("devices") or ())
    return ", ".join(f"{n} [{','.join(str(d) for d in sorted(ds))}]" for n, ds in sorted(by_node.items()))


class Mover:
    """The owner- and pod-level writes of a move; the backend keeps the run's state."""

    def __init__(self, evictor: Evictor) -> None:
        self.evictor = evictor

    def record(self, obj: Mapping[str, Any], name: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The owner's admission record with the move's ``fields`` (placement, decision,
        startedAt, durationS) replaced; what partial admission added (its counts) is kept."""
        old = read_admission(obj)
        base = old if old is not None and old.get("workload") == name else {"workload": name}
        return dict(base, **fields)

    def move(
        self,
        obj: Mapping[str, Any],
        pods: Sequence[Mapping[str, Any]],
        record: Mapping[str, Any],
        message: str,
    ) -> int:
        """Carry a move out (see the module): the record replaced, the owner's live ``pods``
        disrupted, the Event written; how many pods went. Every live pod goes, bound or not:
        the cache may not show a bind yet, and an unbound pod deleted is only recreated."""
        text = json.dumps(dict(record), separators=(",", ":"))
        self.evictor.patch_owner(obj, {"metadata": {"annotations": {ADMISSION: text}}})
        n = self.evictor.disrupt(live(pods), str(obj.get("kind")), message)
        to = where(record.get("placement") or {})
        self.evictor.event(obj, "Consolidated", f"{message}: moved to {to}, {n} pod(s) restarted", "Warning")
        return n

    def sweep(self, pods: Sequence[Mapping[str, Any]]) -> int:
        """Disrupt a Job's ``stale`` pods (a move cut short); how many went."""
        why = "Consolidated: bound for an earlier admission (a move cut short by a restart)"
        log.warning("disrupting %d pod(s) of an earlier admission: %s", len(pods), why)
        return self.evictor.disrupt(pods, "Job", why)


__all__ = ["MOVABLE_KINDS", "Mover", "refusal", "stale", "where"]
