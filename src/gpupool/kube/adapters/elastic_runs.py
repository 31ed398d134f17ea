"""The Kubernetes backend's view of elastic owners (推理弹性, ``gpupool.kube.adapters.elastic``):
a base workload and its extras are separate runs that share one Deployment's (or StatefulSet's)
pods.

Why a mixin of ``KubernetesBackend`` rather than more methods in it: these are the few questions
the backend asks differently for such owners (which top owner an extra's name stands for, which
of the owner's pods a run may count, which pods stopping it disrupts, whether a bound run is
looked at again), and ``backend.py`` stays one idea per module and under the size limit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpupool.kube.adapters import elastic
from gpupool.kube.adapters import shrink as kube_shrink
from gpupool.kube.gangs import live
from gpupool.kube.runtime.evictor import Evictor
from gpupool.kube.runtime.informer import Informers, object_key
from gpupool.kube.runtime.tracker import PodKey, Top, Tracker, is_terminal, node_of

if TYPE_CHECKING:
    from gpupool.kube.adapters.runs import KubeRun

log = logging.getLogger("gpupool.kube.backend")


class ElasticRuns:
    """What ``KubernetesBackend`` asks about the runs of elastic owners (see the module)."""

    tracker: Tracker
    informers: Informers
    _lock: threading.RLock
    #: pods of serving owners whose bind is in flight or not yet in the cache -> the run binding
    #: them (a base and its extras bind pods of one ReplicaSet)
    _claims: dict[PodKey, str]

    _runs: dict[str, KubeRun]
    evictor: Evictor

    def shrink(self, name: str, placement: Mapping[str, Any], message: str = "") -> None:
        """An elastic gang keeps only the pods of ``placement`` (the engine's ``Shrink``): a Job
        runs with ``parallelism`` lowered, other kinds lose single pods
        (``kube/adapters/shrink.py``). An unknown or ended run is left alone (idempotent, like ``stop``)."""
        with self._lock:
            run = self._runs.get(name)
            if run is None or run.outcome is not None:
                return
            before = run.placement
            run.placement = dict(placement)
        obj = self.tracker.owner_object(run.top)
        if obj is None:
            return
        try:
            kube_shrink.shrink_owner(
                self.evictor, run, obj, self._pods(replace(run, placement=before)), placement, message
            )
        except Exception:
            log.exception("shrinking %s failed; its removed pods may linger", name)

    def _top_of(self, name: str) -> Top | None:
        """The top owner standing for a workload; an extra (``<base>-extra-<i>``) has its base's."""
        top = self.tracker.top_by_name(name)
        if top is None and (of := elastic.base_of(name)) is not None:
            base = self.tracker.top_by_name(of[0])
            top = base if base is not None and base[0] in elastic.SERVING_KINDS else None
        return top

    def _is_extra(self, run: KubeRun) -> bool:
        """An extra replica's run: on a serving owner that stands for another workload."""
        if run.top[0] not in elastic.SERVING_KINDS or elastic.base_of(run.name) is None:
            return False
        return self.tracker.name_of(run.top) != run.name

    def _pods(self, run: KubeRun) -> list[dict[str, Any]]:
        """The owner's pods this run may count as its own (``elastic.replica_pods``)."""
        pods = self.tracker.pods(run.top)
        if run.top[0] not in elastic.SERVING_KINDS:
            return pods
        with self._lock:
            claims = dict(self._claims)
        slots = len(run.placement.get("pods") or ())
        return elastic.replica_pods(pods, run.name, run.top[0], slots, claims)

    def _victims(self, run: KubeRun) -> list[Mapping[str, Any]]:
        """The pods stopping a run disrupts: an extra's are only those it bound (or is binding);
        the base's are the owner's pods that no extra holds."""
        pods: Sequence[Mapping[str, Any]] = self._pods(run)
        if self._is_extra(run):
            with self._lock:
                mine = {k for k, r in self._claims.items() if r == run.name}
            pods = [p for p in pods if node_of(p) or object_key(p) in mine]
        return live(pods)

    def _heals(self, run: KubeRun) -> bool:
        """A bound run of an elastic owner is looked at again every pass: its controller replaces
        a replica deleted under it (a scale-down takes any pod, not the extras'), and the
        replacement must be bound into the slot the engine still charges it for. Not while a bind
        of its own is not in the cache yet (that pod would look unbound, its slot free)."""
        if run.top[0] not in elastic.SERVING_KINDS:
            return False
        with self._lock:
            if run.name in self._claims.values():
                return False
        return elastic.is_elastic_owner(self.tracker.owner_object(run.top))

    def _prune_claims(self) -> None:
        """Forget the claims the cache has caught up with (bound, ended or gone)."""
        with self._lock:
            for k in list(self._claims):
                if not (p := self.informers.pods.get(*k)) or node_of(p) or is_terminal(p):
                    del self._claims[k]


__all__ = ["ElasticRuns"]
