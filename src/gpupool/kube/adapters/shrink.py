"""Elastic shrink on Kubernetes (the engine's ``Shrink``, issue 27 item 5): a running gang keeps
only the pods of its new placement.

Why these steps, in this order:

* **A Job gets ``spec.parallelism`` lowered first** (and ``completions`` where they follow: an
  Indexed Job with completions equal to parallelism), with the same merge patch partial
  admission uses (``translate.partial.admit_patch``: the originals kept in
  ``gpupool.io/original-*``, so the translation still reads the workload as submitted and a
  later suspension gives them back). Lowered before any pod goes, its controller never makes a
  replacement for a removed pod.
* **Then the removed pods go**, marked ``DisruptionTarget`` (``PreemptionByScheduler``) and
  deleted, or evicted through the Eviction API for serving kinds (``Evictor.disrupt``): other
  kinds have no count to lower, so single pods are evicted. Only pods bound into the removed
  slots (``gpupool.io/pod-index``) are touched.
* **The admission record on the owner follows** (``gpupool.io/admission``), so a restarted
  backend resumes the smaller placement.

Differs from Kubernetes' own scale-down: the engine, not the Job controller, chooses which pods
go (the ones whose devices make room); a Job without a backoff policy that ignores
``DisruptionTarget`` may count a deleted pod as failed, as with any preemption.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpupool.kube import annotations as kube_ann
from gpupool.kube.gangs import live
from gpupool.kube.runtime.evictor import ADMISSION, Evictor, read_admission
from gpupool.kube.runtime.tracker import node_of
from gpupool.kube.translate import partial

if TYPE_CHECKING:
    from gpupool.kube.adapters.runs import KubeRun

log = logging.getLogger("gpupool.kube.shrink")


def slots(placement: Mapping[str, Any]) -> set[tuple[str, int]]:
    """The (group, index) slots a placement holds."""
    return {(str(p.get("group", "")), int(p.get("index", 0))) for p in placement.get("pods") or ()}


def removed_pods(pods: Sequence[Mapping[str, Any]], keep: set[tuple[str, int]]) -> list[Mapping[str, Any]]:
    """The live bound pods whose slot the new placement no longer holds."""
    out = []
    for p in live(pods):
        b = kube_ann.read_bound(p)
        if b is not None and node_of(p) and (b.group, b.index) not in keep:
            out.append(p)
    return out


def owner_patch(run: KubeRun, obj: Mapping[str, Any], placement: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch of the owner: a Job's counts lowered to the kept pods, and the admission
    record's placement replaced (where the owner carries one). Sets ``run.restore`` for a Job
    reduced here first, so a suspension gives it its counts back."""
    patch: dict[str, Any] = {}
    if run.top[0] == "Job":
        patch = partial.admit_patch(obj, len(placement.get("pods") or ()))
        if patch and run.restore is None:
            run.restore = partial.restore_patch(patch) or None
    record = read_admission(obj)
    if record is not None and record.get("workload") == run.name:
        record = dict(record, placement=dict(placement), admittedPods=len(placement.get("pods") or ()))
        ann = patch.setdefault("metadata", {}).setdefault("annotations", {})
        ann[ADMISSION] = json.dumps(record, separators=(",", ":"))
    return patch


def shrink_owner(
    evictor: Evictor,
    run: KubeRun,
    obj: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    placement: Mapping[str, Any],
    message: str,
) -> int:
    """Carry a shrink out on the owner and its pods (see the module); how many pods went."""
    gone = removed_pods(pods, slots(placement))
    patch = owner_patch(run, obj, placement)
    if patch:
        evictor.patch_owner(obj, patch)
    n = evictor.disrupt(gone, run.top[0], message)
    kept = len(placement.get("pods") or ())
    evictor.event(obj, "Shrunk", f"{message}: {n} pod(s) removed, {kept} keep running", "Warning")
    return n
