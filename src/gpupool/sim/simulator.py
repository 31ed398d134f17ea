"""Discrete-event simulation in virtual time around the real, unchanged scheduling engine.

Events (arrivals, completions, abnormal exits, node failures and repairs, retry timers) sit in a
heap; all events at one timestamp are applied first, then the engine runs one cycle (only when
something changed). The engine is used incrementally: ``Engine.cycle`` decides without changing
state, ``Engine.apply`` makes admissions permanent, ``Engine.remove_running`` releases.

Which pending workloads a cycle is given (the *window rule*, exact by construction)
----------------------------------------------------------------------------------------
The engine's cost grows with the pending list, and most of a long backlog cannot move. Pending
workloads are grouped per queue into *classes* of identical scheduling shape (queue, priority,
preemptible, pod groups, GPU models, topology, tolerations, selector, gang, pool), each class
ordered by the engine's own order key. A cycle is given:

* for a StrictFIFO queue, or any queue when ``one_head_per_queue`` is on: the first ``K`` pending
  workloads of the queue in order (a *queue window*);
* for any other queue: the first ``k`` members of each class (a *class window*).

After the cycle the simulator checks that the windows could not have changed the outcome, and
otherwise enlarges them and runs the cycle again (``cycle`` has no side effects):

* StrictFIFO queue window: some member was not admitted. Everything after it was BLOCKED (or
  SKIPPED) by the engine, so members outside the window would be too.
* one-head queue window: some member was SKIPPED, i.e. the engine stopped inside the window.
* class window: some member was tried and failed (QuotaExceeded, InsufficientCapacity,
  TopologyUnsatisfiable, NoMatchingPool) and the cycle preempted nothing. A later member of the
  same class is tried later in the same cycle with the same quota vector, at a state that only
  got tighter (no preemption means nothing was freed), so it fails too, and a failure changes no
  state. If the cycle preempted, every truncated class is given whole.

``tests/test_sim.py`` checks on generated traces that this gives the same results as passing
every pending workload to every cycle.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpupool.engine import Decisions, PendingCode, apply_decisions
from gpupool.engine.fragscore import add_shapes
from gpupool.engine.invariants import check_cycle
from gpupool.engine.windowed import MixEngine
from gpupool.model import (
    Node,
    PlacementPolicy,
    PodGroup,
    PodRequest,
    PriorityClass,
    Queue,
    QueueingStrategy,
    ResourcePool,
    Running,
    Snapshot,
    Workload,
)
from gpupool.sim.baselines import Policy
from gpupool.sim.pending import PendingSet, declared_duration, scheduling_shape
from gpupool.sim.results import Event, JobRecord, RunResult
from gpupool.sim.scenario import Faults, Scenario, Variant, fifo_queues
from gpupool.sim.sources import JobSpec

# event kinds, in the order they are applied within one timestamp
FINISH, JOB_FAULT, NODE_FAIL, NODE_REPAIR, ARRIVAL, RETRY, TICK = range(7)
FAILED_CODES = frozenset({PendingCode.QUOTA, PendingCode.CAPACITY, PendingCode.TOPOLOGY, PendingCode.NO_POOL})


#: the engine, counting the shapes a window leaves out (gpupool.engine.windowed)
_Engine = MixEngine


class Simulation:
    """One policy on one cluster variant over one trace."""

    #: grow class windows during a cycle (the engine's ``more``) rather than by running it again
    pull_windows = True

    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        variant: Variant,
        check_invariants: bool = False,
        full_pending: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.sc = scenario
        self.policy = policy
        self.variant = variant
        self.check = check_invariants
        self.full_pending = full_pending
        self.progress = progress
        self.faults: Faults = scenario.faults
        pools = variant.pools
        if policy.single_fifo_queue:
            pools = tuple(replace(p, placement=PlacementPolicy.DEFAULT) for p in pools)
            self.queues: tuple[Queue, ...] = fifo_queues(pools, variant.nodes)
        else:
            self.queues = variant.queues
        self.pools: tuple[ResourcePool, ...] = pools
        self.nodes: list[Node] = list(variant.nodes)
        self.pcs: dict[str, PriorityClass] = {p.name: p for p in variant.priority_classes}
        self.config = policy.config
        self.down: set[str] = set()
        self.head_queues = {q.name for q in self.queues if q.strategy is QueueingStrategy.STRICT_FIFO}
        self.one_head = self.config.one_head_per_queue
        # window sizes that were enough last time (a hint only: every cycle is verified)
        self.k_hint: dict[int, int] = {}
        self._rejects: dict[tuple[object, ...], str] = {}
        self.kq_hint: dict[str, int] = {}
        self.engine_calls = 0
        self.holders: set[str] = set()
        self.last_held: dict[str, object] = {}

    def _uses_shape_mix(self, eng: MixEngine) -> bool:
        """Only the fragmentation scorer weighs placements against the mix of waiting shapes;
        ``auto`` alone does where nodes differ or a job shares a GPU (as the engine decides)."""
        shared = any(j.gpu_milli and not j.gpus for j in self.sc.trace.jobs)
        return eng.weighs_shape_mix(shared)

    # -- model objects --------------------------------------------------------------------------
    def _workload(self, j: JobSpec) -> Workload:
        req = PodRequest(
            gpus=j.gpus,
            gpu_milli=j.gpu_milli if not j.gpus else 0,
            cpu_milli=j.cpu_milli,
            memory_mib=j.memory_mib,
        )
        groups = (PodGroup("main", j.replicas, req),)
        if self.policy.single_fifo_queue:  # one queue, no priorities: a cluster without a scheduler
            queue, pc_name, prio, pre = "fifo", "", 0, False
        else:
            pc = self.pcs.get(j.priority_class)
            queue, pc_name = j.queue, j.priority_class
            prio, pre = (pc.value, pc.preemptible) if pc else (0, True)
        return Workload(
            name=j.name,
            queue=queue,
            pod_groups=groups,
            priority_class=pc_name,
            priority=prio,
            preemptible=pre,
            type=j.type,
            gpu_models=j.gpu_models,
            expected_duration_s=j.duration,
            arrival=j.submit,
        )

    def _snapshot(self, pending: tuple[Workload, ...], now: float) -> Snapshot:
        nodes = tuple(replace(n, schedulable=False) if n.name in self.down else n for n in self.nodes)
        return Snapshot(
            nodes=nodes,
            pools=self.pools,
            queues=self.queues,
            priority_classes=tuple(self.pcs.values()),
            pending=pending,
            running=tuple(self.running.values()),
            now=now,
            config=self.config,
        )

    def _new_engine(self, now: float) -> MixEngine:
        return _Engine(self._snapshot((), now))

    # -- feasibility (reported, never silently dropped) ------------------------------------------
    def _reject_reason(self, w: Workload, j: JobSpec) -> str:
        # the answer depends on the trace's queue and the workload's shape only (the node list is
        # fixed for the run; under the single FIFO queue ``w.queue`` is not the trace's queue)
        key = (j.queue, scheduling_shape(w))
        got = self._rejects.get(key)
        if got is None:
            got = self._rejects[key] = self._shape_reject_reason(j)
        return got

    def _shape_reject_reason(self, j: JobSpec) -> str:
        known = {n.gpu_model for n in self.nodes}
        if j.gpu_models and not set(j.gpu_models) & known:
            return (
                f"unknown GPU model(s) {', '.join(j.gpu_models)}; the cluster has {', '.join(sorted(known))}"
            )
        qn = {q.name for q in self.variant.queues}
        if j.queue not in qn:
            return f"queue {j.queue!r} does not exist; known: {', '.join(sorted(qn)) or 'none'}"
        if any(q.parent == j.queue for q in self.variant.queues):
            return f"queue {j.queue!r} has child queues; jobs go to leaf queues"
        ok_nodes = [n for n in self.nodes if not j.gpu_models or n.gpu_model in j.gpu_models]
        per = j.gpus if j.gpus else (1 if j.gpu_milli else 0)
        fit = [
            n
            for n in ok_nodes
            if n.gpu_count >= per and n.cpu_milli >= j.cpu_milli and n.memory_mib >= j.memory_mib
        ]
        if not fit:
            return f"no node can host one pod ({per} GPU, {j.cpu_milli}m CPU, {j.memory_mib}Mi)"
        if j.gpus and sum(n.gpu_count // j.gpus for n in fit) < j.replicas:
            return (
                f"needs {j.gpus * j.replicas} GPUs in {j.replicas} pods; the cluster cannot hold them at once"
            )
        return ""

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        sc = self.sc
        jobs = [JobRecord(j, i) for i, j in enumerate(sc.trace.jobs)]
        self.jobs = {r.spec.name: r for r in jobs}
        self.running: dict[str, Running] = {}
        self.wl: dict[str, Workload] = {}
        self.on_node: dict[str, set[str]] = {}
        events: list[Event] = []
        heap: list[tuple[float, int, int, str, int]] = []
        seq = 0

        def push(t: float, kind: int, subject: str, aux: int = 0) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (t, kind, seq, subject, aux))

        for r in jobs:
            w = self._workload(r.spec)
            self.wl[r.spec.name] = w
            why = self._reject_reason(w, r.spec)
            if why:
                r.status, r.reject_reason = "rejected", why
                events.append(Event(r.spec.submit, "rejected", r.spec.name, why))
                continue
            push(r.spec.submit, ARRIVAL, r.spec.name)
        f = self.faults
        for node, at, rep in f.node_failures:
            push(at, NODE_FAIL, node, int(rep * 1000))
        node_rng = {n.name: random.Random(f"{sc.seed}/node/{n.name}") for n in self.nodes}
        if f.mtbf_s:
            for n in self.nodes:
                push(node_rng[n.name].expovariate(1.0 / f.mtbf_s), NODE_FAIL, n.name, -1)
        horizon = sc.horizon if sc.horizon is not None else math.inf
        last_submit = max((j.submit for j in sc.trace.jobs), default=0.0)
        span = horizon if horizon < math.inf else max(last_submit, 1.0) * 1.1
        sample_every = span / max(sc.samples, 1)
        next_sample = 0.0
        eng = self._new_engine(0.0)
        pend = PendingSet(self.one_head, track_shapes=self._uses_shape_mix(eng))
        cap = self._capacity()
        alloc = 0
        times: list[float] = []
        allocs: list[int] = []
        caps: list[int] = []
        npend: list[int] = []
        nrun: list[int] = []
        frag_t: list[float] = []
        frag: list[float] = []
        qusage: dict[str, float] = {}
        violations: list[str] = []
        preemptions = cycles = 0
        now = 0.0
        done_arrivals = 0
        dirty = True  # something freed capacity, or the last cycle changed the running set
        interval = sc.schedule_interval
        stale = False  # something changed since the last cycle
        tick_at = -1.0  # when the next scheduling tick is due (with a schedule interval)

        open_jobs = sum(1 for r in jobs if r.status != "rejected")

        def usage_charge(name: str, t0: float, t1: float) -> None:
            w = self.wl[name]
            q = self.jobs[name].spec.queue  # the trace's queue, also under the single FIFO queue
            qusage[q] = qusage.get(q, 0.0) + w.gpu_milli / 1000.0 * (t1 - t0)

        def release(name: str, t: float) -> Running | None:
            nonlocal alloc
            r = self.running.pop(name, None)
            if r is None:
                return None
            eng.remove_running(name)
            alloc -= r.admission.quota_vec()[0]
            for p in r.admission.pods:
                s = self.on_node.get(p.node)
                if s is not None:
                    s.discard(name)
            rec = self.jobs[name]
            assert rec.start is not None
            usage_charge(name, rec.start, t)
            return r

        def fault(name: str, t: float, why: str) -> None:
            nonlocal open_jobs
            rec = self.jobs[name]
            assert rec.start is not None
            rec.lost_fault_gpu_s += self.wl[name].gpu_milli / 1000.0 * (t - rec.start)
            release(name, t)
            rec.faults += 1
            rec.fault_at = t
            rec.start = None
            if rec.retries < f.max_retries:
                rec.retries += 1
                delay = f.backoff(rec.retries)
                rec.status = "waiting"
                events.append(Event(t, "retry-scheduled", name, f"{why}; retry {rec.retries} in {delay:g}s"))
                push(t + delay, RETRY, name)
            else:
                rec.status = "failed"
                rec.finish = t
                open_jobs -= 1
                events.append(Event(t, "job-failed", name, f"{why}; no retries left"))

        while heap:
            t = heap[0][0]
            if t > horizon:
                break
            if not open_jobs:
                break  # every job is done: perpetual faults (MTBF) would otherwise never stop
            # the state during [now, t) is the state after the last cycle: sample it
            while next_sample <= t and next_sample <= horizon:
                if next_sample >= now:
                    frag_t.append(next_sample)
                    frag.append(self._fragmentation(eng))
                next_sample += sample_every
            now = t
            changed = False
            tick = interval <= 0
            while heap and heap[0][0] == t:
                _, kind, _, name, aux = heapq.heappop(heap)
                if kind == FINISH:
                    rec = self.jobs[name]
                    if rec.status != "running" or rec.attempt != aux:
                        continue
                    release(name, t)
                    rec.status, rec.finish = "completed", t
                    open_jobs -= 1
                    changed = dirty = True
                elif kind == JOB_FAULT:
                    rec = self.jobs[name]
                    if rec.status != "running" or rec.attempt != aux:
                        continue
                    events.append(Event(t, "job-fault", name, "abnormal exit"))
                    fault(name, t, "abnormal exit")
                    changed = dirty = True
                elif kind == NODE_FAIL:
                    if name in self.down:
                        continue
                    rep = (aux / 1000.0) if aux >= 0 else f.mtbf_repair_s
                    events.append(Event(t, "node-failed", name, f"repair in {rep:g}s"))
                    for jn in sorted(self.on_node.get(name, ())):
                        events.append(Event(t, "job-evicted", jn, f"node {name} failed"))
                        fault(jn, t, f"node {name} failed")
                    self.down.add(name)
                    eng = self._new_engine(t)
                    cap = self._capacity()
                    push(t + rep, NODE_REPAIR, name, aux)
                    changed = dirty = True
                elif kind == NODE_REPAIR:
                    self.down.discard(name)
                    events.append(Event(t, "node-repaired", name))
                    eng = self._new_engine(t)
                    cap = self._capacity()
                    if aux < 0 and f.mtbf_s:
                        push(t + node_rng[name].expovariate(1.0 / f.mtbf_s), NODE_FAIL, name, -1)
                    changed = dirty = True
                elif kind == TICK:
                    tick, tick_at = True, -1.0
                else:  # ARRIVAL or RETRY
                    rec = self.jobs[name]
                    if kind == ARRIVAL:
                        done_arrivals += 1
                    rec.status = "pending"
                    pend.add(self.wl[name])
                    changed = True
            if self.progress is not None:
                self.progress(done_arrivals)
            stale = stale or changed
            if interval > 0 and stale and not tick and tick_at < 0:
                tick_at = math.ceil(t / interval) * interval
                push(tick_at, TICK, "")
            if not (stale and tick) or not len(pend):
                self._record(times, allocs, caps, npend, nrun, t, alloc, cap, len(pend), len(self.running))
                continue
            stale = False
            # one logical cycle; a one-head policy repeats at the same instant while it makes progress
            while len(pend):
                d, passed = self._decide(eng, pend, t, dirty)
                dirty = bool(d.admitted or d.preempted)
                cycles += 1
                if self.check:
                    before = self._snapshot(tuple(passed), t)
                    after = apply_decisions(before, d, t)
                    violations.extend(
                        f"t={t:g} {self.policy.name}: {v}" for v in check_cycle(before, d, after)
                    )
                victims = d.victims()
                for pe in d.preempted:
                    preemptions += len(pe.victims)
                    for vic in pe.victims:
                        vrec = self.jobs[vic.workload]
                        assert vrec.start is not None
                        vrec.lost_gpu_s += self.wl[vic.workload].gpu_milli / 1000.0 * (t - vrec.start)
                        events.append(Event(t, "preempted", vic.workload, f"{vic.rule} by {pe.preemptor}"))
                for v in victims:
                    rv = self.running.pop(v, None)
                    if rv is None:
                        continue
                    alloc -= rv.admission.quota_vec()[0]
                    for pp in rv.admission.pods:
                        self.on_node.get(pp.node, set()).discard(v)
                    rec = self.jobs[v]
                    assert rec.start is not None
                    usage_charge(v, rec.start, t)
                    rec.preempted += 1
                    rec.fault_at = t
                    rec.start = None
                    rec.status = "pending"
                admitted = eng.apply(d, passed, t)
                for v in victims:
                    if self.jobs[v].status == "pending":
                        pend.add(self.wl[v])
                for ra in admitted:
                    name = ra.name
                    pend.remove(name)
                    self.running[name] = ra
                    alloc += ra.admission.quota_vec()[0]
                    for pp in ra.admission.pods:
                        self.on_node.setdefault(pp.node, set()).add(name)
                    rec = self.jobs[name]
                    rec.status = "running"
                    rec.attempt += 1
                    rec.start = t
                    if rec.first_start is None:
                        rec.first_start = t
                    if rec.fault_at is not None:
                        rec.recover_s.append(t - rec.fault_at)
                        rec.fault_at = None
                    end = t + rec.spec.duration
                    if f.job_failures_per_s > 0:
                        rng = random.Random(f"{sc.seed}/job/{rec.index}/{rec.attempt}")
                        at = t + rng.expovariate(f.job_failures_per_s)
                        if at < end:
                            push(at, JOB_FAULT, name, rec.attempt)
                            continue
                    push(end, FINISH, name, rec.attempt)
                if not (self.one_head and admitted):
                    break
            self._record(times, allocs, caps, npend, nrun, t, alloc, cap, len(pend), len(self.running))
        end = now
        if horizon < math.inf:
            end = horizon
        for name in list(self.running):
            rec = self.jobs[name]
            assert rec.start is not None
            usage_charge(name, rec.start, end)
        guarantees = self._guarantees()
        return RunResult(
            policy=self.policy.name,
            variant=self.variant.name,
            jobs=jobs,
            times=times,
            alloc_milli=allocs,
            cap_milli=caps,
            pending=npend,
            running=nrun,
            frag_times=frag_t,
            frag=frag,
            queue_usage_gpu_s=qusage,
            queue_guarantee_milli=guarantees,
            events=sorted(events, key=lambda e: (e.time, e.kind, e.subject)),
            preemptions=preemptions,
            cycles=cycles,
            engine_calls=self.engine_calls,
            violations=violations,
            end=end,
        )

    @staticmethod
    def _record(
        times: list[float],
        allocs: list[int],
        caps: list[int],
        npend: list[int],
        nrun: list[int],
        t: float,
        alloc: int,
        cap: int,
        pending: int,
        running: int,
    ) -> None:
        if times and times[-1] == t:
            allocs[-1], caps[-1], npend[-1], nrun[-1] = alloc, cap, pending, running
            return
        times.append(t)
        allocs.append(alloc)
        caps.append(cap)
        npend.append(pending)
        nrun.append(running)

    def _capacity(self) -> int:
        return sum(n.gpu_count * 1000 for n in self.nodes if n.name not in self.down)

    def _guarantees(self) -> dict[str, int]:
        out: dict[str, int] = {}
        parents = {q.parent for q in self.variant.queues if q.parent}
        for q in self.variant.queues:
            if q.name in parents:
                continue
            out[q.name] = sum(pq.guarantee[0] for pq in q.quotas if pq.guarantee[0] < 1 << 60)
        return out

    def _fragmentation(self, eng: MixEngine) -> float:
        """Share of free GPU capacity on nodes that are not wholly free (cannot host a whole-node job)."""
        st = eng.cluster
        free_all = frag = 0
        for i, n in enumerate(st.nodes):
            if not n.schedulable or n.gpu_count == 0:
                continue
            free = sum(st.dev_milli[i])
            free_all += free
            if st.free_whole[i] < n.gpu_count:
                frag += free
        return frag / free_all if free_all else 0.0

    def _decide(
        self, eng: MixEngine, pend: PendingSet, now: float, dirty: bool
    ) -> tuple[Decisions, list[Workload]]:
        """One engine cycle over windows of the pending set, enlarged until provably exact."""
        touched, touched_q, new = pend.touched, pend.touched_queues, pend.new
        pend.touched, pend.touched_queues, pend.new = set(), set(), set()
        if self.full_pending:
            everything = list(pend.w.values())
            self.engine_calls += 1
            return eng.cycle(everything, now), everything
        full_classes: set[int] = set()
        extra: set[str] = set()
        if not dirty:
            # unchanged state: newcomers (they may backfill) and the last holders, besides windows
            # (a StrictFIFO or one-head queue is given as a window or not at all)
            extra = {
                n
                for n in new
                if n in pend.w and not self.one_head and pend.w[n].queue not in self.head_queues
            }
            extra.update(n for n in self.holders if n in pend.w)
        k_class = self.k_hint
        k_queue = self.kq_hint
        bf_horizon = max((h[1] for h in self.last_held.values()), default=-math.inf) - now  # type: ignore[index]
        passed: list[Workload] = []
        # classes whose head can neither be placed nor preempt at the cycle's start state: every
        # member would fail (capacity only shrinks until something is preempted), so only the
        # head is given, as ``blocked`` (the engine may need it to choose a hold)
        memo: dict[object, Any] = {}
        use_blocked = True
        # a class window whose last member is admitted grows by one during the cycle (the
        # engine's ``more``), instead of the cycle being run again with a larger window
        use_more = use_blocked and self.pull_windows
        while True:
            passed = []
            blocked: set[str] = set()
            seen: set[str] = set()
            q_trunc: dict[str, list[str]] = {}
            c_trunc: dict[int, list[str]] = {}
            pulled = 0

            def pull(
                w: Workload,
                c_trunc: dict[int, list[str]] = c_trunc,
                seen: set[str] = seen,
                passed: list[Workload] = passed,
            ) -> Workload | None:
                nonlocal pulled
                c = pend.cls_of.get(w.name)
                names = c_trunc.get(c) if c is not None else None
                if names is None or names[-1] != w.name:
                    return None
                lst = pend.by_class[c]  # type: ignore[index]
                i = len(names)
                while i < len(lst) and lst[i][1] in seen:
                    i += 1
                if i >= len(lst):
                    return None
                n = lst[i][1]
                names.append(n)
                seen.add(n)
                nxt = pend.w[n]
                passed.append(nxt)
                pulled += 1
                return nxt

            for q, classes in pend.by_queue.items():
                if not classes:
                    continue
                if q in self.head_queues or self.one_head:
                    if not dirty and q not in touched_q:
                        continue
                    k = k_queue.get(q, 8)
                    lists = [pend.by_class[c][:k] for c in classes]
                    got = heapq.nsmallest(k, (x for lst in lists for x in lst))
                    names = [n for _, n in got]
                    if pend.count[q] > len(names):
                        q_trunc[q] = names
                    seen.update(names)
                    passed.extend(pend.w[n] for n in names)
                else:
                    for c in classes:
                        if not dirty and c not in touched:
                            continue
                        lst = pend.by_class[c]
                        if use_blocked and c not in full_classes:
                            head = pend.w[lst[0][1]]
                            if eng.blocked_at_start(head, memo):
                                blocked.add(head.name)
                                seen.add(head.name)
                                passed.append(head)
                                continue
                        k = len(lst) if c in full_classes else k_class.get(c, 1)
                        names = [n for _, n in lst[:k]]
                        if len(lst) > k:
                            c_trunc[c] = names
                            # under a hold, a short member may backfill where the window could
                            # not: give the first that could (by the last hold) up front, as the
                            # check below would after the cycle
                            if pend.by_dur[c][0][0] <= bf_horizon:
                                extra.update(pend.eligible(c, bf_horizon, set(names), 1))
                        seen.update(names)
                        passed.extend(pend.w[n] for n in names)
            passed.extend(pend.w[n] for n in sorted(extra - seen))
            seen.update(extra)
            if not passed:
                return Decisions(), passed
            if pend.shapes is not None:
                hidden = pend.shapes.copy()
                add_shapes(hidden, passed, sign=-1)  # type: ignore[arg-type]
                eng.hidden = +hidden
            kw: dict[str, Any] = {}
            if blocked:
                kw["blocked"] = blocked
            if use_more and c_trunc:
                kw["more"] = pull
            d = eng.cycle(list(passed), now, **kw)
            self.engine_calls += 1
            if (blocked or pulled) and d.preempted:
                # a preemption frees capacity: the proof behind ``blocked`` no longer holds, and
                # windows grown during the cycle may have missed work it let in
                use_blocked = use_more = False
                for c, names in c_trunc.items():  # the grown windows are the ones to start from
                    k_class[c] = max(k_class.get(c, 1), len(names) + 1)
                continue
            held = eng.placer.reserved
            if not dirty and (d.admitted or d.preempted or held != self.last_held):
                # the state changed mid-cycle (an admission can move the nodes held for a blocked
                # workload, a preemption frees capacity): give every class its window
                dirty = True
                continue
            if not q_trunc and not c_trunc:
                break
            outcome: dict[str, object] = {p.workload: p.code for p in d.pending}
            for a in d.admitted:
                outcome[a.workload] = "admitted"
            ok = True
            for q, names in q_trunc.items():
                if q in self.head_queues:
                    good = any(outcome.get(n) != "admitted" for n in names)
                else:
                    good = any(outcome.get(n) == PendingCode.SKIPPED for n in names)
                if not good:
                    ok = False
                    k_queue[q] = k_queue.get(q, 8) * 2
            mark = d.pending_after_preemption
            # a witness must have failed after the cycle's last preemption (capacity only
            # shrinks from then on); without preemptions every failure qualifies
            failed = {p.workload for p in d.pending[mark:]} if d.preempted else None
            # backfill: a member that may use held nodes needs a failed witness that could too
            bf_any = max((h[1] for h in held.values()), default=-math.inf) - now
            bf_all = min((h[1] for h in held.values()), default=math.inf) - now
            for c, names in c_trunc.items():
                if not any(outcome.get(n) in FAILED_CODES and (failed is None or n in failed) for n in names):
                    ok = False
                    k_class[c] = k_class.get(c, 1) * 2
                    continue
                if not held or not pend.eligible(c, bf_any, set(names) | extra, 1):
                    continue
                if any(
                    outcome.get(n) in FAILED_CODES
                    and (failed is None or n in failed)
                    and declared_duration(pend.w[n]) <= bf_all
                    for n in list(names) + [x for x in extra if pend.cls_of.get(x) == c]
                ):
                    continue
                more = pend.eligible(c, bf_all, set(names) | extra, 2)
                if not more:  # nothing can witness for every hold: give the class whole
                    full_classes.add(c)
                extra.update(more)
                ok = False
            if ok:
                adm: dict[int, int] = {}
                for a in d.admitted:
                    c = pend.cls_of[a.workload]
                    adm[c] = adm.get(c, 0) + 1
                for c in c_trunc:
                    # windows grow during the cycle: start each at one member
                    k_class[c] = 1 if use_more else min(64, adm.get(c, 0) + 1)
                for q, names in q_trunc.items():
                    k_queue[q] = max(8, min(1024, 2 * sum(outcome.get(n) == "admitted" for n in names)))
                break
        self.holders = {h[2] for h in held.values()}
        self.last_held = dict(held)
        return d, passed


def simulate(
    scenario: Scenario,
    policy: str,
    variant: Variant | None = None,
    check_invariants: bool | None = None,
    full_pending: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Run one policy on one variant (the baseline by default)."""
    v = variant or scenario.variants[0]
    chk = scenario.check_invariants if check_invariants is None else check_invariants
    return Simulation(scenario, Policy.named(policy), v, chk, full_pending, progress).run()
