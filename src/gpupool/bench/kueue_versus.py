"""``gpupool bench kube --versus kueue``: the same Kueue-style Jobs on the same kind of real
local cluster (``gpupool.kube.realcluster``: etcd, kube-apiserver, kube-controller-manager, the
node agent's simulated GPU nodes), once admitted by Kueue v0.17 and bound by kube-scheduler, once
admitted and bound by gpupool (``gpupool serve --backend kubernetes`` in a subprocess).

Why two clusters, started one after the other, rather than one: Kueue's Job webhook and
gpupool would both act on a queued Job; each side gets a fresh control plane of the same shape.

The cases (``kueue_cases.CASES``): cohort borrowing with three priority classes (Kueue's
scheduler-performance baseline shape moved to GPUs), a reclaim of lent quota, and gangs
(Kueue's waitForPodsReady against gpupool's gang admission). Kueue's ResourceFlavor,
ClusterQueues (cohort, nominal quota, borrowing limit, preemption) and LocalQueues are generated
from the gpupool Pool and Queue manifests the gpupool side is served with, and both sides get
the same Kubernetes PriorityClasses, so both read one quota and one priority.

Measured per side and phase, from the phase's first create: seconds until the phase's
admissible Jobs are admitted (``suspend: false``) and their pods bound (``spec.nodeName``),
admissions/s and binds/s over those times, the most GPUs each queue held at any sample against
its nominal quota plus borrowing limit and the cohort against the GPUs (a violation when
exceeded), preemptions (an admitted Job seen suspended again; Kueue's waitForPodsReady
evictions count too), the final placement's fragmentation and the CPU seconds of the deciding
processes (Kueue + kube-scheduler; the gpupool server) read from /proc, plus the API server's.
"""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpupool.bench.kueue_cases import (
    CASES,
    GPU,
    GPUS_PER_NODE,
    JOB_NAME_LABEL,
    LABELS,
    NAMESPACE,
    QUEUE_LABEL,
    Case,
    fragmentation,
    gpupool_manifests,
    jobs,
    kueue_objects,
    limits,
    priority_classes,
)

__all__ = [
    "CASES",
    "GPU",
    "QUEUE_LABEL",
    "format_versus",
    "gpupool_manifests",
    "jobs",
    "kueue_objects",
    "limits",
    "run_versus",
]


def _cpu_s(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _live(p: dict[str, Any]) -> bool:
    """A pod bound and holding its GPUs (not being deleted, not finished)."""
    return (
        bool(p["spec"].get("nodeName"))
        and not p["metadata"].get("deletionTimestamp")
        and ((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
    )


def _sample(http: httpx.Client) -> tuple[dict[str, tuple[str, int]], list[dict[str, Any]]]:
    """(admitted Job name -> (its queue, its GPUs), the live bound pods) now."""
    items = http.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs").json()["items"]
    admitted = {}
    for j in items:
        if j["spec"].get("suspend") is False:
            lim = j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            gpus = int(lim.get(GPU, 0)) * int(j["spec"].get("parallelism") or 1)
            admitted[j["metadata"]["name"]] = (j["metadata"]["labels"][QUEUE_LABEL], gpus)
    pods = http.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
    return admitted, [p for p in pods if _live(p)]


class _Watch:
    """What the samples saw over all phases: each queue's peak GPUs, the preempted Jobs."""

    def __init__(self, caps: dict[str, int], gpus: int) -> None:
        self.caps, self.gpus = caps, gpus
        self.peak, self.peak_total = dict.fromkeys(caps, 0), 0
        self.before: dict[str, tuple[str, int]] = {}
        self.preempted = 0
        self.held: dict[str, int] = dict.fromkeys(caps, 0)
        self.pods: list[dict[str, Any]] = []
        #: [seconds since the first sample, {queue: GPUs held}] at each sample that changed it
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self._t0: float | None = None

    def sample(self, http: httpx.Client) -> tuple[dict[str, tuple[str, int]], list[dict[str, Any]]]:
        admitted, pods = _sample(http)
        self.preempted += len(set(self.before) - set(admitted))
        self.before, self.pods = admitted, pods
        self.held = dict.fromkeys(self.caps, 0)
        for queue, gpus in admitted.values():
            self.held[queue] += gpus
        now = time.monotonic()
        self._t0 = now if self._t0 is None else self._t0
        if not self.timeline or self.timeline[-1][1] != self.held:
            self.timeline.append((round(now - self._t0, 1), dict(self.held)))
        self.peak = {q: max(self.peak[q], self.held[q]) for q in self.caps}
        self.peak_total = max(self.peak_total, sum(self.held.values()))
        return admitted, pods

    def violations(self) -> list[str]:
        out = [f"{q} held {self.peak[q]} > {self.caps[q]}" for q in self.caps if self.peak[q] > self.caps[q]]
        return out + (
            [f"cohort held {self.peak_total} > {self.gpus} GPUs"] if self.peak_total > self.gpus else []
        )


def _observe(
    http: httpx.Client,
    w: _Watch,
    names: set[str],
    admit: int,
    bind: int,
    t0: float,
    stall_s: float = 90.0,
    settle_s: float = 20.0,
    max_s: float = 110.0,
) -> dict[str, Any]:
    """Sample every 0.5 s until ``admit`` of the phase's Jobs (``names``) are admitted and
    ``bind`` of their pods bound, then on until nothing changed for ``settle_s`` (a reclaim or
    an eviction may still be under way), or no progress for ``stall_s``, or ``max_s`` in all."""
    admitted_at = bound_at = None
    last, last_at, pre0 = None, time.monotonic(), w.preempted
    while True:
        admitted, pods = w.sample(http)
        now = time.monotonic()
        mine = [n for n in admitted if n in names]
        bound = sum(1 for p in pods if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) in names)
        if len(mine) >= admit and admitted_at is None:
            admitted_at = now
        if bound >= bind and bound_at is None:
            bound_at = now
        state = (frozenset(admitted), len(pods))
        if state != last:
            last, last_at = state, now
        elif now - last_at > (settle_s if admitted_at and bound_at else stall_s) or now - t0 > max_s:
            break
        time.sleep(0.5)
    return {
        "jobs": len(names),
        "admissible": admit,
        "admitted": len(mine),
        "bound": bound,
        "to_all_admitted_s": None if admitted_at is None else admitted_at - t0,
        "to_all_bound_s": None if bound_at is None else bound_at - t0,
        "admissions_per_s": admit / (admitted_at - t0) if admitted_at else 0.0,
        "binds_per_s": bind / (bound_at - t0) if bound_at else 0.0,
        "preemptions": w.preempted - pre0,
    }


def _create(http: httpx.Client, path: str, obj: dict[str, Any]) -> None:
    r = http.post(path, json=obj)
    if r.status_code != 201:
        raise RuntimeError(
            f"creating {obj['kind']} {obj['metadata']['name']}: {r.status_code} {r.text[:300]}"
        )


def _run_phases(http: httpx.Client, case: Case, nodes: int, count: int, scheduler: str) -> dict[str, Any]:
    """Create each phase's Jobs and observe it; the last phase's figures are the side's."""
    docs = gpupool_manifests(nodes, case.teams)
    w = _Watch(limits(docs), nodes * GPUS_PER_NODE)
    phases = []
    for phase in case.phases(nodes, count, scheduler):
        t0 = time.monotonic()
        for j in phase.jobs:
            _create(http, f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", j)
        created = time.monotonic() - t0
        names = {j["metadata"]["name"] for j in phase.jobs}
        seen = _observe(http, w, names, phase.admit, phase.bind, t0, settle_s=case.settle_s)
        phases.append(seen | {"create_seconds": created})
    nodes_names = [f"vs-{i}" for i in range(nodes)]
    admitted_names = set(w.before)
    waiting = sum(
        1
        for p in http.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
        if not p["spec"].get("nodeName")
        and (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) in admitted_names
    )
    out = dict(phases[-1])
    out |= {
        "phases": phases,
        "peak_gpus_per_queue": w.peak,
        "final_gpus_per_queue": w.held,
        "limit_per_queue": w.caps,
        "gpus_per_queue_over_time": w.timeline,
        "quota_violations": w.violations(),
        "preemptions_all_phases": w.preempted,
        "fragmentation": fragmentation(w.pods, _node_names(http) or nodes_names),
        "unbound_pods_of_admitted_jobs": waiting,
    }
    return out


def _workload_conditions(http: httpx.Client) -> dict[str, int]:
    """How many of Kueue's Workloads have each condition True at the end (QuotaReserved,
    Admitted, PodsReady, Evicted, ...): shows whether waitForPodsReady acted."""
    items = (
        http.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads").json().get("items") or []
    )
    out: dict[str, int] = {}
    for wl in items:
        for c in (wl.get("status") or {}).get("conditions") or []:
            if c.get("status") == "True":
                out[c["type"]] = out.get(c["type"], 0) + 1
    return out


def _node_names(http: httpx.Client) -> list[str]:
    return [n["metadata"]["name"] for n in http.get("/api/v1/nodes").json()["items"]]


def _side(
    name: str,
    case: Case,
    nodes: int,
    count: int,
    work: Path,
    setup: Callable[..., tuple[str, dict[str, int]]],
) -> dict[str, Any]:
    """One side on a fresh cluster: ``setup(cp, http, docs, work, cleanup)`` installs the scheduler and returns
    (the pods' schedulerName, {label: pid} of the processes whose CPU is the decision's)."""
    from gpupool.kube import kueue_local
    from gpupool.kube.client import KubeApi, load_config
    from gpupool.kube.fake import nodes as builders
    from gpupool.kube.nodeagent import NodeAgent
    from gpupool.kube.realcluster import RealControlPlane

    docs = gpupool_manifests(nodes, case.teams)
    kueue = name == "kueue"
    cp = RealControlPlane(addons=kueue_local.addons(False, kueue, case.kueue_config if kueue else None))
    cp.start()
    agent = None
    cleanup: list[Callable[[], None]] = []
    try:
        agent = NodeAgent(
            KubeApi(load_config(str(cp.kubeconfig))),
            builders.gpu_nodes(nodes, "vs", labels=LABELS, hami=False),
            use_hami=False,
        )
        agent.start()
        agent.wait_ready(300)
        http = httpx.Client(
            base_url=cp.server,
            verify=ssl.create_default_context(cafile=str(cp.ca_file)),
            headers={"Authorization": f"Bearer {cp.admin_token}"},
            timeout=60,
        )
        cleanup.append(http.close)
        for pc in priority_classes():
            _create(http, "/apis/scheduling.k8s.io/v1/priorityclasses", pc)
        scheduler, pids = setup(cp, http, docs, work / name, cleanup)
        pids["kube-apiserver"] = cp.processes["kube-apiserver"]
        cpu0 = {k: _cpu_s(p) for k, p in pids.items()}
        out = _run_phases(http, case, nodes, count, scheduler)
        out["cpu_seconds"] = {k: round(_cpu_s(p) - cpu0[k], 2) for k, p in pids.items()}
        if kueue:
            out["kueue_workload_conditions"] = _workload_conditions(http)
        return out
    finally:
        for fn in reversed(cleanup):
            fn()
        if agent is not None:
            agent.stop()
            agent.api.close()
        cp.stop()


def _kueue_setup(
    cp: Any, http: httpx.Client, docs: list[dict[str, Any]], work: Path, cleanup: list[Any]
) -> Any:
    for path, obj in kueue_objects(docs):
        _create(http, path, obj)
    # A LocalQueue is usable once Kueue has seen its ClusterQueue active.
    end = time.monotonic() + 120
    while time.monotonic() < end:
        cqs = http.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues").json()["items"]
        conds = [
            k for c in cqs for k in (c.get("status") or {}).get("conditions") or [] if k["type"] == "Active"
        ]
        if len(conds) == len(cqs) and all(k["status"] == "True" for k in conds):
            break
        time.sleep(0.5)
    procs = cp.processes
    return "default-scheduler", {"kueue": procs["kueue"], "kube-scheduler": procs["kube-scheduler"]}


def _gpupool_setup(
    cp: Any, http: httpx.Client, docs: list[dict[str, Any]], work: Path, cleanup: list[Any]
) -> Any:
    from gpupool.bench.serving import compile_bytecode, kill, serve, wait_ready

    cfg = work / "config"
    cfg.mkdir(parents=True)
    (cfg / "bench.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    compile_bytecode(work)
    log = work / "serve.log"
    proc, port = serve(cp.kubeconfig, work / "state", cfg, log)
    cleanup.append(lambda: kill(proc, 15))
    wait_ready(proc, port, log)
    return "gpupool", {"gpupool": proc.pid}


def select_cases(names: list[str] | None) -> list[Case]:
    """The cases named (all, in their order, when none); an unknown name is a ValueError."""
    if not names:
        return list(CASES.values())
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"unknown case {', '.join(unknown)}; one of {', '.join(CASES)}")
    return [CASES[n] for n in names]


def run_case(case: Case, nodes: int | None, count: int | None, say: Any, work: Path) -> dict[str, Any]:
    """Both sides of one case, Kueue first; the load average before and after."""
    n, c = nodes or case.nodes, count or case.jobs
    load0 = os.getloadavg()
    say(f"{case.name}: kueue + kube-scheduler, {n} nodes x {GPUS_PER_NODE} GPUs")
    kueue = _side("kueue", case, n, c, work / case.name, _kueue_setup)
    say(f"{case.name}: gpupool, the same Jobs on a fresh cluster")
    gp = _side("gpupool", case, n, c, work / case.name, _gpupool_setup)
    return {
        "case": case.name,
        "summary": case.summary,
        "nodes": n,
        "gpus": n * GPUS_PER_NODE,
        "jobs": sum(p["jobs"] for p in kueue["phases"]),
        "sides": {"kueue": kueue, "gpupool": gp},
        "differs_by_design": list(case.differs),
        "cpus": os.cpu_count(),
        "load_average_1m": {"before": round(load0[0], 2), "after": round(os.getloadavg()[0], 2)},
    }


def run_versus(
    nodes: int | None = None,
    count: int | None = None,
    say: Any = lambda msg: None,
    keep: Path | None = None,
    cases: list[str] | None = None,
) -> dict[str, Any]:
    """The selected cases (all by default), each on two fresh clusters."""
    chosen = select_cases(cases)
    work = keep or Path(tempfile.mkdtemp(prefix="gpupool-bench-versus-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = [run_case(c, nodes, count, say, work) for c in chosen]
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return {"cases": results, "cpus": os.cpu_count()}


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_case(r: dict[str, Any]) -> str:
    """One case: a row per side, then each side's queues, preemptions and fragmentation."""
    lines = [
        f"case {r['case']}: {r['nodes']} nodes x {GPUS_PER_NODE} GPUs, {r['jobs']} Jobs; {r['summary']};"
        f" {r['cpus']} CPUs, load {r['load_average_1m']['before']} -> {r['load_average_1m']['after']}",
        f"  {'side':<24} {'admitted':>8} {'bound':>6} {'creates s':>9} {'all admitted s':>14} {'all bound s':>11}"
        f" {'adm/s':>6} {'binds/s':>7} {'preempt':>7} {'violations':>10}  CPU s",
    ]
    for name, label in (("kueue", "kueue + kube-scheduler"), ("gpupool", "gpupool")):
        x = r["sides"][name]
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in x["cpu_seconds"].items())
        got = f"{x['admitted']}/{x['admissible']}"
        lines.append(
            f"  {label:<24} {got:>8} {x['bound']:>6} {_s(x['create_seconds']):>9} {_s(x['to_all_admitted_s']):>14}"
            f" {_s(x['to_all_bound_s']):>11} {x['admissions_per_s']:>6.1f} {x['binds_per_s']:>7.1f}"
            f" {x['preemptions_all_phases']:>7} {len(x['quota_violations']):>10}  {cpu}"
        )
    for name in ("kueue", "gpupool"):
        x = r["sides"][name]
        f = x["fragmentation"]
        peak = ", ".join(
            f"{q} {x['peak_gpus_per_queue'][q]}/{x['final_gpus_per_queue'][q]}/{x['limit_per_queue'][q]}"
            for q in x["limit_per_queue"]
        )
        lines.append(
            f"  {name}: GPUs peak/final/limit {peak}; nodes partly used {f['partly_used_nodes']}"
            f" ({f['free_gpus_on_partly_used']} GPUs free on them), empty {f['empty_nodes']};"
            f" unbound pods of admitted Jobs {x['unbound_pods_of_admitted_jobs']}"
            + "".join(
                f"; Workloads {k} {v}" for k, v in sorted(x.get("kueue_workload_conditions", {}).items())
            )
        )
    lines += [f"  differs by design: {d}" for d in r.get("differs_by_design", [])]
    return "\n".join(lines) + "\n"


def format_versus(r: dict[str, Any]) -> str:
    return "\n".join(format_case(c) for c in r["cases"])
