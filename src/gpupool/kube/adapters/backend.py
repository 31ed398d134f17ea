"""``KubernetesBackend``: the controller's ``Backend`` over a cluster.

How a decision is carried out: ``start`` records the admission on the owner and unsuspends it
(one merge patch; a partially admitted Job's counts lowered first: ``admission``, the part that
writes that record and takes it back); a reconcile thread binds the gang once all its pods
exist, every pod in one pass, in parallel across nodes (``binder``); ``stop`` re-suspends the
owner, or marks the pods ``DisruptionTarget`` and deletes (or evicts) them (``evictor``);
``move`` does that to a Job's pods and binds their replacements where reserved (``moves``);
``poll`` reads outcomes from the owners' conditions and the pods (``outcomes``). The cluster is
the source of nodes (``observed_nodes``, ``down_nodes``) and, after a restart, of what runs
(``runs`` from the recorded admissions and the bound pods).

Freed devices stay reserved for the preemptor until the victims are gone, without a new
model: the engine already charges the preemptor for them the moment it decides, so nothing
else is placed there; the binder only binds a pod once the informer shows its devices free
(a deleting victim's pods still count, see ``Tracker.device_use``), and not against the deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from gpupool.kube import inventory, workloads
from gpupool.kube.adapters import elastic
from gpupool.kube.adapters import shrink as kube_shrink
from gpupool.kube.adapters.admission import OwnerAdmission
from gpupool.kube.adapters.elastic_runs import ElasticRuns
from gpupool.kube.adapters.moves import MOVABLE_KINDS, Mover, movable, refusal, stale
from gpupool.kube.adapters.recovery import adopted_runs, merge_adopted, submit_refusal
from gpupool.kube.adapters.runs import KubeRun
from gpupool.kube.client import KubeApi
from gpupool.kube.exclusive import Overbooked, PassTally, overbooked
from gpupool.kube.gangs import assign_slots, attempt_pods, decision_of, live
from gpupool.kube.nodes import NodeView
from gpupool.kube.outcomes import (
    PODS_READY_TIMEOUT,
    Outcome,
    PodsReadyPolicy,
    not_ready_reason,
    owner_outcome,
    pod_failure,
    pod_ready,
    pods_outcome,
)
from gpupool.kube.runtime.binder import Binder, BindJob, BindResult
from gpupool.kube.runtime.evictor import SUSPEND_PATH, Evictor
from gpupool.kube.runtime.informer import Informers, object_key
from gpupool.kube.runtime.tracker import OWNER_KINDS, Top, Tracker, node_of
from gpupool.model import Node
from gpupool.service.backends import BackendError, BackendHealth, Capability, RunSpec, RunState
from gpupool.store import NotLeader

log = logging.getLogger("gpupool.kube.backend")


class KubernetesBackend:
    """The Backend protocol over the Kubernetes API (see the module docstring)."""

    name = "kubernetes"
    capabilities = frozenset(Capability) - {
        Capability.BIND,
        Capability.RUN_LOGS,
        Capability.NEEDS_COMMANDS,
        Capability.TIME_SCALE,
    }

    def __init__(
        self,
        client: KubeApi | Any,
        informers: Informers,
        *,
        scheduler_name: str = "gpupool",
        bind_concurrency: int = 32,
        bind_deadline_s: float = 60.0,
        backoff_s: tuple[float, float] = (0.05, 2.0),
        inventory_options: inventory.InventoryOptions | None = None,
        clock: Callable[[], float] = time.time,
        interval_s: float = 0.05,
        pods_ready: PodsReadyPolicy | None = None,
    ) -> None:
        self.api = KubeApi.of(client)
        self.informers = informers
        self.scheduler_name = scheduler_name
        self.bind_deadline_s = bind_deadline_s
        self.backoff_s = backoff_s
        self.clock = clock
        self.interval_s = interval_s
        self.pods_ready = pods_ready or PodsReadyPolicy()
        self._wake = threading.Event()
        self.tracker = Tracker(informers, scheduler_name)
        self.tracker.attach()
        self.tracker.listeners.append(lambda _t, _p: self._wake.set())
        opts = inventory_options or inventory.InventoryOptions(scheduler_name=scheduler_name)
        self.nodes = NodeView(informers, opts)
        self.binder = Binder(self.api, informers, concurrency=bind_concurrency, clock=clock)
        self.evictor = Evictor(self.api, component=scheduler_name)
        self.mover = Mover(self.evictor)
        self.admission = OwnerAdmission(self.evictor)
        #: a bind pass and a move's change of placement exclude each other (no bind to the old one)
        self._passing = threading.RLock()
        #: every object read since this replica leads (the runtime sets it to the source's)
        self.claims_settled: Callable[[], bool] = lambda: True
        self.pool = ThreadPoolExecutor(max(4, bind_concurrency // 2), thread_name_prefix="gpupool-kube")
        self._lock = threading.RLock()
        self._runs: dict[str, KubeRun] = {}
        #: the runs of elastic owners: which pods a run counts, which stopping it disrupts, and
        #: the claims of binds in flight (``elastic_runs.py``)
        self.elastic = ElasticRuns(self.tracker, informers, self._lock)
        self._adopted = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: called (no argument) when the observed node set changed: the controller's ``nodes_changed``
        self.on_nodes_changed: Callable[[], None] | None = None
        #: only the leader binds and evicts (gpupool.kube.runtime.lease sets this; None: always)
        self.leader_gate: Callable[[], bool] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def run(self, sync_timeout_s: float = 60.0) -> None:
        """Start the caches (if not yet), wait for them, adopt what the cluster runs, and start
        the reconcile thread."""
        self.informers.start()
        if not self.informers.wait_synced(sync_timeout_s):
            raise BackendError(f"the Kubernetes caches did not sync within {sync_timeout_s:g}s")
        self._adopt()
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="gpupool-kube-binder", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.binder.close()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def reload(self) -> None:
        """Read what the cluster runs again on leading (a standby's view is from its own start)."""
        with self._lock:
            self._adopted = False
        self._adopt()

    def _adopt(self) -> None:
        with self._lock:
            if self._adopted:
                return
            merge_adopted(self._runs, adopted_runs(self.tracker, self.informers, self.clock()))
            self._adopted = True

    # -- nodes ------------------------------------------------------------------------------
    def observed_nodes(self) -> list[Node]:
        """The cluster's nodes as inventory (cordoned ones unschedulable)."""
        return self.nodes.nodes()

    def down_nodes(self, now: float) -> dict[str, str]:
        """NotReady nodes: name -> reason (the controller requeues their work)."""
        return self.nodes.down()

    def reported_unhealthy(self) -> dict[str, dict[int, str]]:
        """Devices the cluster reports unhealthy (node -> index -> reason)."""
        return self.nodes.unhealthy()

    def set_nodes(self, nodes: Sequence[Node]) -> None:
        """Configured nodes do not apply here: the cluster says which nodes exist (the
        controller replaces configured nodes with ``observed_nodes`` and logs that it did)."""

    # -- the protocol -----------------------------------------------------------------------
    def start(self, runs: Sequence[RunSpec]) -> None:
        self._adopt()
        refused: list[str] = []
        fresh: list[tuple[KubeRun, dict[str, Any]]] = []
        now = self.clock()
        with self._lock:
            for spec in runs:
                decision = decision_of(spec.placement)
                old = self._runs.get(spec.name)
                if old is not None and old.decision == decision:
                    continue  # idempotent: the same admission (maybe adopted after a restart)
                top = self.elastic.top_of(spec.name)
                obj = self.tracker.owner_object(top) if top is not None else None
                if top is None or obj is None:
                    refused.append(f"{spec.name}: no Kubernetes object stands for this workload")
                    continue
                run = KubeRun(spec.name, top, dict(spec.placement), now, spec.duration_s, decision)
                run.kw = self._translate(top, obj)
                self._runs[spec.name] = run
                fresh.append((run, obj))
        errors = list(self.pool.map(lambda ro: self._admit(*ro), fresh))
        refused += [e for e in errors if e]
        self._wake.set()
        if refused:
            raise BackendError("; ".join(refused))

    def _translate(self, top: Top, obj: Mapping[str, Any]) -> workloads.KubeWorkload | None:
        try:
            if top[0] in OWNER_KINDS:
                return workloads.workload_from_object(obj, self.tracker.defaults)
            return workloads.workload_from_pods(self.tracker.pods(top), self.tracker.defaults)
        except workloads.KubeWorkloadError:
            return None

    def _admit(self, run: KubeRun, obj: Mapping[str, Any]) -> str:
        if self.elastic.is_extra(run):
            return ""  # the owner's admission record is its base's; an extra is rebuilt from its pod
        try:
            self.admission.admit(run, obj)
        except Exception as exc:
            with self._lock:
                self._runs.pop(run.name, None)
            self.admission.restore(run, obj)
            return f"{run.name}: could not admit {obj.get('kind')} {run.top[2]}: {exc}"
        return ""

    def stop(self, names: Sequence[str]) -> None:
        with self._lock:
            gone = [r for n in names if (r := self._runs.pop(n, None)) is not None]
        list(self.pool.map(self._preempt, gone))

    def _preempt(self, run: KubeRun) -> None:
        obj = self.tracker.owner_object(run.top)
        if obj is None:
            return
        kind = run.top[0]
        msg = f"gpupool stopped workload {run.name} (preempted, cancelled or moved off a failed node)"
        try:
            if kind in SUSPEND_PATH:
                self.evictor.release(obj, suspend=True)  # its controller deletes the pods
                self.admission.restore(run, obj)  # after the suspend: never more pods than placed
            else:
                if not self.elastic.is_extra(run):  # an extra leaves its base (and the record) alone
                    self.evictor.release(obj, suspend=False)
                self.evictor.disrupt(self.elastic.victims(run), kind, msg)
            self.evictor.event(obj, "Stopped", msg, "Warning")
        except Exception:
            log.exception("stopping %s failed; its pods may linger", run.name)

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
            pods = self.elastic.pods(replace(run, placement=before))
            kube_shrink.shrink_owner(self.evictor, run, obj, pods, placement, message)
        except Exception:
            log.exception("shrinking %s failed; its removed pods may linger", name)

    #: ``Capability.MOVABLE``: only a batch/v1 Job's run is moved (``moves.movable``)
    movable = staticmethod(movable)

    def move(self, spec: RunSpec, message: str = "") -> bool:
        """A consolidation move (the engine's ``Move``, ``kube/adapters/moves.py``): the run's Job
        re-bound to ``spec.placement``. Idempotent: an unknown or ended run, or one already on this
        admission, is left alone; False (nothing done, why logged) for a kind not movable."""
        if self.leader_gate is not None and not self.leader_gate():
            raise NotLeader("this replica does not hold the lease: it must not move pods")
        decision = decision_of(spec.placement)
        # The bind pass waits (``_passing``) until the move's writes are done: it would otherwise
        # see the run's new decision with the old pods still live, take them for a move a restart
        # cut short and disrupt them itself (``Mover.sweep``), racing the move's own disruption
        # and its reason (seen on a real API server, issue 24).
        with self._passing:
            with self._lock:
                run = self._runs.get(spec.name)
                if run is None or run.outcome is not None or run.decision == decision:
                    return True
                obj = self.tracker.owner_object(run.top)
                if (why := refusal(run.top[0]) or ("" if obj else "its owner is gone")) or obj is None:
                    log.warning("cannot move %s on Kubernetes: %s", spec.name, why)
                    return False
                run.placement, run.decision = dict(spec.placement), decision
                run.started_at, run.duration_s = self.clock(), spec.duration_s
                run.bound, run.ready, run.first_try, run.tries, run.next_try = False, False, None, 0, 0.0
                fields = {"placement": run.placement, "decision": decision, "startedAt": run.started_at}
                record = self.mover.record(obj, run.name, fields | {"durationS": run.duration_s})
            try:
                self.mover.move(obj, self.elastic.pods(run), record, message or "consolidation")
            except Exception as exc:
                raise BackendError(f"moving {spec.name} failed: {exc}") from exc
            finally:
                self._wake.set()
        return True

    def poll(self, now: float) -> list[RunState]:
        with self._lock:
            runs = list(self._runs.values())
        out = []
        for run in runs:
            if run.outcome is None:
                run.outcome = self._outcome(run)
            if run.outcome is not None:
                out.append(run.state())
        return out

    def _outcome(self, run: KubeRun) -> Outcome | None:
        obj = self.tracker.owner_object(run.top)
        pods = attempt_pods(self.elastic.pods(run), run.decision)
        for p in pods:
            f = pod_failure(p)
            if f is not None:
                return f
        if run.top[0] in OWNER_KINDS:
            if obj is None:
                return Outcome("Failed", f"{run.top[0]} {run.top[2]} was deleted", None, "Deleted")
            return owner_outcome(obj) if run.bound else None
        return pods_outcome(pods, len(run.placement.get("pods") or ()))

    def forget(self, names: Sequence[str]) -> None:
        with self._lock:
            gone = [r for n in names if (r := self._runs.pop(n, None)) is not None]
        list(self.pool.map(self._clean_up, gone))

    def _clean_up(self, run: KubeRun) -> None:
        """A finished run's owner forgets its admission (``OwnerAdmission.release``); an
        extra's owner keeps its base's."""
        obj = self.tracker.owner_object(run.top)
        if obj is not None and not self.elastic.is_extra(run):
            self.admission.release(run, obj)

    def runs(self) -> dict[str, RunState]:
        self._adopt()
        with self._lock:
            return {n: r.state() for n, r in self._runs.items()}

    def health(self) -> BackendHealth:
        synced = all(inf.served is False or inf.wait_synced(0) for inf in self.informers.by_kind.values())
        with self._lock:
            binding = sum(1 for r in self._runs.values() if not r.bound and r.outcome is None)
            detail = {
                "backend": self.name,
                "synced": synced,
                "nodes": len(self.informers.nodes),
                "runs": len(self._runs),
                "binding": binding,
                "binder": dict(self.binder.stats),
                "requests": dict(self.api.requests),
            }
        return BackendHealth(synced, detail)

    def vouches(self, name: str) -> bool:
        """The cluster runs ``name`` as admitted (a record on its owner: service.adoption)."""
        run = self._runs.get(name)
        return run is not None and bool(run.decision) and self.tracker.owner_object(run.top) is not None

    def overbooked(self) -> list[Overbooked]:
        """Devices held beyond capacity, as the pods show it (anything but [] is a bug)."""
        return overbooked(self.informers.pods.items())

    def refuses(self, name: str, submitter: str) -> str | None:
        """Why an API submission cannot run here (asked by the submit path)."""
        return submit_refusal(name, submitter, self.elastic.top_of(name) is not None)

    def next_finish(self) -> float | None:
        """Look again soon while anything is being bound (the controller sleeps until then)."""
        return None

    # -- the reconcile loop -----------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s * 4)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.nodes.refresh()
                if self.nodes.take_changed() and self.on_nodes_changed is not None:
                    self.on_nodes_changed()
                if self.leader_gate is None or self.leader_gate():
                    self.bind_pass()
                    self.ready_pass()
            except Exception:
                log.exception("kubernetes reconcile pass failed")
            self._stop.wait(self.interval_s)

    def bind_pass(self) -> int:
        """Bind every gang whose pods all exist and whose devices are free; returns binds done."""
        with self._passing:
            return self._bind_pass()

    def _bind_pass(self) -> int:
        now = self.clock()
        self.elastic.prune_claims()
        with self._lock:
            todo = [r for r in self._runs.values() if r.outcome is None and r.next_try <= now]
        todo = [r for r in todo if not r.bound or self.elastic.heals(r)]
        jobs: list[BindJob] = []
        ready: list[KubeRun] = []
        tally = PassTally(lambda node, exclude: self.tracker.device_use(node, exclude=set(exclude)))
        for run in todo:
            js = self._jobs_of(run, tally)
            if js is None:
                continue
            if not js:
                run.bound = True
                continue
            if run.bound:  # a replica its controller replaced: the slot's devices are still its own
                run.bound, run.first_try, run.tries = False, None, 0
            if run.first_try is None:
                run.first_try = now
            if run.top[0] in elastic.SERVING_KINDS:
                with self._lock:
                    self.elastic.claims.update({object_key(j.pod): run.name for j in js})
            jobs += js
            ready.append(run)
        if not jobs:
            return 0
        results = self.binder.bind_all(jobs)
        self._settle(ready, results, now)
        return sum(1 for r in results if r.ok)

    def _jobs_of(self, run: KubeRun, tally: PassTally) -> list[BindJob] | None:
        """The binds a gang needs now ([] when all are bound), or None while it must wait (its
        pods do not all exist yet, or a pod still holds a device: ``tally``'s proof)."""
        pods = self.elastic.pods(run)
        if run.top[0] in MOVABLE_KINDS and (left := stale(pods, run.decision)):
            self.mover.sweep(left)  # a move a restart cut short: its old pods never went
        if run.untranslated and any(not node_of(p) for p in live(pods)):
            run.untranslated = False
            obj = self.tracker.owner_object(run.top)
            run.kw = self._translate(run.top, obj) if obj is not None else None
        pairs = assign_slots(run, pods)
        if pairs is None:
            return None
        wants = [
            (str(pp["node"]), [int(d) for d in pp.get("devices", ())], int(pp.get("gpuMilli", 1000)))
            for _, pp in pairs
        ]
        if not tally.claim(wants, {object_key(p) for p, _ in pairs}):
            return None  # reserved for this run: the pods holding it are still leaving
        return [
            BindJob(run.name, run.decision, pod, pp, self.nodes.devices(str(pp["node"]))) for pod, pp in pairs
        ]

    def _settle(self, ready: Sequence[KubeRun], results: Sequence[BindResult], now: float) -> None:
        by_run: dict[str, list[BindResult]] = {}
        for r in results:
            by_run.setdefault(r.job.workload, []).append(r)
        for run in ready:
            rs = by_run.get(run.name, [])
            if not rs:
                continue  # the binder stopped (closing) before any of its binds: try again
            for r in rs:
                if r.ok:
                    pp = r.job.placement
                    devs = tuple(int(d) for d in pp.get("devices", ()))
                    self.tracker.assume(r.job.pod, str(pp["node"]), devs, int(pp.get("gpuMilli", 1000)))
            bad = [r for r in rs if not r.ok]
            with self._lock:
                for r in bad:
                    self.elastic.claims.pop(object_key(r.job.pod), None)
            if not bad:
                run.bound = True
                continue
            run.tries += 1
            run.last_error = bad[0].message
            lo, hi = self.backoff_s
            run.next_try = now + min(hi, lo * 2 ** min(run.tries - 1, 10))
            fatal = any(r.fatal for r in bad)
            if fatal or (run.first_try is not None and now - run.first_try > self.bind_deadline_s):
                just = [r.job.pod for r in rs if r.ok]  # bound this pass: not in the cache yet
                self._unbind(run, f"binding failed after {run.tries} tries: {run.last_error}", just)

    def ready_pass(self, now: float | None = None) -> int:
        """Kueue's ``waitForPodsReady``: a gang not all Ready ``pods_ready.timeout_s`` after its
        admission (waiting for its pods to be created, bound or started all count) is evicted
        like a gang that cannot bind, with reason ``PodsReadyTimeout``; the controller requeues
        it under its retry policy. Returns the gangs evicted."""
        limit = self.pods_ready.timeout_s
        if limit is None:
            return 0
        now = self.clock() if now is None else now
        with self._lock:
            todo = [r for r in self._runs.values() if r.outcome is None and not r.ready]
        evicted = 0
        for run in todo:
            want = len(run.placement.get("pods") or ())
            mine = self.elastic.pods(run)
            pods = attempt_pods(mine, run.decision) if run.bound else live(mine)
            if run.bound and len(pods) >= want and all(pod_ready(p) for p in pods):
                run.ready = True
            elif now - run.started_at > limit:
                why = f"{PODS_READY_TIMEOUT}: {not_ready_reason(pods, want, limit)}"
                self._unbind(run, why, reason=PODS_READY_TIMEOUT)
                evicted += 1
        return evicted

    def _unbind(
        self,
        run: KubeRun,
        why: str,
        just_bound: Sequence[Mapping[str, Any]] = (),
        reason: str = "BindFailed",
    ) -> None:
        """Give up a gang and report it failed with ``reason`` (``BindFailed``: a platform fault;
        ``PodsReadyTimeout``: counted under the workload's retry policy). A suspendable owner is
        suspended and its controller removes the pods (other owners' bound pods are deleted): a
        real Job controller counts a deleted pod against ``backoffLimit`` (0: the Job fails and
        is never requeued), not the pods of a suspended Job (issue 24)."""
        bound = {object_key(p): p for p in attempt_pods(self.elastic.pods(run), run.decision)}
        bound.update({object_key(p): p for p in just_bound})
        obj = self.tracker.owner_object(run.top)
        try:
            if obj is not None and run.top[0] in SUSPEND_PATH and not self.elastic.is_extra(run):
                self.evictor.release(obj, suspend=True)
                self.admission.restore(run, obj)  # after the suspend: never more pods than placed
            else:
                self.evictor.delete_pods(list(bound.values()))
        except Exception:
            log.exception("removing the bound pods of %s failed", run.name)
        run.outcome = Outcome("Failed", why, None, reason)
        if obj is not None:
            self.evictor.event(obj, reason, why, "Warning")
        log.warning("%s: %s", run.name, why)


def connect(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    namespace: str | None = None,
    sync_timeout_s: float = 60.0,
    **options: Any,
) -> KubernetesBackend:
    """A running backend for the cluster a kubeconfig (or the pod's service account) names:
    its caches synced and what the cluster runs adopted, ready for ``Controller.recover``."""
    from gpupool.kube.client import make_client

    api = KubeApi(make_client(kubeconfig, context))
    backend = KubernetesBackend(api, Informers(api, namespace=namespace), **options)
    backend.run(sync_timeout_s)
    return backend


__all__ = ["KubeRun", "KubernetesBackend", "connect", "decision_of"]
