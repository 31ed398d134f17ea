"""One reusable invariant checker, run after every cycle by tests and by the simulator.

It recomputes everything from the snapshot and the decisions, independently of the engine's
incremental bookkeeping, so a bookkeeping bug cannot hide itself.
"""

from __future__ import annotations

from collections import defaultdict

from gpupool.engine.cohorts import borrowing_below
from gpupool.engine.decisions import Decisions, PreemptRule, Shrink
from gpupool.engine.preemption.ordering import within_queue_victim
from gpupool.engine.state.quota import QuotaState
from gpupool.model import (
    GPU,
    ZERO,
    Node,
    PodPlacement,
    PodRequest,
    PreemptionPolicy,
    ReclaimPolicy,
    ResourcePool,
    Running,
    Snapshot,
    TopologyMode,
    Vec,
    Workload,
    vadd,
    vle,
)


def check_state(snapshot: Snapshot) -> list[str]:
    """Capacity and quota invariants of a snapshot's running set."""
    errs: list[str] = []
    nodes: dict[str, Node] = {n.name: n for n in snapshot.nodes}
    dev_milli: dict[tuple[str, int], int] = defaultdict(int)
    dev_mem: dict[tuple[str, int], int] = defaultdict(int)
    node_use: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    pools = {p.name: p for p in snapshot.pools}
    for r in snapshot.running:
        for p in r.admission.pods:
            n = nodes.get(p.node)
            if n is None:
                errs.append(f"{r.name}: placed on unknown node {p.node}")
                continue
            pool = pools.get(r.admission.pool)
            if pool is not None and not pool.selects(n):
                errs.append(f"{r.name}: node {p.node} is not in pool {r.admission.pool}")
            if r.workload.gpu_models and p.devices and n.gpu_model not in r.workload.gpu_models:
                errs.append(
                    f"{r.name}: GPU model {n.gpu_model} not allowed ({', '.join(r.workload.gpu_models)})"
                )
            kind = _kind_of(r.workload, p.group)
            if p.devices and kind != n.accelerator:
                errs.append(f"{r.name}: pod {p.group}-{p.index} needs {kind}, {p.node} has {n.accelerator}")
            if len(set(p.devices)) != len(p.devices):
                errs.append(f"{r.name}: pod {p.group}-{p.index} lists a device twice")
            for d in p.devices:
                if not 0 <= d < n.gpu_count:
                    errs.append(f"{r.name}: device {d} does not exist on {p.node}")
                dev_milli[(p.node, d)] += p.gpu_milli
                dev_mem[(p.node, d)] += p.gpu_memory_mib
            u = node_use[p.node]
            u[0] += p.cpu_milli
            u[1] += p.memory_mib
            u[2] += p.rdma
            u[3] += p.storage_mib
            u[4] += p.network_mbps
    for (node, d), m in dev_milli.items():
        if m > 1000:
            errs.append(f"device {node}/{d} over-committed: {m} milli-GPU")
        if dev_mem[(node, d)] > nodes[node].gpu_memory_mib:
            errs.append(
                f"device {node}/{d} memory over-committed: {dev_mem[(node, d)]}Mi > {nodes[node].gpu_memory_mib}Mi"
            )
    for node, (c, m, rd, sto, net) in node_use.items():
        n = nodes[node]
        if c > n.cpu_milli or m > n.memory_mib or rd > n.rdma:
            errs.append(
                f"node {node} over-committed: cpu {c}/{n.cpu_milli}, memory {m}/{n.memory_mib}, rdma {rd}/{n.rdma}"
            )
        if sto > n.ephemeral_storage_mib or net > n.network_mbps:
            errs.append(
                f"node {node} over-committed: ephemeral-storage {sto}/{n.ephemeral_storage_mib}Mi, "
                f"network {net}/{n.network_mbps} Mbit/s"
            )
    errs.extend(check_quota(snapshot, snapshot.running))
    return errs


def _kind_of(w: Workload, group: str) -> str:
    """The accelerator kind a pod group's devices must be of."""
    return next((g.request.accelerator for g in w.pod_groups if g.name == group), GPU)


def _quota_state(snapshot: Snapshot, running: tuple[Running, ...] | list[Running]) -> QuotaState:
    cap: dict[str, Vec] = {p.name: ZERO for p in snapshot.pools}
    for n in snapshot.nodes:
        for p in snapshot.pools:
            if p.selects(n):
                own = (n.gpu_count * 1000, n.cpu_milli, n.memory_mib, n.ephemeral_storage_mib, n.network_mbps)
                cap[p.name] = vadd(cap[p.name], own)
                break
    qs = QuotaState(snapshot.queues, [p.name for p in snapshot.pools], cap)
    for r in running:
        if r.workload.queue in qs.queues and r.admission.pool in cap:
            qs.add(r.workload.queue, r.admission.pool, r.admission.quota_vec())
    return qs


def check_quota(snapshot: Snapshot, running: tuple[Running, ...] | list[Running]) -> list[str]:
    qs = _quota_state(snapshot, running)
    errs = []
    for (name, pool), e in qs.E.items():
        if not vle(e, qs.limit[(name, pool)]):
            errs.append(
                f"queue {name} above its limit in pool {pool}: effective use {e} > limit {qs.limit[(name, pool)]}"
            )
    return errs


def check_decisions(before: Snapshot, decisions: Decisions) -> list[str]:
    """Gang all-or-nothing, legal victims, nothing admitted twice, topology honoured."""
    pending = {w.name: w for w in before.pending}
    return _check_admissions(before, decisions, pending) + _check_victims(before, decisions, pending)


def _check_admissions(before: Snapshot, decisions: Decisions, pending: dict[str, Workload]) -> list[str]:
    """Each admission: of a pending workload, once, its gang whole, each pod as requested."""
    errs: list[str] = []
    nodes = {n.name: n for n in before.nodes}
    pools = {p.name: p for p in before.pools}
    seen: set[str] = set()
    for a in decisions.admitted:
        w = pending.get(a.workload)
        if w is None:
            errs.append(f"{a.workload}: admitted but was not pending")
            continue
        if a.workload in seen:
            errs.append(f"{a.workload}: admitted twice")
        seen.add(a.workload)
        pool = pools.get(a.pool)
        if a.borrowing and (not w.preemptible or (pool is not None and not pool.preemptible)):
            errs.append(f"{a.workload}: non-preemptible work admitted by borrowing")
        if not w.min_pods <= len(a.pods) <= w.pod_count:
            errs.append(
                f"{a.workload}: gang broken: {len(a.pods)} pods placed, needs {w.min_pods}..{w.pod_count}"
            )
        groups = {g.name: g for g in w.pod_groups}
        keys = set()
        for p in a.pods:
            g = groups.get(p.group)
            if g is None or not 0 <= p.index < g.replicas:
                errs.append(f"{a.workload}: placed a pod {p.group}-{p.index} that does not exist")
                continue
            keys.add((p.group, p.index))
            errs.extend(_check_pod(a.workload, w, g.request, p, nodes.get(p.node)))
        if len(keys) != len(a.pods):
            errs.append(f"{a.workload}: a pod was placed twice")
        if w.topology is not None and w.topology.mode is TopologyMode.REQUIRED and a.pods:
            doms = {nodes[p.node].domain(w.topology.scope) for p in a.pods if p.node in nodes}
            if len(doms) > 1:
                errs.append(f"{a.workload}: required topology {w.topology.scope} spans {sorted(doms)}")
    return errs


def _check_pod(name: str, w: Workload, r: PodRequest, p: PodPlacement, n: Node | None) -> list[str]:
    """One placed pod: the devices and memory it asked for, on a node it may use."""
    errs: list[str] = []
    if r.gpus and (len(p.devices) != r.gpus or p.gpu_milli != 1000):
        errs.append(f"{name}: pod {p.group}-{p.index} got {len(p.devices)} devices for {r.gpus} GPUs")
    if r.fractional and (len(p.devices) != 1 or p.gpu_milli != r.gpu_milli):
        errs.append(f"{name}: fractional pod {p.group}-{p.index} not on exactly one device share")
    if r.gpu_memory_mib and p.gpu_memory_mib < r.gpu_memory_mib:
        errs.append(f"{name}: pod {p.group}-{p.index} got less GPU memory than requested")
    if n is not None:
        for t in n.taints:
            if t.effect != "PreferNoSchedule" and not any(tol.tolerates(t) for tol in w.tolerations):
                errs.append(f"{name}: placed on {n.name} whose taint {t.key} it does not tolerate")
        if not n.schedulable:
            errs.append(f"{name}: placed on unschedulable node {n.name}")
    return errs


def _check_victims(before: Snapshot, decisions: Decisions, pending: dict[str, Workload]) -> list[str]:
    """Each victim: running, evicted once, preemptible, and legal for the rule that chose it."""
    errs: list[str] = []
    running = {r.name: r for r in before.running}
    pools = {p.name: p for p in before.pools}
    qs = _quota_state(before, before.running)
    victims: set[str] = set()
    for pe in decisions.preempted:
        w = pending.get(pe.preemptor)
        if w is None:
            errs.append(f"{pe.preemptor}: preempted for but was not pending")
            continue
        for v in pe.victims:
            vr = running.get(v.workload)
            if vr is None:
                errs.append(f"{v.workload}: victim is not running")
                continue
            if v.workload in victims:
                errs.append(f"{v.workload}: evicted twice")
            victims.add(v.workload)
            vw = vr.workload
            pool = pools.get(vr.admission.pool)
            if not vw.preemptible or (pool is not None and not pool.preemptible):
                errs.append(f"{v.workload}: preempted but its class or pool is not preemptible")
            errs.extend(_victim_rule(w, vr, v.rule, qs))
        errs.extend(_check_shrinks(w, pe.shrinks, running, pools, qs, victims))
    return errs


def _check_shrinks(
    w: Workload,
    shrinks: tuple[Shrink, ...],
    running: dict[str, Running],
    pools: dict[str, ResourcePool],
    qs: QuotaState,
    touched: set[str],
) -> list[str]:
    """Each shrink: of a running elastic gang, preemptible, taken once (never also evicted),
    only pods it runs, never below its ``gang_min``, legal for its rule as a whole victim is."""
    errs: list[str] = []
    for sh in shrinks:
        vr = running.get(sh.workload)
        if vr is None:
            errs.append(f"{sh.workload}: shrunk but not running")
            continue
        if sh.workload in touched:
            errs.append(f"{sh.workload}: shrunk and preempted again in one cycle")
        touched.add(sh.workload)
        vw, pods = vr.workload, vr.admission.pods
        pool = pools.get(vr.admission.pool)
        if not vw.preemptible or (pool is not None and not pool.preemptible):
            errs.append(f"{sh.workload}: shrunk but its class or pool is not preemptible")
        if not sh.pods or len(set(sh.pods)) != len(sh.pods) or not set(sh.pods) <= set(pods):
            errs.append(f"{sh.workload}: shrink takes pods it does not run")
        if sh.replicas != len(pods) - len(sh.pods):
            errs.append(f"{sh.workload}: shrink keeps {sh.replicas} pods of {len(pods)} less {len(sh.pods)}")
        if vw.gang_min is None or sh.replicas < vw.min_pods:
            errs.append(f"{sh.workload}: shrunk to {sh.replicas} pods, below its gang minimum {vw.gang_min}")
        errs.extend(_victim_rule(w, vr, sh.rule, qs))
    return errs


def _victim_rule(w: Workload, vr: Running, rule: PreemptRule, qs: QuotaState) -> list[str]:
    """Is ``vr`` a legal victim of ``w`` under ``rule`` and ``w``'s queue's policy, in the state
    before the cycle? Within its queue: lower priority (or newer and equal, where the policy is
    LowerOrNewerEqualPriority). From the cohort: another queue of the same cohort that is
    actively borrowing, as seen from the common ancestor (the leaf and every queue below that
    ancestor above its guarantee); by borrowing or by a LowerPriority reclaim: lower priority."""
    vw, name = vr.workload, vr.name
    pol = qs.queues[w.queue].preemption if w.queue in qs.queues else None
    if rule is PreemptRule.WITHIN_QUEUE:
        equal = pol is not None and pol.within_queue is ReclaimPolicy.LOWER_OR_NEWER_EQUAL_PRIORITY
        if vw.queue != w.queue or not within_queue_victim(w, vw, equal):
            return [f"{name}: within-queue victim must be in {w.queue} with lower priority (or newer, equal)"]
        return []
    if vw.queue == w.queue or qs.root.get(vw.queue) != qs.root.get(w.queue):
        return [f"{name}: cohort victim must be in another queue of the same cohort"]
    errs = []
    if not borrowing_below(qs, vw.queue, vr.admission.pool, qs.common_ancestor(w.queue, vw.queue)):
        errs.append(f"{name}: reclaimed from queue {vw.queue} which was not borrowing")
    if rule is PreemptRule.FAIR_SHARE and not qs.queues[qs.root[w.queue]].fair_sharing_preemption:
        errs.append(f"{name}: preempted for fair sharing in a cohort that has not opted in")
    return errs + _victim_priority(w, vw, name, rule, pol)


def _victim_priority(
    w: Workload, vw: Workload, name: str, rule: PreemptRule, pol: PreemptionPolicy | None
) -> list[str]:
    """A cohort victim's priority against its preemptor's ``reclaimWithinCohort``: a borrowing
    preemption, or a reclaim under ``LowerPriority``, takes lower priorities only; under
    ``LowerOrEqualPriority`` lower or equal; under ``Never`` no reclaim at all."""
    reclaim = rule in (PreemptRule.RECLAIM, PreemptRule.FAIR_SHARE)
    policy = pol.reclaim_within_cohort if pol is not None else None
    if reclaim and policy is ReclaimPolicy.NEVER:
        return [f"{name}: reclaimed ({rule}) for a queue whose reclaimWithinCohort is Never"]
    if reclaim and policy is ReclaimPolicy.LOWER_OR_EQUAL_PRIORITY:
        if vw.priority > w.priority:
            return [
                f"{name}: victim priority {vw.priority} above preemptor {w.priority} (LowerOrEqualPriority)"
            ]
        return []
    if (not reclaim or policy is ReclaimPolicy.LOWER_PRIORITY) and not vw.priority < w.priority:
        return [f"{name}: victim priority {vw.priority} not below preemptor {w.priority}"]
    return []


def check_cycle(before: Snapshot, decisions: Decisions, after: Snapshot) -> list[str]:
    """Everything: decisions legal and the resulting state within capacity and quota."""
    return check_decisions(before, decisions) + check_state(after)
