"""The Kubernetes backend's view of elastic owners (推理弹性, ``gpupool.kube.adapters.elastic``):
a base workload and its extras are separate runs that share one Deployment's (or StatefulSet's)
pods.

Why a part the backend holds (``KubernetesBackend.elastic``) rather than more methods in it:
these are the few questions the backend asks differently for such owners (which top owner an
extra's name stands for, which of the owner's pods a run may count, which pods stopping it
disrupts, whether a bound run is looked at again), over state of their own (the claims of binds
in flight); it shares the backend's lock, since a bind pass reads the claims and the runs
together.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpupool.kube.adapters import elastic
from gpupool.kube.gangs import live
from gpupool.kube.runtime.informer import Informers, object_key
from gpupool.kube.runtime.tracker import PodKey, Top, Tracker, is_terminal, node_of

if TYPE_CHECKING:
    from gpupool.kube.adapters.runs import KubeRun

log = logging.getLogger("gpupool.kube.backend")


class ElasticRuns:
    """What ``KubernetesBackend`` asks about the runs of elastic owners (see the module)."""

    def __init__(self, tracker: Tracker, informers: Informers, lock: threading.RLock) -> None:
        self.tracker = tracker
        self.informers = informers
        self.lock = lock
        #: pods of serving owners whose bind is in flight or not yet in the cache -> the run
        #: binding them (a base and its extras bind pods of one ReplicaSet); read and written
        #: under ``lock``
        self.claims: dict[PodKey, str] = {}

    def top_of(self, name: str) -> Top | None:
        """The top owner standing for a workload; an extra (``<base>-extra-<i>``) has its base's."""
        top = self.tracker.top_by_name(name)
        if top is None and (of := elastic.base_of(name)) is not None:
            base = self.tracker.top_by_name(of[0])
            top = base if base is not None and base[0] in elastic.SERVING_KINDS else None
        return top

    def is_extra(self, run: KubeRun) -> bool:
        """An extra replica's run: on a serving owner that stands for another workload."""
        if run.top[0] not in elastic.SERVING_KINDS or elastic.base_of(run.name) is None:
            return False
        return self.tracker.name_of(run.top) != run.name

    def pods(self, run: KubeRun) -> list[dict[str, Any]]:
        """The owner's pods this run may count as its own (``elastic.replica_pods``)."""
        pods = self.tracker.pods(run.top)
        if run.top[0] not in elastic.SERVING_KINDS:
            return pods
        with self.lock:
            claims = dict(self.claims)
        slots = len(run.placement.get("pods") or ())
        return elastic.replica_pods(pods, run.name, run.top[0], slots, claims)

    def victims(self, run: KubeRun) -> list[Mapping[str, Any]]:
        """The pods stopping a run disrupts: an extra's are only those it bound (or is binding);
        the base's are the owner's pods that no extra holds."""
        pods: Sequence[Mapping[str, Any]] = self.pods(run)
        if self.is_extra(run):
            with self.lock:
                mine = {k for k, r in self.claims.items() if r == run.name}
            pods = [p for p in pods if node_of(p) or object_key(p) in mine]
        return live(pods)

    def heals(self, run: KubeRun) -> bool:
        """A bound run of an elastic owner is looked at again every pass: its controller replaces
        a replica deleted under it (a scale-down takes any pod, not the extras'), and the
        replacement must be bound into the slot the engine still charges it for. Not while a bind
        of its own is not in the cache yet (that pod would look unbound, its slot free)."""
        if run.top[0] not in elastic.SERVING_KINDS:
            return False
        with self.lock:
            if run.name in self.claims.values():
                return False
        return elastic.is_elastic_owner(self.tracker.owner_object(run.top))

    def prune_claims(self) -> None:
        """Forget the claims the cache has caught up with (bound, ended or gone)."""
        with self.lock:
            for k in list(self.claims):
                if not (p := self.informers.pods.get(*k)) or node_of(p) or is_terminal(p):
                    del self.claims[k]


__all__ = ["ElasticRuns"]
