"""``gpupool bench kube --versus kueue``: the same Kueue-style Jobs on the same kind of real
local cluster (``gpupool.kube.realcluster``: etcd, kube-apiserver, kube-controller-manager, the
node agent's simulated GPU nodes), once admitted by Kueue v0.17 and bound by kube-scheduler, once
admitted and bound by gpupool (``gpupool serve --backend kubernetes`` in a subprocess).

Why two clusters, started one after the other, rather than one: Kueue's Job webhook and
gpupool would both act on a queued Job; each side gets a fresh control plane of the same shape.

The case (Kueue's scheduler-performance baseline shape moved to GPUs): three ClusterQueues in
one cohort with borrowing, a few hundred one-GPU Jobs more than the GPUs hold, unevenly spread
(one team under its quota, one far over it). Kueue's ResourceFlavor, ClusterQueues (cohort,
nominal quota, borrowing limit) and LocalQueues are generated from the gpupool Pool and Queue
manifests the gpupool side is served with (``kueue_objects``), so both read one quota.

Measured per side, from the first create (the creates' own time is reported too: Kueue's Job
webhook is called on each one, so they take longer on the Kueue side): seconds until every admissible Job is admitted
(``suspend: false``) and until its pod is bound (``spec.nodeName``), admissions/s over that
time, the most GPUs each queue held at any sample against its nominal quota plus borrowing
limit and the cohort against the GPUs (a violation is counted when exceeded), and the CPU
seconds of the deciding processes (Kueue + kube-scheduler; the gpupool server) read from /proc,
plus the API server's. The pods run far longer than the benchmark.
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

API = "gpupool.io/v1alpha1"
LABELS = {"gpupool.io/environment": "bench"}
NAMESPACE = "default"
GPU = "nvidia.com/gpu"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# (queue, share of the GPUs it is guaranteed, share of the Jobs sent to it)
TEAMS = (("team-a", 0.5, 0.25), ("team-b", 0.3, 0.5), ("team-c", 0.2, 0.25))


def gpupool_manifests(nodes: int) -> list[dict[str, Any]]:
    """Pool ``bench`` and a cohort ``bench`` of three team queues whose guarantees sum to the
    GPUs; each may borrow up to half its guarantee from the others' unused share."""
    gpus = nodes * 8
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "ResourcePool",
            "metadata": {"name": "bench"},
            "spec": {"nodeSelector": LABELS},
        },
        {
            "apiVersion": API,
            "kind": "Queue",
            "metadata": {"name": "bench"},
            "spec": {"quotas": [{"pool": "bench", "guarantee": {GPU: gpus}}]},
        },
    ]
    left = gpus
    for i, (name, share, _) in enumerate(TEAMS):
        # the last takes what is left, so the guarantees sum to the GPUs exactly
        guarantee = left if i == len(TEAMS) - 1 else int(gpus * share)
        left -= guarantee
        docs.append(
            {
                "apiVersion": API,
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": {
                    "parent": "bench",
                    "quotas": [
                        {
                            "pool": "bench",
                            "guarantee": {GPU: guarantee},
                            "borrowingLimit": {GPU: guarantee // 2},
                        }
                    ],
                },
            }
        )
    return docs


def kueue_objects(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for Kueue from gpupool manifests: a ResourceFlavor per Pool
    (its node labels the Pool's selector), a ClusterQueue per leaf Queue (cohort: its parent;
    nominal quota: its guarantee; its borrowing limit) and a LocalQueue of the same name."""
    kapi = "kueue.x-k8s.io/v1beta2"
    base = "/apis/kueue.x-k8s.io/v1beta2"
    out: list[tuple[str, dict[str, Any]]] = []
    for d in docs:
        if d["kind"] == "ResourcePool":
            flavor = {"nodeLabels": dict(d["spec"].get("nodeSelector") or {})}
            out.append(
                (
                    f"{base}/resourceflavors",
                    {"apiVersion": kapi, "kind": "ResourceFlavor", "metadata": d["metadata"], "spec": flavor},
                )
            )
    for d in docs:
        spec = d["spec"] if d["kind"] == "Queue" else None
        if spec is None or not spec.get("parent"):
            continue
        name = d["metadata"]["name"]
        flavors = []
        for q in spec["quotas"]:
            res: dict[str, Any] = {"name": GPU, "nominalQuota": q["guarantee"][GPU]}
            if q.get("borrowingLimit"):
                res["borrowingLimit"] = q["borrowingLimit"][GPU]
            flavors.append({"name": q["pool"], "resources": [res]})
        cq = {
            "cohortName": spec["parent"],
            "namespaceSelector": {},
            "queueingStrategy": spec.get("queueingStrategy", "BestEffortFIFO"),
            "resourceGroups": [{"coveredResources": [GPU], "flavors": flavors}],
            "preemption": kueue_preemption(spec.get("preemption") or {}),
        }
        out.append(
            (
                f"{base}/clusterqueues",
                {"apiVersion": kapi, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": cq},
            )
        )
        out.append(
            (
                f"{base}/namespaces/{NAMESPACE}/localqueues",
                {
                    "apiVersion": kapi,
                    "kind": "LocalQueue",
                    "metadata": {"name": name},
                    "spec": {"clusterQueue": name},
                },
            )
        )
    return out


def kueue_preemption(p: dict[str, Any]) -> dict[str, Any]:
    """A gpupool Queue's preemption policy (gpupool's defaults where unset) as Kueue's, so both
    sides may reclaim alike. gpupool's defaults differ from Kueue's (``Never`` everywhere)."""
    borrow = p.get("borrowWithinCohort") or {}
    reclaim = p.get("reclaimWithinCohort", "Any")
    if reclaim not in ("Never", "LowerPriority", "Any"):
        raise ValueError(f"spec.preemption.reclaimWithinCohort {reclaim!r} has no Kueue equivalent")
    return {
        "withinClusterQueue": p.get("withinQueue", "LowerPriority"),
        "reclaimWithinCohort": reclaim,
        "borrowWithinCohort": {
            "policy": borrow.get("policy", "Never") if isinstance(borrow, dict) else borrow
        },
    }


def limits(docs: list[dict[str, Any]]) -> dict[str, int]:
    """The most GPUs each leaf queue may hold: guarantee plus borrowing limit."""
    out = {}
    for d in docs:
        if d["kind"] == "Queue" and d["spec"].get("parent"):
            q = d["spec"]["quotas"][0]
            out[d["metadata"]["name"]] = int(q["guarantee"][GPU]) + int(
                (q.get("borrowingLimit") or {}).get(GPU, 0)
            )
    return out


def jobs(count: int, scheduler: str) -> list[dict[str, Any]]:
    """``count`` one-GPU Kueue-style Jobs (queue label, ``suspend: true``) spread over the teams
    by their job shares; ``scheduler``: the pods' schedulerName."""
    out = []
    for i in range(count):
        frac, acc, queue = (i + 0.5) / count, 0.0, TEAMS[-1][0]
        for name, _, share in TEAMS:
            acc += share
            if frac < acc:
                queue = name
                break
        out.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"vs-{i:05d}", "labels": {QUEUE_LABEL: queue}},
                "spec": {
                    "suspend": True,
                    "template": {
                        "metadata": {"annotations": {"fake.gpupool.io/run-seconds": "36000"}},
                        "spec": {
                            "schedulerName": scheduler,
                            "restartPolicy": "Never",
                            "containers": [
                                {"name": "main", "image": "bench", "resources": {"limits": {GPU: 1}}}
                            ],
                        },
                    },
                },
            }
        )
    return out


def _cpu_s(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _sample(http: httpx.Client) -> tuple[dict[str, str], int]:
    """(admitted Job name -> its queue, pods bound) now."""
    items = http.get(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs").json()["items"]
    admitted = {
        j["metadata"]["name"]: j["metadata"]["labels"][QUEUE_LABEL]
        for j in items
        if j["spec"].get("suspend") is False
    }
    pods = http.get(f"/api/v1/namespaces/{NAMESPACE}/pods").json()["items"]
    return admitted, sum(1 for p in pods if p["spec"].get("nodeName"))


def _observe(
    http: httpx.Client,
    target: int,
    caps: dict[str, int],
    gpus: int,
    t0: float,
    stall_s: float = 90.0,
    settle_s: float = 20.0,
) -> dict[str, Any]:
    """Sample the Jobs and pods every 0.5 s until ``target`` are admitted and bound, then on
    until nothing changed for ``settle_s`` (a reclaim may still be under way), or until no
    progress for ``stall_s``: when each count was reached, the most GPUs each queue held at any
    sample and at the end, and the preemptions (an admitted Job seen suspended again)."""
    peak, peak_total = dict.fromkeys(caps, 0), 0
    admitted_at = bound_at = None
    before: dict[str, str] = {}
    preempted: set[str] = set()
    last, last_at = None, time.monotonic()
    while True:
        admitted, bound = _sample(http)
        now = time.monotonic()
        preempted |= set(before) - set(admitted)
        before = admitted
        held = dict.fromkeys(caps, 0)
        for queue in admitted.values():
            held[queue] += 1
        peak = {q: max(peak[q], held[q]) for q in caps}
        peak_total = max(peak_total, len(admitted))
        if len(admitted) >= target and admitted_at is None:
            admitted_at = now
        if bound >= target and bound_at is None:
            bound_at = now
        state = (frozenset(admitted), bound)
        if state != last:
            last, last_at = state, now
        elif now - last_at > (settle_s if admitted_at and bound_at else stall_s):
            break
        time.sleep(0.5)
    violations = [f"{q} held {peak[q]} > {caps[q]}" for q in caps if peak[q] > caps[q]]
    violations += [f"cohort held {peak_total} > {gpus} GPUs"] if peak_total > gpus else []
    return {
        "admitted": len(admitted),
        "bound": bound,
        "to_all_admitted_s": None if admitted_at is None else admitted_at - t0,
        "to_all_bound_s": None if bound_at is None else bound_at - t0,
        "admissions_per_s": target / (admitted_at - t0) if admitted_at else 0.0,
        "peak_gpus_per_queue": peak,
        "final_gpus_per_queue": held,
        "limit_per_queue": caps,
        "quota_violations": violations,
        "preemptions": len(preempted),
    }


def _side(
    name: str,
    nodes: int,
    count: int,
    work: Path,
    setup: Callable[..., tuple[str, dict[str, int]]],
) -> dict[str, Any]:
    """One side on a fresh cluster: ``setup(cp, http, docs, work, cleanup)`` installs the scheduler and returns
    (the pods' schedulerName, {label: pid} of the processes whose CPU is the decision's)."""
    from gpupool.kube.client import KubeApi, load_config
    from gpupool.kube.fake import nodes as builders
    from gpupool.kube.nodeagent import NodeAgent
    from gpupool.kube.realcluster import RealControlPlane

    docs = gpupool_manifests(nodes)
    cp = RealControlPlane(kueue=name == "kueue")
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
        scheduler, pids = setup(cp, http, docs, work / name, cleanup)
        pids["kube-apiserver"] = cp.processes["kube-apiserver"]
        cpu0 = {k: _cpu_s(p) for k, p in pids.items()}
        t0 = time.monotonic()
        for j in jobs(count, scheduler):
            r = http.post(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", json=j)
            if r.status_code != 201:
                raise RuntimeError(f"creating Job {j['metadata']['name']}: {r.status_code} {r.text[:300]}")
        created = time.monotonic() - t0
        out = _observe(http, min(count, nodes * 8), limits(docs), nodes * 8, t0)
        out["create_seconds"] = created
        out["cpu_seconds"] = {k: round(_cpu_s(p) - cpu0[k], 2) for k, p in pids.items()}
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
        r = http.post(path, json=obj)
        if r.status_code != 201:
            raise RuntimeError(
                f"creating {obj['kind']} {obj['metadata']['name']}: {r.status_code} {r.text[:300]}"
            )
    # A LocalQueue is usable once Kueue has seen its ClusterQueue active.
    end = time.monotonic() + 120
    while time.monotonic() < end:
        cqs = http.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues").json()["items"]
        active = [
            c for c in cqs for k in (c.get("status") or {}).get("conditions") or [] if k["type"] == "Active"
        ]
        if len(active) == len(cqs) and all(
            k["status"] == "True" for c in active for k in c["status"]["conditions"] if k["type"] == "Active"
        ):
            break
        time.sleep(0.5)
    procs = cp.processes
    return "default-scheduler", {"kueue": procs["kueue"], "kube-scheduler": procs["kube-scheduler"]}


def _gpupool_setup(
    cp: Any, http: httpx.Client, docs: list[dict[str, Any]], work: Path, cleanup: list[Any]
) -> Any:
    from gpupool.bench.kube import _compile, _kill, _serve, _wait_ready

    cfg = work / "config"
    cfg.mkdir(parents=True)
    (cfg / "bench.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    _compile(work)
    log = work / "serve.log"
    proc, port = _serve(cp.kubeconfig, work / "state", cfg, log)
    cleanup.append(lambda: _kill(proc, 15))
    _wait_ready(proc, port, log)
    return "gpupool", {"gpupool": proc.pid}


def run_versus(
    nodes: int, count: int, say: Any = lambda msg: None, keep: Path | None = None
) -> dict[str, Any]:
    """Both sides, Kueue first; the load average before and after."""
    work = keep or Path(tempfile.mkdtemp(prefix="gpupool-bench-versus-"))
    work.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    try:
        say(f"kueue + kube-scheduler: {nodes} nodes x 8 GPUs, {count} Jobs")
        kueue = _side("kueue", nodes, count, work, _kueue_setup)
        say("gpupool: the same Jobs on a fresh cluster")
        gp = _side("gpupool", nodes, count, work, _gpupool_setup)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "case": "cohort-borrowing",
        "nodes": nodes,
        "gpus": nodes * 8,
        "jobs": count,
        "admissible": min(count, nodes * 8),
        "teams": [{"queue": q, "guarantee_share": g, "job_share": s} for q, g, s in TEAMS],
        "sides": {"kueue": kueue, "gpupool": gp},
        "cpus": os.cpu_count(),
        "load_average_1m": {"before": round(load0[0], 2), "after": round(os.getloadavg()[0], 2)},
    }


def format_versus(r: dict[str, Any]) -> str:
    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = [
        f"case {r['case']}: {r['nodes']} nodes x 8 GPUs, {r['jobs']} one-GPU Jobs ({r['admissible']} admissible),"
        f" 3 ClusterQueues/Queues in one cohort; {r['cpus']} CPUs, load {r['load_average_1m']['before']}"
        f" -> {r['load_average_1m']['after']}",
        f"  {'side':<24} {'admitted':>8} {'bound':>6} {'creates s':>9} {'all admitted s':>14} {'all bound s':>11}"
        f" {'adm/s':>7} {'violations':>10}  CPU s",
    ]
    for name, label in (("kueue", "kueue + kube-scheduler"), ("gpupool", "gpupool")):
        x = r["sides"][name]
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in x["cpu_seconds"].items())
        lines.append(
            f"  {label:<24} {x['admitted']:>8} {x['bound']:>6} {s(x['create_seconds']):>9} {s(x['to_all_admitted_s']):>14}"
            f" {s(x['to_all_bound_s']):>11} {x['admissions_per_s']:>7.1f} {len(x['quota_violations']):>10}  {cpu}"
        )
    for name in ("kueue", "gpupool"):
        x = r["sides"][name]
        peak = ", ".join(
            f"{q} {x['peak_gpus_per_queue'][q]}/{x['final_gpus_per_queue'][q]}/{x['limit_per_queue'][q]}"
            for q in x["limit_per_queue"]
        )
        lines.append(f"  GPUs peak/final/limit, {name}: {peak}; preemptions {x['preemptions']}")
    return "\n".join(lines) + "\n"
