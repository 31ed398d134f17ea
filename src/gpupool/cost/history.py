"""The store's own history as exact intervals: when each run held GPUs, when each wait lasted.

Why from events and audit, not from the workload row alone: the row keeps only the latest
placement and the first admission time, while a preempted-then-restarted workload ran several
times. Every phase change writes one event (its ``reason`` is the new phase, at the
transaction's time) and every admission writes one ``workload.admit`` audit record at the same
time with the pool, the nodes and the milli-GPUs held; pairing them gives each run once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from gpupool.audit import AuditRecord
from gpupool.manifests import Bundle
from gpupool.model import Node
from gpupool.store import EventRecord, Store, WorkloadRecord

#: phases that end a run (a Running -> Pending change is a requeue after a failed attempt)
RUN_ENDS = frozenset({"Pending", "Preempted", "Succeeded", "Failed", "Cancelled"})
#: phases in which a workload waits for capacity or for a decision
WAITING = frozenset({"Submitted", "Pending", "AwaitingApproval"})
#: the audit actions written with a run's end; ``endedAt`` in their detail is its own end time
END_ACTIONS = frozenset({"workload.finish", "workload.failure", "workload.fail"})
PHASE_EVENTS = frozenset(
    {"Submitted", "Pending", "AwaitingApproval", "Admitted", "Running", "Succeeded", "Failed", "Cancelled"}
    | {"Preempted", "Rejected"}
)


@dataclass(frozen=True, slots=True)
class Resources:
    """What one run held: milli-GPUs in total (gpuMilli x devices, summed over pods), CPU, memory."""

    pool: str
    gpu_model: str
    gpu_milli: int
    devices: int
    fraction_milli: int  # per-device share: 1000 whole GPUs, less for fractional pods
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Run:
    """One admission until its end; ``end`` None while it still holds its GPUs."""

    workload: str
    attempt: int
    start: datetime
    end: datetime | None
    outcome: str  # the phase that ended it, or "Running"
    res: Resources


@dataclass(frozen=True, slots=True)
class Wait:
    """One stretch in Pending/AwaitingApproval; ``end`` None while it still waits."""

    workload: str
    start: datetime
    end: datetime | None
    admitted: bool
    reason: str


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """The attributes every figure is grouped by."""

    name: str
    queue: str
    priority_class: str
    task_type: str
    requested_gpu_milli: int
    requested_cpu_milli: int
    requested_memory_mib: int
    pool_hint: str  # the pool asked for, if any
    phase: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodeSpan:
    """One node as it was from ``start`` to ``end``: ``start`` None when it was there before the
    configuration history began (a store older than its history), ``end`` None while it stays."""

    node: Node
    start: datetime | None
    end: datetime | None


@dataclass
class History:
    """Everything metering needs, read once from the store (or built by a test).

    ``nodes`` None: no node history is known (a simulator replay, a test), so capacity is the
    configuration in force over the whole window."""

    workloads: dict[str, WorkloadInfo]
    runs: list[Run]
    waits: list[Wait]
    failures: list[tuple[str, datetime, str]]  # (workload, at, reason code)
    nodes: list[NodeSpan] | None = None


def node_models(bundle: Bundle) -> dict[str, str]:
    return {n.name: n.gpu_model for n in bundle.nodes}


def _admit_resources(
    detail: Mapping[str, Any],
    info: WorkloadInfo,
    models: Mapping[str, str],
    placement: Mapping[str, Any] | None,
) -> Resources:
    """The resources of one admission: the audit record's totals, the stored placement's detail
    when it is this run's, else the manifest's requests for CPU and memory."""
    pool = str(detail.get("pool") or (placement or {}).get("pool") or info.pool_hint or "")
    nodes = [str(n) for n in detail.get("nodes", ())]
    pods = list((placement or {}).get("pods", ()))
    gpu_milli = int(
        detail.get("gpuMilli", sum(int(p.get("gpuMilli", 0)) * len(p.get("devices", ())) for p in pods))
    )
    devices = sum(len(p.get("devices", ())) for p in pods)
    fraction = min((int(p.get("gpuMilli", 1000)) for p in pods if p.get("devices")), default=1000)
    if not pods:
        devices = -(-gpu_milli // 1000)
        fraction = 1000 if gpu_milli % 1000 == 0 else gpu_milli % 1000
    cpu = sum(int(p.get("cpuMilli", 0)) for p in pods) or info.requested_cpu_milli
    mem = sum(int(p.get("memoryMiB", 0)) for p in pods) or info.requested_memory_mib
    model = next((models[n] for n in nodes if n in models), "")
    if not model:
        model = next((models[str(p.get("node"))] for p in pods if str(p.get("node")) in models), "unknown")
    return Resources(pool, model, gpu_milli, devices, fraction, cpu, mem)


def _admit_detail(unused: list[AuditRecord], at: datetime) -> Mapping[str, Any]:
    """The admit record written with this Admitted event (same transaction: same time), else the
    oldest one not yet paired; {} when the audit has none (the manifest's requests stand in)."""
    for i, r in enumerate(unused):
        if r.at == at:
            return unused.pop(i).detail
    return unused.pop(0).detail if unused else {}


def workload_runs(
    info: WorkloadInfo,
    events: Sequence[EventRecord],
    admits: Sequence[AuditRecord],
    models: Mapping[str, str],
    placement: Mapping[str, Any] | None,
    ended: Mapping[datetime, datetime] | None = None,
) -> tuple[list[Run], list[Wait]]:
    """Pair each Admitted event with its admit audit record and close it at the next run-ending
    phase; every waiting stretch likewise up to its admission. An Admitted event while a run is
    open (a same-phase update) continues that run. ``ended``: run-ending event time -> the run's
    own end, where the backend knew it was earlier (it ended while the controller was down)."""
    runs: list[Run] = []
    waits: list[Wait] = []
    unused = list(admits)
    open_run: tuple[datetime, Mapping[str, Any]] | None = None
    open_wait: tuple[datetime, str] | None = None
    for e in (e for e in events if e.reason in PHASE_EVENTS):
        if e.reason == "Admitted" and open_run is None:
            open_run = (e.at, _admit_detail(unused, e.at))
            if open_wait is not None:
                why = waited_for(open_run[1], open_wait[1])
                waits.append(Wait(info.name, open_wait[0], e.at, True, why))
                open_wait = None
        elif e.reason in RUN_ENDS and open_run is not None:
            res = _admit_resources(open_run[1], info, models, None)
            end = max(open_run[0], min(e.at, (ended or {}).get(e.at, e.at)))
            runs.append(Run(info.name, len(runs) + 1, open_run[0], end, e.reason, res))
            open_run = None
        if e.reason in WAITING and open_wait is None:
            open_wait = (e.at, _wait_reason(e))
        elif e.reason in WAITING and open_wait is not None and _wait_reason(e):
            open_wait = (open_wait[0], _wait_reason(e))  # a later reason within the same wait
        elif e.reason not in WAITING and e.reason != "Admitted" and open_wait is not None:
            waits.append(Wait(info.name, open_wait[0], e.at, False, open_wait[1] or UNRECORDED))
            open_wait = None
    if open_run is not None:  # still holding its GPUs: the stored placement is this run's
        res = _admit_resources(open_run[1], info, models, placement)
        runs.append(Run(info.name, len(runs) + 1, open_run[0], None, "Running", res))
    elif runs and placement:  # a finished run keeps its placement on the row: its detail is exact
        last = runs[-1]
        runs[-1] = replace(last, res=_admit_resources(_detail_of(last, admits), info, models, placement))
    if open_wait is not None:
        waits.append(Wait(info.name, open_wait[0], None, False, info.reason or open_wait[1] or UNRECORDED))
    return runs, waits


#: a wait the scheduler admitted at the first cycle that considered it gave no reason
FIRST_CYCLE = "admitted when first considered"
#: a wait whose admission record predates the recorded reason (older stores)
UNRECORDED = "(not recorded)"


def _wait_reason(e: EventRecord) -> str:
    """What a waiting-phase event says about why (a submission or a bare phase change says nothing)."""
    if e.reason == "Submitted" or not e.message or e.message.endswith(f"-> {e.reason}"):
        return ""
    return e.message


def waited_for(detail: Mapping[str, Any], seen: str) -> str:
    """Why an admitted wait waited: the scheduler's last pending reason, which the controller
    writes into the admission record (``waitedFor``; the row's reason is replaced on admission),
    else what the wait's events said."""
    recorded = detail.get("waitedFor")
    if recorded:
        return str(recorded)
    if seen:
        return seen
    return FIRST_CYCLE if recorded == "" else UNRECORDED


def _detail_of(run: Run, admits: Sequence[AuditRecord]) -> Mapping[str, Any]:
    return next((r.detail for r in admits if r.at == run.start), {})


def _info(w: WorkloadRecord, bundle: Bundle) -> WorkloadInfo:
    from gpupool.manifests.convert import workload_model

    m = workload_model(w.manifest, bundle.priority_classes, float(w.seq), strict=False)
    g, c, mem, _storage, _net = m.quota_vec()
    return WorkloadInfo(
        w.name,
        w.queue,
        w.priority_class or "",
        str(m.type),
        g,
        c,
        mem,
        m.pool or "",
        w.phase,
        w.reason,
    )


def build_history(
    workloads: Iterable[WorkloadRecord],
    events: Iterable[EventRecord],
    audit: Iterable[AuditRecord],
    bundle: Bundle,
) -> History:
    """Runs, waits and failures of every workload from the three record streams."""
    from gpupool.store.failure_events import parse_failure

    by_wl: dict[str, list[EventRecord]] = defaultdict(list)
    for e in events:
        by_wl[e.workload].append(e)
    admits: dict[str, list[AuditRecord]] = defaultdict(list)
    ended: dict[str, dict[datetime, datetime]] = defaultdict(dict)
    for r in audit:
        if r.action == "workload.admit":
            admits[r.name].append(r)
        elif r.action in END_ACTIONS and r.detail.get("endedAt"):
            ended[r.name][r.at] = datetime.fromisoformat(str(r.detail["endedAt"]))
    models = node_models(bundle)
    h = History({}, [], [], [])
    for w in workloads:
        info = _info(w, bundle)
        h.workloads[w.name] = info
        evs = sorted(by_wl.get(w.name, ()), key=lambda e: e.id)
        runs, waits = workload_runs(info, evs, admits.get(w.name, ()), models, w.placement, ended.get(w.name))
        h.runs.extend(runs)
        h.waits.extend(waits)
        for e in evs:
            f = parse_failure(e)
            if f is not None:
                h.failures.append((w.name, f.at, f.code))
    return h


def load_history(store: Store, bundle: Bundle) -> History:
    """The history of every stored workload and node, through the store's public reads only."""
    h = build_history(store.list_workloads(), store.list_events(), store.audit_records(), bundle)
    h.nodes = node_spans(store.kind_revisions("Cluster"))
    return h


#: the author of the revision 1 that migration 0003 gave objects older than the history
BACKFILL_AUTHOR = "migration"


def _revision_nodes(rev: Any) -> dict[str, Node]:
    """The nodes one Cluster revision declares (none for a deletion or an invalid state)."""
    from gpupool.manifests.convert import bundle_from_manifests

    if rev.action == "delete":
        return {}
    return {n.name: n for n in bundle_from_manifests([rev.manifest()], skip_invalid=True).nodes}


def _shape(n: Node) -> tuple[Any, ...]:
    """What capacity depends on: GPUs, their model and the labels pools select by."""
    return (n.gpu_count, n.gpu_model, n.accelerator, n.labels)


def node_spans(revisions: Iterable[Any]) -> list[NodeSpan]:
    """When each node existed, from the Cluster objects' revisions (in the order written): a
    node joins at the first revision that declares it and leaves at the first that no longer
    does (or changes its GPUs or labels: a new span begins). A node in a backfilled revision 1
    was there before history began."""
    open_: dict[tuple[str, str], tuple[Node, datetime | None]] = {}
    out: list[NodeSpan] = []
    for rev in revisions:
        now = _revision_nodes(rev)
        for (cluster, name), (node, start) in list(open_.items()):
            if cluster == rev.name and (name not in now or _shape(now[name]) != _shape(node)):
                out.append(NodeSpan(node, start, rev.at))
                del open_[(cluster, name)]
        before = rev.revision == 1 and rev.author == BACKFILL_AUTHOR
        for name, node in now.items():
            open_.setdefault((rev.name, name), (node, None if before else rev.at))
    out += [NodeSpan(node, start, None) for node, start in open_.values()]
    return out
