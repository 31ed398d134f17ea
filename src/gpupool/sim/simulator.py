"""Discrete-event simulation in virtual time around the real, unchanged scheduling engine.

Events (arrivals, completions, abnormal exits, node failures and repairs, retry timers,
scheduling ticks; ``gpupool.sim.events``) sit in a heap. All events at one timestamp are applied
first, each by the handler of its kind, then the engine runs one cycle (only when something
changed). The engine is used incrementally: ``Engine.cycle`` decides without changing state,
``Engine.apply`` makes admissions permanent, ``Engine.remove_running`` releases. Which pending
workloads a cycle is given, and why that is exact, is the window planner's business
(``gpupool.engine.windows``, the *window rule* at its top).
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import replace

from gpupool.engine import Decisions, Engine, apply_decisions
from gpupool.engine.decay import DecayedUsage, gpus_by_queue
from gpupool.engine.invariants import check_cycle
from gpupool.engine.windows import WindowPlanner
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
from gpupool.sim.events import (
    ARRIVAL,
    FINISH,
    JOB_FAULT,
    NODE_FAIL,
    NODE_REPAIR,
    RETRY,
    TICK,
    EventQueue,
    clean_time,
)
from gpupool.sim.feasibility import Feasibility
from gpupool.sim.moves import apply_moves
from gpupool.sim.pending import PendingSet
from gpupool.sim.results import Event, JobRecord, RunResult, Series
from gpupool.sim.scenario import Faults, Scenario, Variant, fifo_queues
from gpupool.sim.shrinks import apply_shrinks
from gpupool.sim.sources import JobSpec

__all__ = ["Event", "JobRecord", "Policy", "RunResult", "Simulation", "simulate"]

#: the engine (a window's left-out shapes are counted by its ShapeMix.hidden)
_Engine = Engine


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
        self.one_head = self.config.one_head_per_queue
        head_queues = {q.name for q in self.queues if q.strategy is QueueingStrategy.STRICT_FIFO}
        self.planner = WindowPlanner(head_queues, self.one_head, full_pending, self.pull_windows)
        self.feasibility = Feasibility(self.nodes, variant.queues)
        #: the resource the run's allocation, loss and usage figures count (quota vector index):
        #: GPUs where the cluster has any, else CPU (a CPU-only cluster's metrics mean something)
        self.res = metric_resource(self.nodes)
        #: the decayed GPU-seconds per queue (engine/decay.py), made at the first cycle of a
        #: run with ``usage_half_life_s``; None while usage decay is off
        self.decay: DecayedUsage | None = None

    def _uses_shape_mix(self, eng: Engine) -> bool:
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
            queue, pc_name, prio, pre, wait = "fifo", "", 0, False, None
        else:
            pc = self.pcs.get(j.priority_class)
            queue, pc_name = j.queue, j.priority_class
            prio, pre = (pc.value, pc.preemptible) if pc else (0, True)
            wait = pc.preemption_wait_s if pc else None
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
            preemption_wait_s=wait,
            gang_min=j.min_replicas,
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

    def _new_engine(self, now: float) -> Engine:
        return _Engine(self._snapshot((), now))

    # -- the run --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Apply every event in time order, each by its kind's handler, with a cycle after each
        timestamp that changed something; stop at the horizon or when every job has ended."""
        self._start()
        # indexed by event kind (FINISH .. TICK), looked up once per event
        handlers: tuple[Callable[[str, int, float], None], ...] = (
            self._on_finish,
            self._on_job_fault,
            self._on_node_fail,
            self._on_node_repair,
            self._on_arrival,
            self._on_retry,
            self._on_tick,
        )
        heap = self.queue.heap
        pop = heapq.heappop
        while heap:
            t = heap[0][0]
            if t > self.horizon:
                break
            if not self.open_jobs:
                break  # every job is done: perpetual faults (MTBF) would otherwise never stop
            self._sample_until(t)
            self.now = t
            self.changed = False
            self.tick = self.interval <= 0
            while heap and heap[0][0] == t:
                _, kind, _, name, aux = pop(heap)
                handlers[kind](name, aux, t)
            self._after_events(t)
        return self._result()

    def _start(self) -> None:
        """The run's state at t=0: records, workloads, rejections, the first events, the engine."""
        sc = self.sc
        jobs = self.records = [JobRecord(j, i) for i, j in enumerate(sc.trace.jobs)]
        self.jobs = {r.spec.name: r for r in jobs}
        self.running: dict[str, Running] = {}
        self.wl: dict[str, Workload] = {}
        self.on_node: dict[str, set[str]] = {}
        self.events: list[Event] = []
        self.queue = q = EventQueue()
        for r in jobs:
            w = self._workload(r.spec)
            self.wl[r.spec.name] = w
            why = self.feasibility.reject_reason(w, r.spec)
            if why:
                r.status, r.reject_reason = "rejected", why
                self.events.append(Event(r.spec.submit, "rejected", r.spec.name, why))
                continue
            q.push(r.spec.submit, ARRIVAL, r.spec.name)
        f = self.faults
        for i, (node, at, _) in enumerate(f.node_failures):
            q.push(at, NODE_FAIL, node, i)  # the repair time by index: no rounding to a ms
        self.node_rng = {n.name: random.Random(f"{sc.seed}/node/{n.name}") for n in self.nodes}
        if f.mtbf_s:
            for n in self.nodes:
                q.push(self.node_rng[n.name].expovariate(1.0 / f.mtbf_s), NODE_FAIL, n.name, -1)
        self.horizon = sc.horizon if sc.horizon is not None else math.inf
        last_submit = max((j.submit for j in sc.trace.jobs), default=0.0)
        span = self.horizon if self.horizon < math.inf else max(last_submit, 1.0) * 1.1
        self.sample_every = span / max(sc.samples, 1)
        self.next_sample = 0.0
        self.eng = self._new_engine(0.0)
        self.pend = PendingSet(
            self.one_head,
            track_shapes=self._uses_shape_mix(self.eng),
            one_start=all(p.reservations <= 1 for p in self.pools),
        )
        self.cap = self._capacity()
        self.alloc = 0
        self.series = Series()
        self.frag_t: list[float] = []
        self.frag: list[float] = []
        self.qusage: dict[str, float] = {}
        self.violations: list[str] = []
        self.preemptions = self.cycles = 0
        self.shrunk: dict[str, float] = {}  # units a running job lost to shrinks (sim/shrinks.py)
        self.moves, self.moved_lost_gpu_s = 0, 0.0  # consolidation (sim/moves.py)
        self.now = 0.0
        self.done_arrivals = 0
        self.dirty = True  # something freed capacity, or the last cycle changed the running set
        self.interval: float = sc.schedule_interval
        self.stale = False  # something changed since the last cycle
        self.changed = False  # something changed at this timestamp
        self.tick = False  # a cycle may run at this timestamp
        self.tick_at = -1.0  # when the next scheduling tick is due (with a schedule interval)
        self.open_jobs: int = sum(1 for r in jobs if r.status != "rejected")

    def _sample_until(self, t: float) -> None:
        """The state during [now, t) is the state after the last cycle: sample it."""
        while self.next_sample <= t and self.next_sample <= self.horizon:
            if self.next_sample >= self.now:
                self.frag_t.append(self.next_sample)
                self.frag.append(self._fragmentation(self.eng))
            self.next_sample += self.sample_every

    # -- one handler per event kind ---------------------------------------------------------------
    def _on_finish(self, name: str, attempt: int, t: float) -> None:
        rec = self.jobs[name]
        if rec.status != "running" or rec.attempt != attempt:
            return  # the attempt this completion belonged to was preempted or failed
        self._release(name, t)
        rec.status, rec.finish = "completed", t
        self.open_jobs -= 1
        self.changed = self.dirty = True

    def _on_job_fault(self, name: str, attempt: int, t: float) -> None:
        rec = self.jobs[name]
        if rec.status != "running" or rec.attempt != attempt:
            return
        self.events.append(Event(t, "job-fault", name, "abnormal exit"))
        self._fault(name, t, "abnormal exit")
        self.changed = self.dirty = True

    def _on_node_fail(self, node: str, which: int, t: float) -> None:
        if node in self.down:
            return
        rep = self.faults.node_failures[which][2] if which >= 0 else self.faults.mtbf_repair_s
        self.events.append(Event(t, "node-failed", node, f"repair in {rep:g}s"))
        for jn in sorted(self.on_node.get(node, ())):
            self.events.append(Event(t, "job-evicted", jn, f"node {node} failed"))
            self._fault(jn, t, f"node {node} failed")
        self.down.add(node)
        self.eng = self._new_engine(t)
        self.cap = self._capacity()
        self.queue.push(t + rep, NODE_REPAIR, node, which)
        self.changed = self.dirty = True

    def _on_node_repair(self, node: str, which: int, t: float) -> None:
        self.down.discard(node)
        self.events.append(Event(t, "node-repaired", node))
        self.eng = self._new_engine(t)
        self.cap = self._capacity()
        mtbf = self.faults.mtbf_s
        if which < 0 and mtbf:  # an MTBF failure: the node's next one
            self.queue.push(t + self.node_rng[node].expovariate(1.0 / mtbf), NODE_FAIL, node, -1)
        self.changed = self.dirty = True

    def _on_arrival(self, name: str, aux: int, t: float) -> None:
        self.done_arrivals += 1
        self._on_retry(name, aux, t)

    def _on_retry(self, name: str, aux: int, t: float) -> None:
        self.jobs[name].status = "pending"
        self.pend.add(self.wl[name])
        self.changed = True

    def _on_tick(self, subject: str, aux: int, t: float) -> None:
        self.tick, self.tick_at = True, -1.0

    # -- between events and cycles ----------------------------------------------------------------
    def _after_events(self, t: float) -> None:
        """After one timestamp's events: a cycle if something changed and one is due."""
        if self.progress is not None:
            self.progress(self.done_arrivals)
        self.stale = self.stale or self.changed
        interval = self.interval
        if interval > 0 and self.stale and not self.tick and self.tick_at < 0:
            # the next multiple of the interval, at or after t (4.0000000000000001 intervals is 4)
            self.tick_at = math.ceil(clean_time(t / interval)) * interval
            self.queue.push(self.tick_at, TICK, "")
        if self.stale and self.tick and len(self.pend):
            self.stale = False
            self._schedule(t)
        self.series.record(t, self.alloc, self.cap, len(self.pend), len(self.running))

    def _schedule(self, t: float) -> None:
        """One logical cycle; a one-head policy repeats at the same instant while it admits."""
        pend = self.pend
        hl = self.config.usage_half_life_s
        if hl:  # usage decay (engine/decay.py): the decayed GPU-seconds per queue, up to now
            if self.decay is None:
                self.decay = DecayedUsage(hl)
            self.decay.advance(t, gpus_by_queue(self.running.values()))
            self.eng.set_decayed_usage(self.decay.usage)
        while len(pend):
            changes = pend.take_changes()
            d, passed = self.planner.decide(self.eng, pend.backlog, t, None if self.dirty else changes)
            self.dirty = bool(d.admitted or d.preempted)
            self.cycles += 1
            if self.check:
                before = self._snapshot(tuple(passed), t)
                after = apply_decisions(before, d, t)
                self.violations.extend(
                    f"t={t:g} {self.policy.name}: {v}" for v in check_cycle(before, d, after)
                )
            victims = self._preempt(d, t)
            apply_shrinks(self, d, t)
            apply_moves(self, d, t)
            admitted = self.eng.apply(d, passed, t)
            for v in victims:
                if self.jobs[v].status == "pending":
                    pend.add(self.wl[v])
            for ra in admitted:
                self._started(ra, t)
            if not (self.one_head and admitted):
                break

    def _preempt(self, d: Decisions, t: float) -> list[str]:
        """The cycle's victims leave the running set and wait again; their work is lost."""
        victims = d.victims()
        for pe in d.preempted:
            self.preemptions += len(pe.victims)
            for vic in pe.victims:
                vrec = self.jobs[vic.workload]
                assert vrec.start is not None
                vrec.lost_gpu_s += self._units(vic.workload) * (t - vrec.start)
                self.events.append(Event(t, "preempted", vic.workload, f"{vic.rule} by {pe.preemptor}"))
        for v in victims:
            rv = self.running.pop(v, None)
            if rv is None:
                continue
            self.alloc -= rv.admission.quota_vec()[self.res]
            for pp in rv.admission.pods:
                self.on_node.get(pp.node, set()).discard(v)
            rec = self.jobs[v]
            assert rec.start is not None
            self._charge(v, rec.start, t)
            rec.preempted += 1
            self.wl[v] = replace(self.wl[v], evictions=rec.preempted)  # the cost model reads it
            rec.fault_at = t
            rec.start = None
            rec.status = "pending"
        return victims

    def _started(self, ra: Running, t: float) -> None:
        """An admitted workload runs: its completion, or an abnormal exit before it, is queued."""
        name = ra.name
        self.pend.remove(name)
        self.running[name] = ra
        self.alloc += ra.admission.quota_vec()[self.res]
        for pp in ra.admission.pods:
            self.on_node.setdefault(pp.node, set()).add(name)
        rec = self.jobs[name]
        self.shrunk.pop(name, None)  # a new run starts whole
        rec.status = "running"
        rec.attempt += 1
        rec.start = t
        rec.starts.append(t)
        if rec.first_start is None:
            rec.first_start = t
        if rec.fault_at is not None:
            rec.recover_s.append(t - rec.fault_at)
            rec.fault_at = None
        end = t + rec.spec.duration
        rate = self.faults.job_failures_per_s
        if rate > 0:
            rng = random.Random(f"{self.sc.seed}/job/{rec.index}/{rec.attempt}")
            at = t + rng.expovariate(rate)
            if at < end:
                self.queue.push(at, JOB_FAULT, name, rec.attempt)
                return
        self.queue.push(end, FINISH, name, rec.attempt)

    def _units(self, name: str) -> float:
        """How much of the metric resource ``name`` holds (GPUs, or CPUs on a CPU-only cluster)."""
        return self.wl[name].quota_vec()[self.res] / 1000.0 - self.shrunk.get(name, 0.0)

    def _charge(self, name: str, t0: float, t1: float) -> None:
        q = self.jobs[name].spec.queue  # the trace's queue, also under the single FIFO queue
        self.qusage[q] = self.qusage.get(q, 0.0) + self._units(name) * (t1 - t0)

    def _release(self, name: str, t: float) -> Running | None:
        r = self.running.pop(name, None)
        if r is None:
            return None
        self.eng.remove_running(name)
        self.alloc -= r.admission.quota_vec()[self.res]
        for p in r.admission.pods:
            s = self.on_node.get(p.node)
            if s is not None:
                s.discard(name)
        rec = self.jobs[name]
        assert rec.start is not None
        self._charge(name, rec.start, t)
        return r

    def _fault(self, name: str, t: float, why: str) -> None:
        """A running job exits abnormally or loses its node: a retry after backoff, or failed."""
        rec = self.jobs[name]
        assert rec.start is not None
        rec.lost_fault_gpu_s += self._units(name) * (t - rec.start)
        self._release(name, t)
        rec.faults += 1
        rec.fault_at = t
        rec.start = None
        f = self.faults
        if rec.retries < f.max_retries:
            rec.retries += 1
            delay = f.backoff(rec.retries)
            rec.status = "waiting"
            self.events.append(Event(t, "retry-scheduled", name, f"{why}; retry {rec.retries} in {delay:g}s"))
            self.queue.push(t + delay, RETRY, name)
        else:
            rec.status = "failed"
            rec.finish = t
            self.open_jobs -= 1
            self.events.append(Event(t, "job-failed", name, f"{why}; no retries left"))

    # -- the result -------------------------------------------------------------------------------
    def _result(self) -> RunResult:
        end = self.horizon if self.horizon < math.inf else self.now
        for name in list(self.running):
            rec = self.jobs[name]
            assert rec.start is not None
            self._charge(name, rec.start, end)
        s = self.series
        return RunResult(
            policy=self.policy.name,
            variant=self.variant.name,
            jobs=self.records,
            times=s.times,
            alloc_milli=s.allocs,
            cap_milli=s.caps,
            pending=s.npend,
            running=s.nrun,
            frag_times=self.frag_t,
            frag=self.frag,
            queue_usage_gpu_s=self.qusage,
            queue_guarantee_milli=self._guarantees(),
            events=sorted(self.events, key=lambda e: (e.time, e.kind, e.subject)),
            preemptions=self.preemptions,
            moves=self.moves,
            moved_gpu_s_lost=self.moved_lost_gpu_s,
            cycles=self.cycles,
            engine_calls=self.planner.engine_calls,
            violations=self.violations,
            end=end,
            resource=RESOURCE_NAMES[self.res],
        )

    def _capacity(self) -> int:
        up = [n for n in self.nodes if n.name not in self.down]
        return sum(n.gpu_count * 1000 for n in up) if self.res == 0 else sum(n.cpu_milli for n in up)

    def _guarantees(self) -> dict[str, int]:
        out: dict[str, int] = {}
        parents = {q.parent for q in self.variant.queues if q.parent}
        for q in self.variant.queues:
            if q.name in parents:
                continue
            r = self.res
            out[q.name] = sum(pq.guarantee[r] for pq in q.quotas if pq.guarantee[r] < 1 << 60)
        return out

    def _fragmentation(self, eng: Engine) -> float:
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


#: the metric resource's name by quota-vector index (what the JSON says the figures count)
RESOURCE_NAMES = {0: "nvidia.com/gpu", 1: "cpu"}


def metric_resource(nodes: list[Node]) -> int:
    """GPUs (index 0) where any node has one, else CPU (index 1)."""
    return 0 if any(n.gpu_count for n in nodes) else 1


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
