"""What the cluster runs, rebuilt after a restart: the admissions recorded on owners, and the
pods gpupool bound (their annotations are the truth of what is bound where).

Why both: a recorded admission whose gang is only partly bound (the process died in the middle)
must be resumed with the exact placement decided, which only the record holds; a bound pod
whose owner lost its record (edited by hand) still occupies its devices and must be reported,
so the controller stops it if the store no longer wants it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpupool.kube import annotations as kube_ann
from gpupool.kube.adapters.runs import KubeRun
from gpupool.kube.runtime.evictor import read_admission
from gpupool.kube.runtime.informer import Informers
from gpupool.kube.runtime.tracker import OWNER_KINDS, Top, Tracker


def _recorded(tracker: Tracker, informers: Informers) -> Iterable[tuple[Top, dict[str, Any]]]:
    for kind, attr in OWNER_KINDS.items():
        for obj in getattr(informers, attr).items():
            rec = read_admission(obj)
            if rec is not None:
                md = obj.get("metadata") or {}
                yield (kind, str(md.get("namespace") or ""), str(md.get("name") or "")), rec
    for pod in informers.pods.items():
        rec = read_admission(pod)
        if rec is not None:
            yield tracker.top_owner(pod), rec


def adopted_runs(tracker: Tracker, informers: Informers, now: float) -> list[KubeRun]:
    """The runs the cluster holds (recorded admissions first, then bound pods without one)."""
    out: dict[str, KubeRun] = {}
    for top, rec in _recorded(tracker, informers):
        name = str(rec["workload"])
        dur = rec.get("durationS")
        run = KubeRun(
            name,
            top,
            dict(rec["placement"]),
            float(rec.get("startedAt") or now),
            float(dur) if dur is not None else None,
            str(rec.get("decision", "")),
        )
        out.setdefault(name, run)
    loose: dict[str, list[tuple[Top, dict[str, Any], str]]] = {}
    for pod in tracker.managed_bound():
        b = kube_ann.read_bound(pod)
        if b is None or b.workload in out:
            continue
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        entry = {
            "group": b.group,
            "index": b.index,
            "node": b.node,
            "devices": list(b.devices),
            "gpuMilli": b.gpu_milli,
            "gpuMemoryMiB": b.gpu_memory_mib,
        }
        loose.setdefault(b.workload, []).append(
            (tracker.top_owner(pod), entry, str(ann.get(kube_ann.DECISION, "")))
        )
    for name, entries in loose.items():
        pods = sorted((e for _, e, _ in entries), key=lambda e: (e["group"], e["index"]))
        top, _, decision = entries[0]
        run = KubeRun(name, top, {"pods": pods}, now, None, decision)
        run.bound = True
        out[name] = run
    return list(out.values())


def merge_adopted(runs: dict[str, KubeRun], adopted: Iterable[KubeRun]) -> None:
    """Take the cluster's runs into ``runs``: a run not known, or known with another decision
    than the cluster records, is replaced by the cluster's; a run already known with the same
    decision keeps its state.

    Why no translation here: after a restart nearly every adopted gang is fully bound and never
    needs its pod slots; translating (and validating) 1,600 Jobs took seconds of
    restart-to-first-bind. ``_jobs_of`` translates the few that still bind."""
    for run in adopted:
        run.untranslated = True
        old = runs.get(run.name)
        if old is None or old.decision != run.decision:
            runs[run.name] = run


def submit_refusal(name: str, submitter: str, has_object: bool) -> str | None:
    """Why a workload submitted through gpupool's API cannot run on Kubernetes, or None.

    Why at submit: on this backend a workload runs as the pods of a Kubernetes object (a Job, a
    JobSet, a Deployment ...). A gpupool Workload sent to the API has none, so once admitted it
    would first preempt what it needs and then fail to start; refused here, nothing is disturbed.
    The Kubernetes source's own submissions always pass (it submits only what it watches)."""
    from gpupool.kube.adapters.source import SYSTEM_NAME

    if submitter == SYSTEM_NAME or has_object:
        return None
    return (
        f"no Kubernetes object stands for workload {name}: on the Kubernetes backend work is "
        "created as Kubernetes objects with kubectl (e.g. a batch/v1 Job labelled "
        "kueue.x-k8s.io/queue-name: <queue>, or a pod with schedulerName gpupool), which gpupool "
        "takes on by itself"
    )


__all__ = ["adopted_runs", "merge_adopted", "submit_refusal"]
