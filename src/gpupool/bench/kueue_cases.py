"""The cases of ``gpupool bench kube --versus kueue``: the gpupool manifests each side is given
(Kueue's objects are generated from them), the Jobs sent in phases and what each phase should
end with. Kept apart from the runner (``kueue_versus``) so the shapes can be tested without a
cluster.

Why phases: a reclaim can only be measured once the lender's quota has been borrowed, so the
reclaim case first fills the cohort with the borrowers' Jobs and only then sends the lender's
own; each phase is timed from its own first create.

Why fixed small sizes: each side starts a fresh control plane and the bench must run on a
2-core machine in under two minutes a side; ``--nodes``/``--jobs`` scale a case up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpupool.manifests import default_priority_classes

API = "gpupool.io/v1alpha1"
LABELS = {"gpupool.io/environment": "bench"}
NAMESPACE = "default"
GPU = "nvidia.com/gpu"
GPUS_PER_NODE = 8
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# (queue, share of the GPUs it is guaranteed, share of the Jobs sent to it)
TEAMS = (("team-a", 0.5, 0.25), ("team-b", 0.3, 0.5), ("team-c", 0.2, 0.25))
#: three of gpupool's default classes, spread over the Jobs of the cohort case
PRIORITIES = ("training", "experiment", "evaluation")


@dataclass(frozen=True)
class Phase:
    """Jobs created together; the phase is done once ``admit`` of them are admitted and
    ``bind`` of their pods bound (what a correct scheduler can reach on this cluster)."""

    jobs: list[dict[str, Any]]
    admit: int
    bind: int


@dataclass(frozen=True)
class Case:
    name: str
    nodes: int
    jobs: int
    summary: str
    phases: Callable[[int, int, str], list[Phase]]
    #: (queue, guarantee share, borrowing limit as a share of its guarantee)
    teams: tuple[tuple[str, float, float], ...] = tuple((q, g, 0.5) for q, g, _ in TEAMS)
    kueue_config: dict[str, Any] = field(default_factory=dict)
    #: how long a phase is watched with nothing changing once its target is reached
    settle_s: float = 20.0
    differs: tuple[str, ...] = ()


def gpupool_manifests(
    nodes: int, teams: tuple[tuple[str, float, float], ...] | None = None
) -> list[dict[str, Any]]:
    """Pool ``bench`` and a cohort ``bench`` of team queues whose guarantees sum to the GPUs;
    each may borrow its share of its guarantee (half by default) from the others' unused quota."""
    teams = teams or tuple((q, g, 0.5) for q, g, _ in TEAMS)
    gpus = nodes * GPUS_PER_NODE
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
    for i, (name, share, borrow) in enumerate(teams):
        # the last takes what is left, so the guarantees sum to the GPUs exactly
        guarantee = left if i == len(teams) - 1 else int(gpus * share)
        left -= guarantee
        quota: dict[str, Any] = {"pool": "bench", "guarantee": {GPU: guarantee}}
        if int(guarantee * borrow):
            quota["borrowingLimit"] = {GPU: int(guarantee * borrow)}
        docs.append(
            {
                "apiVersion": API,
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": {"parent": "bench", "quotas": [quota]},
            }
        )
    return docs


def kueue_objects(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for Kueue from gpupool manifests: a ResourceFlavor per Pool
    (its node labels the Pool's selector), a ClusterQueue per leaf Queue (cohort: its parent;
    nominal quota: its guarantee; its borrowing limit; its preemption policy) and a LocalQueue
    of the same name."""
    kapi, base = "kueue.x-k8s.io/v1beta2", "/apis/kueue.x-k8s.io/v1beta2"
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
        cq_obj = {"apiVersion": kapi, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": cq}
        lq = {
            "apiVersion": kapi,
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": name},
        }
        out += [(f"{base}/clusterqueues", cq_obj), (f"{base}/namespaces/{NAMESPACE}/localqueues", lq)]
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
            borrow = (q.get("borrowingLimit") or {}).get(GPU, 0)
            out[d["metadata"]["name"]] = int(q["guarantee"][GPU]) + int(borrow)
    return out


def priority_classes() -> list[dict[str, Any]]:
    """Kubernetes PriorityClasses with the names and values of gpupool's default classes, so a
    pod's ``priorityClassName`` means the same to Kueue and to gpupool. ``preemptionPolicy:
    Never``: kube-scheduler is not to preempt pods itself; preemption is the admission's."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": c.name},
            "value": c.value,
            "preemptionPolicy": "Never",
            "description": c.description,
        }
        for c in default_priority_classes()
    ]


def job(name: str, queue: str, *, pods: int = 1, gpus: int = 1, priority: str = "") -> dict[str, Any]:
    """A Kueue-style Job (queue label, ``suspend: true``) of ``pods`` pods (parallelism =
    completions) of ``gpus`` GPUs each; the pods run far longer than the bench and go at once
    when deleted (a preemption's pods are not waited for)."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "bench", "resources": {"limits": {GPU: gpus}}}],
    }
    if priority:
        pod["priorityClassName"] = priority
    spec: dict[str, Any] = {
        "suspend": True,
        "template": {"metadata": {"annotations": {"fake.gpupool.io/run-seconds": "36000"}}, "spec": pod},
    }
    if pods > 1:
        spec |= {"parallelism": pods, "completions": pods}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": spec,
    }


def spread(count: int) -> list[str]:
    """``count`` queue names over the teams by their job shares, in team order."""
    out = []
    for i in range(count):
        frac, acc, queue = (i + 0.5) / count, 0.0, TEAMS[-1][0]
        for name, _, share in TEAMS:
            acc += share
            if frac < acc:
                queue = name
                break
        out.append(queue)
    return out


def jobs(count: int, scheduler: str, priorities: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """``count`` one-GPU Jobs spread over the teams by their job shares, each class of
    ``priorities`` in turn; ``scheduler``: the pods' schedulerName."""
    out = []
    for i, queue in enumerate(spread(count)):
        j = job(f"vs-{i:05d}", queue, priority=priorities[i % len(priorities)] if priorities else "")
        out.append(with_scheduler(j, scheduler))
    return out


def with_scheduler(j: dict[str, Any], scheduler: str) -> dict[str, Any]:
    j["spec"]["template"]["spec"]["schedulerName"] = scheduler
    return j


def fragmentation(pods: list[dict[str, Any]], nodes: list[str]) -> dict[str, int]:
    """The final placement's GPU fragmentation: nodes partly used, the GPUs free on them (a
    whole-node job cannot use those), and nodes empty or full; ``pods``: the bound, live pods."""
    used = dict.fromkeys(nodes, 0)
    for p in pods:
        node = p["spec"].get("nodeName")
        if node in used:
            for c in p["spec"].get("containers") or []:
                used[node] += int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0))
    partly = [u for u in used.values() if 0 < u < GPUS_PER_NODE]
    return {
        "partly_used_nodes": len(partly),
        "free_gpus_on_partly_used": sum(GPUS_PER_NODE - u for u in partly),
        "empty_nodes": sum(1 for u in used.values() if u == 0),
        "full_nodes": sum(1 for u in used.values() if u >= GPUS_PER_NODE),
    }


def _cohort(nodes: int, count: int, scheduler: str) -> list[Phase]:
    target = min(count, nodes * GPUS_PER_NODE)
    return [Phase(jobs(count, scheduler, PRIORITIES), target, target)]


#: the reclaim case's queues: team-a lends its whole guarantee, team-b and team-c may double theirs
RECLAIM_TEAMS = (("team-a", 0.5, 0.0), ("team-b", 0.25, 1.0), ("team-c", 0.25, 1.0))


def _reclaim(nodes: int, count: int, scheduler: str) -> list[Phase]:
    """Phase 1: team-b and team-c fill the cohort with ``evaluation`` Jobs, borrowing all of
    team-a's guarantee. Phase 2: team-a's own ``training`` Jobs (its guarantee) arrive and
    reclaim it, and a few ``training`` Jobs of team-c preempt its own lower-class ones."""
    gpus = nodes * GPUS_PER_NODE
    a, each, extra = gpus // 2, gpus // 4, max(1, nodes // 2)
    fill = [job(f"fill-b-{i:04d}", "team-b", priority="evaluation") for i in range(2 * each)]
    fill += [job(f"fill-c-{i:04d}", "team-c", priority="evaluation") for i in range(gpus - 2 * each)]
    own = [job(f"own-a-{i:04d}", "team-a", priority="training") for i in range(a)]
    own += [job(f"own-c-{i:04d}", "team-c", priority="training") for i in range(extra)]
    return [
        Phase([with_scheduler(j, scheduler) for j in fill], len(fill), len(fill)),
        Phase([with_scheduler(j, scheduler) for j in own], len(own), len(own)),
    ]


GANG_PODS, GANG_GPUS = 4, 3


def _gang(nodes: int, count: int, scheduler: str) -> list[Phase]:
    """``count`` Jobs of 4 pods x 3 GPUs that need all pods at once. A node holds two such pods
    (6 of its 8 GPUs), so the cluster runs ``nodes // 2`` of them, fewer than the quota admits."""
    queues = spread(count)
    js = [
        with_scheduler(
            job(f"gang-{i:04d}", q, pods=GANG_PODS, gpus=GANG_GPUS, priority="training"), scheduler
        )
        for i, q in enumerate(queues)
    ]
    fit = min(count, nodes * (GPUS_PER_NODE // GANG_GPUS) // GANG_PODS)
    return [Phase(js, fit, fit * GANG_PODS)]


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case(
            "cohort-borrowing",
            10,
            120,
            "3 queues in one cohort (50/30/20 % of the GPUs, each may borrow half its guarantee),"
            " one-GPU Jobs 25/50/25 % over them, classes training/experiment/evaluation in turn",
            _cohort,
            differs=(
                "Kueue admits each ClusterQueue's head while the cohort has unused quota and takes"
                " borrowed quota back by preemption; gpupool decides on the whole pending set each cycle",
            ),
        ),
        Case(
            "reclaim",
            4,
            0,
            "team-b and team-c borrow all of team-a's guarantee with evaluation Jobs, then team-a's"
            " training Jobs arrive (reclaimWithinCohort: Any) and team-c's own training Jobs"
            " (withinClusterQueue: LowerPriority); timed from the second phase's first create",
            _reclaim,
            teams=RECLAIM_TEAMS,
            differs=(
                "Kueue picks victims per ClusterQueue head in its scheduling cycle; gpupool plans the"
                " reclaim for the whole pending set and binds the reclaimer's pods in the same decision",
            ),
        ),
        Case(
            "gang",
            6,
            12,
            "Jobs of 4 pods x 3 GPUs (parallelism = completions = 4, all pods at once); a node holds"
            " two such pods, so the quota admits more gangs than fit. Kueue: waitForPodsReady"
            " (blockAdmission, timeout 30 s); gpupool: its gang admission",
            _gang,
            settle_s=45.0,  # past Kueue's 30 s waitForPodsReady timeout, so an eviction is seen
            kueue_config={
                "waitForPodsReady": {
                    "timeout": "30s",
                    "blockAdmission": True,
                    "requeuingStrategy": {
                        "timestamp": "Eviction",
                        "backoffBaseSeconds": 10,
                        "backoffMaxSeconds": 30,
                    },
                }
            },
            differs=(
                "Kueue admits a gang by quota alone and kube-scheduler places its pods one by one; with"
                " waitForPodsReady a gang whose pods cannot all start is evicted after the timeout and"
                " requeued. gpupool admits a gang only with a placement for all its pods and binds them together",
            ),
        ),
    )
}
