"""Issue 12, "Tests", first bullet: the YAML scenario suite (tests/scenarios) run through the
Kubernetes backend over HTTP against the fake API server, and against the real control plane
(``kube_api``, issue 24), gives the same decisions as through the virtual backend.

Each scenario is built twice from its manifests (tests/scenarios/_base.yaml merged as the
scenario runner merges it): (a) the controller with the virtual backend, the nodes from the
Cluster manifest; (b) the controller with the Kubernetes backend on a fresh fake server, or on
the session's real one in a namespace of the test's own, whose nodes are built from the same
Cluster manifest (``nodes_from_cluster``: the fake's kubelet runs them, on the real server a node
agent registers and runs them under the manifest's names), the workloads created as Kueue-style
``batch/v1`` Jobs and submitted by ``gpupool.kube.adapters.source``.
Both get the same workloads in the same order and one controller cycle per scenario cycle, at
the scenario's times (a clock the test sets), so every difference is the backend's. A cycle's
``finish`` (work that ends between cycles) ends the run on both sides before the cycle: (a)
marks it Succeeded; (b) has the kubelet (the fake's, or the node agent's ``complete``) end the
Job's pods (Succeeded, exit 0), the server's Job controller mark the Job Complete, and waits until the backend reports the run finished. Per cycle
the admitted set (with each pod's node, devices, share and borrowing), the preempted set (by
whom, which rule), the shrunk elastic gangs (pods removed, count kept), the consolidation moves
(for whom, the reason, the reserved placement) and the pending reasons' codes must be equal (a
shrunk Job runs with its parallelism lowered; a moved Job's replacement pods are re-bound where
the move reserved); on (b) the pods bound over HTTP must carry the decided nodes and devices,
and the kubelets' HAMi checks must record no violation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool import quantity as qty
from gpupool.engine import Decisions
from gpupool.kube import workloads
from gpupool.kube.adapters.backend import KubernetesBackend
from gpupool.kube.adapters.source import SYSTEM_NAME, KubeSource, Outcome
from gpupool.kube.annotations import GPU_INDICES, GPU_MEMORY_MIB, GPU_MILLI, NODE, POD_INDEX, PODSET, WORKLOAD
from gpupool.kube.fake.kubelet import kubelet_of
from gpupool.kube.fake.nodes import nodes_from_cluster
from gpupool.kube.inventory import InventoryOptions, node_inventory
from gpupool.kube.translate.partial import MIN_PARALLELISM
from gpupool.manifests import API_VERSION, Bundle, build, default_priority_classes, parse_documents
from gpupool.manifests.convert import workload_model
from gpupool.model import EngineConfig, Node, Queue, Running, Snapshot
from gpupool.service.backends import Backend, RunState
from gpupool.service.backends.virtual import VirtualBackend
from gpupool.service.config import EXAMPLES
from gpupool.service.controller import Controller
from gpupool.store import OBJECT_KINDS, Store
from tests.kube.cluster import Cluster
from tests.kube.conftest import KubeTarget
from tests.kube.test_backend import bare_pod

HERE = Path(__file__).resolve().parents[1] / "scenarios"
SCENARIOS = sorted(p for p in HERE.glob("*.yaml") if not p.name.startswith("_"))
NS = "default"  # a Job's namespace unless told


def prefix(ns: str) -> str:
    """The source names a Job's workload ``<namespace>.job.<name>``: this is its beginning."""
    return f"{ns}.job."


#: the spec fields a Job's labels, annotations and template carry (workloads.py), and the
#: resources its containers can ask for; anything else cannot be written as a Job
SPEC_FIELDS = {
    "queue",
    "priorityClass",
    "type",
    "duration",
    "pool",
    "topology",
    "nodeSelector",
    "podGroups",
    "gang",
}
RESOURCES = {"nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem", "cpu", "memory"}


# ------------------------------------------------------------------------------- the scenario
@dataclass
class Scenario:
    """A scenario's configuration manifests, its workload manifests (by name, in the order of
    the scenario file) and its cycles."""

    name: str
    config: list[dict[str, Any]]
    cluster: list[dict[str, Any]]
    workloads: dict[str, dict[str, Any]]
    cycles: list[dict[str, Any]]
    engine: EngineConfig = field(default_factory=EngineConfig)


def load(path: Path) -> Scenario:
    """The scenario as tests/scenario_runner.py reads it (base merged, generated workloads)."""
    scn = yaml.safe_load(path.read_text())
    base = parse_documents((HERE / "_base.yaml").read_text(), "_base.yaml")
    docs = parse_documents(scn.get("manifests", ""), path.name)
    overridden = {(d.kind, d.name) for d in docs if d.kind != "Cluster"}
    merged = [d for d in base if (d.kind, d.name) not in overridden] + docs
    config = [{k: v for k, v in d.raw.items() if k != "status"} for d in merged if d.kind in OBJECT_KINDS]
    wls = {d.name: d.raw for d in merged if d.kind == "Workload"}
    for g in scn.get("generate", []):
        for i in range(g["count"]):
            name = f"{g['prefix']}{i:03d}"
            spec = {"queue": g["queue"], "priorityClass": g["priorityClass"]}
            spec["podGroups"] = [{"resources": {"nvidia.com/gpu": g["gpus"]}}]
            wls[name] = {
                "apiVersion": API_VERSION,
                "kind": "Workload",
                "metadata": {"name": name},
                "spec": spec,
            }
    cluster = [m for m in config if m["kind"] == "Cluster"]
    return Scenario(path.stem, config, cluster, wls, scn["cycles"], EngineConfig(**scn.get("config", {})))


def submitted_in(scn: Scenario, cycle: Mapping[str, Any]) -> list[str]:
    sub = cycle.get("submit", [])
    return list(scn.workloads) if sub == "all" else list(sub)


def finished_in(cycle: Mapping[str, Any]) -> list[str]:
    """The workloads that end before the cycle (the scenario runner's ``finish``)."""
    return list(cycle.get("finish") or [])


# ------------------------------------------------------------------- a workload as a Job
def _gpu_limits(res: Mapping[str, Any]) -> dict[str, str]:
    """A pod group's GPU request as HAMi's container limits (a share is ``nvidia.com/gpu: 1``
    with ``gpucores`` in percent and ``gpumem`` in MiB: Kubernetes counts extended resources
    in whole units only)."""
    out: dict[str, str] = {}
    milli = qty.gpu_milli(res["nvidia.com/gpu"]) if "nvidia.com/gpu" in res else 0
    if milli and milli % 1000 == 0 and "nvidia.com/gpumem" not in res and "nvidia.com/gpucores" not in res:
        return {"nvidia.com/gpu": str(milli // 1000)}
    if 0 < milli < 1000:
        out["nvidia.com/gpucores"] = str(milli // 10)
    if "nvidia.com/gpucores" in res:
        out["nvidia.com/gpucores"] = str(res["nvidia.com/gpucores"])
    if "nvidia.com/gpumem" in res:
        out["nvidia.com/gpumem"] = str(qty.memory_mib(res["nvidia.com/gpumem"]))
    if out or milli:
        out["nvidia.com/gpu"] = "1"
    return out


def as_job(manifest: Mapping[str, Any], ns: str = NS) -> dict[str, Any] | str:
    """The workload as a Kueue-style Job (queue label, ``suspend: true``, Indexed, a
    ``gang.minMember`` as Kueue's ``job-min-parallelism``), or why a Job cannot say it."""
    spec, md = manifest["spec"], manifest.get("metadata") or {}
    extra = set(spec) - SPEC_FIELDS
    if extra:
        return f"spec fields {sorted(extra)} have no Job form"
    if len(spec["podGroups"]) != 1:
        return "several pod groups: a Job has one pod template"
    group = spec["podGroups"][0]
    res = group.get("resources") or {}
    if set(res) - RESOURCES or set(group) - {"resources", "replicas"}:
        return f"pod group {group} has no container form"
    pods = int(group.get("replicas", 1))
    labels = {"kueue.x-k8s.io/queue-name": spec["queue"]}
    if "priorityClass" in spec:
        labels[workloads.PRIORITY_CLASS] = spec["priorityClass"]
    ann = {workloads.TYPE: spec.get("type", "batch")}
    for key, fld in ((workloads.DURATION, "duration"), (workloads.POOL, "pool")):
        if fld in spec:
            ann[key] = str(spec[fld])
    if "gang" in spec:  # Kueue's partial admission: the Job may run with that many pods
        ann[MIN_PARALLELISM] = str(spec["gang"]["minMember"])
    if "topology" in spec:
        ann[workloads.TOPOLOGY] = spec["topology"]["scope"]
        ann[workloads.TOPOLOGY_MODE] = spec["topology"].get("mode", "Required")
    resources: dict[str, Any] = {"limits": _gpu_limits(res)}
    requests = {k: str(res[k]) for k in ("cpu", "memory") if k in res}
    if requests:
        resources["requests"] = requests
    container = {"name": "c", "image": "x", "resources": resources}
    pod_spec: dict[str, Any] = {
        "schedulerName": "gpupool",
        "restartPolicy": "Never",
        "containers": [container],
    }
    if spec.get("nodeSelector"):
        pod_spec["nodeSelector"] = dict(spec["nodeSelector"])
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": md["name"], "namespace": ns, "labels": labels, "annotations": ann},
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            # a pod disrupted by a preemption or a move is not a failure of the Job (as a movable
            # Job must say, as in KAI: the Job controller counts any other deleted pod)
            "podFailurePolicy": {
                "rules": [
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
                ]
            },
            # no run-seconds annotation: the fake kubelet runs the pods until they are deleted
            "template": {"metadata": {"annotations": dict(md.get("annotations") or {})}, "spec": pod_spec},
        },
    }


def unexpressible(scn: Scenario) -> str:
    """Why some workload of the scenario has no exact Job form ('' when all have one): the
    source's translation of the Job must give the engine the same workload as the manifest."""
    classes = list(default_priority_classes())
    for name, m in scn.workloads.items():
        job = as_job(m)
        if isinstance(job, str):
            return f"{name}: {job}"
        kw = workloads.workload_from_object(job)
        assert kw is not None, name
        want = workload_model(m, classes, 0.0)
        got = replace(workload_model(kw.manifest, classes, 0.0), name=want.name)
        if got != want:
            return f"{name}: the Job translates to {got}, not {want}"
    return ""


# --------------------------------------------------------------------- the two controllers
class Recording(Controller):
    """The controller, recording each cycle's decisions; its engine runs with the scenario's
    engine configuration (the same on both sides). Both are wrapped around its parts: the
    commit sees every cycle's decisions, the configuration makes every engine's snapshot."""

    engine_config = EngineConfig()
    decided: list[Decisions]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        commit, snapshot = self.commit.commit, self.config.snapshot

        def recording(d: Decisions, models: Any, now: float, stats: Any) -> None:
            self.decided.append(d)
            commit(d, models, now, stats)

        def configured(
            bundle: Any, running: Sequence[Running], queues: Sequence[Queue] | None = None
        ) -> Snapshot:
            return replace(snapshot(bundle, running, queues), config=self.engine_config)

        self.commit.commit = recording  # type: ignore[method-assign]
        self.config.snapshot = configured  # type: ignore[method-assign]


class Submitter:
    """Where both sides submit: the store, then the controller (as the API's submit does); the
    Kubernetes source calls ``submit_many`` with the manifests it translated."""

    def __init__(self, store: Store, ctl: Controller, scenario: Scenario) -> None:
        self.store, self.ctl, self.scenario = store, ctl, scenario
        self.names: list[str] = []

    def submit_many(self, manifests: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        out = []
        for m in manifests:
            rec, _ = self.store.submit_workload(dict(m), owner=SYSTEM_NAME)
            self.ctl.submitted(rec, workload_model(m, self.ctl.bundle.priority_classes, 0.0))
            self.names.append(rec.name)
            out.append(Outcome(rec.name, "created"))
        return out

    def cancel(self, name: str) -> bool:
        return False

    def active(self) -> set[str]:
        return set(self.names)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.seen.append((reason, message))


class Clock:
    """The scenario's time (``at``, seconds from the start), for both controllers alike."""

    def __init__(self) -> None:
        self.base = time.time()
        self.at = 0.0

    def __call__(self) -> float:
        return self.base + self.at


class FinishingBackend(VirtualBackend):
    """The virtual backend whose runs a scenario ends on demand: its workloads declare no
    duration, so nothing else would end them."""

    def finish(self, names: Sequence[str]) -> None:
        with self._lock:
            for n in names:
                assert n in self._runs and not self._runs[n]["finished"], f"finish {n}: not running"
                self._runs[n].update(finished=True, outcome="Succeeded", message="finished by the scenario")


@dataclass
class Side:
    store: Store
    ctl: Recording
    sub: Submitter


def side(tmp: Path, label: str, scn: Scenario, backend: Backend, clock: Clock) -> Side:
    """A store holding the scenario's configuration and a recording controller over it."""
    store = Store.open(f"sqlite:///{tmp}/{label}.db")
    for m in scn.config:
        store.apply_object(m)
    ctl = Recording(store, backend, tick_s=0.05, min_interval_s=0.0, clock=clock)
    ctl.engine_config = scn.engine
    ctl.decided = []
    return Side(store, ctl, Submitter(store, ctl, scn))


# -------------------------------------------------------------------------- what is compared
def decisions(d: Sequence[Decisions], ctl: Controller, strip: str = "") -> dict[str, Any]:
    """One cycle's decisions in a backend-free form (workload names without ``strip``)."""

    def n(name: str) -> str:
        return name.removeprefix(strip)

    admitted = {
        n(a.workload): (
            sorted((p.group, p.index, p.node, p.devices, p.gpu_milli, p.gpu_memory_mib) for p in a.pods),
            a.borrowing,
            sorted(n(v) for v in a.after_evicting),
        )
        for x in d
        for a in x.admitted
    }
    preempted = {
        n(v.workload): (n(p.preemptor), str(v.rule)) for x in d for p in x.preempted for v in p.victims
    }
    shrunk = {
        n(s.workload): (n(p.preemptor), str(s.rule), s.replicas, sorted((q.group, q.index) for q in s.pods))
        for x in d
        for p in x.preempted
        for s in p.shrinks
    }
    moved = {
        n(m.workload): (
            n(m.for_workload),
            m.reason.replace(strip, "") if strip else m.reason,
            sorted((p.group, p.index, p.node, p.devices) for p in m.pods),
        )
        for x in d
        for m in x.moved
    }
    pending = {n(q): str(r.code) if (r := ctl.reasons.get(q)) else "none" for q in ctl.pending}
    return {
        "admitted": admitted,
        "preempted": preempted,
        "shrunk": shrunk,
        "moved": moved,
        "pending": pending,
    }


def node_shape(nodes: Sequence[Node]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            n.name,
            n.gpu_model,
            n.gpu_count,
            n.gpu_memory_mib,
            n.cpu_milli,
            n.memory_mib,
            n.rack,
            n.nvlink_domain,
        )
        for n in nodes
    )


def wait_for(fn: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll ``fn`` to a deadline (60 s: the real Job controller makes a moved pod's replacement
    after its pod backoff, about 10 s, on a loaded machine more)."""
    end = time.monotonic() + timeout
    while not (v := fn()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return v


def bound_pods(c: Cluster, job: str) -> list[tuple[str, int, str, tuple[int, ...], int]]:
    """The pods of a Job bound over HTTP, as (pod set, index, node, devices, GPU milli)."""
    out = []
    for p in c.list("pods", c.ns, label_selector=f"job-name={job}"):
        node, ann = p["spec"].get("nodeName"), p["metadata"].get("annotations") or {}
        if node and not p["metadata"].get("deletionTimestamp"):
            devs = tuple(int(i) for i in ann.get(GPU_INDICES, "").split(",") if i)
            out.append(
                (ann.get(PODSET, ""), int(ann.get(POD_INDEX, -1)), node, devs, int(ann.get(GPU_MILLI, 0)))
            )
    return sorted(out)


# ------------------------------------------------------------------------------- the two runs
def cycle_once(s: Side, clock: Clock, n: int, cycle: Mapping[str, Any]) -> list[Decisions]:
    """One controller cycle at the scenario's time for cycle ``n``: its decisions."""
    clock.at = float(cycle.get("at", n))
    before = len(s.ctl.decided)
    s.ctl.cycle()
    return s.ctl.decided[before:]


def check_finished(s: Side, names: Sequence[str], strip: str = "") -> None:
    """The controller recorded each finished workload's end (it left the running set)."""
    for x in names:
        rec = s.store.get_workload(strip + x)
        assert rec.phase == "Succeeded", f"{x}: {rec.phase} after it finished"
        assert strip + x not in s.ctl.engine.running, x


def run_virtual(scn: Scenario, tmp: Path) -> tuple[list[dict[str, Any]], list[Node]]:
    clock = Clock()
    be = FinishingBackend(None, clock=clock)
    s = side(tmp, "virtual", scn, be, clock)
    try:
        s.ctl.recover()
        history = []
        for n, cycle in enumerate(scn.cycles):
            be.finish(finished_in(cycle))
            s.sub.submit_many([scn.workloads[x] for x in submitted_in(scn, cycle)])
            history.append(decisions(cycle_once(s, clock, n, cycle), s.ctl))
            check_finished(s, finished_in(cycle))
        return history, s.ctl.nodes()
    finally:
        s.store.close()


def submit_jobs(c: Cluster, be: KubernetesBackend, src: KubeSource, s: Side, names: list[str]) -> None:
    """Create the Jobs in order, let the source submit them (one batch, in creation order) and
    wait until the backend's cache knows each one."""
    pre = prefix(c.ns)
    start = len(s.sub.names)
    for x in names:
        job = as_job(s.sub.scenario.workloads[x], c.ns)
        assert not isinstance(job, str), job  # unexpressible() said it has a Job form
        c.create(job)
    jobs = be.informers.by_kind["jobs"]
    wait_for(lambda: all(jobs.get(c.ns, x) for x in names), "the Jobs in the cache")

    def submitted() -> bool:
        # an informer tells its listeners (the source's dirty keys) just after its cache has
        # the object: the source may not know of the last Job yet when the cache does (seen
        # once on the real server: the previous cycle's Job was the last one submitted)
        while src.process():
            pass
        return len(s.sub.names) - start >= len(names)

    wait_for(submitted, "the source's submissions")
    assert s.sub.names[start:] == [pre + x for x in names]
    wait_for(lambda: all(be.tracker.top_by_name(pre + x) for x in names), "the backend's view")


def complete(c: Cluster, pod: str) -> bool:
    """End a running pod now, exit 0: the fake's kubelet, or the node agent running it."""
    if c.fake is not None:
        return kubelet_of(c.fake).complete(c.ns, pod)
    return any(agent.complete(c.ns, pod) for agent in c.target._agents)


def finish_jobs(c: Cluster, be: KubernetesBackend, clock: Clock, names: Sequence[str]) -> None:
    """End the Jobs' pods as their containers exiting 0 would (the kubelet), and wait until the
    Job controller marks each Job Complete and the backend reports the run Succeeded, so the
    next cycle starts with the work ended, as the scenario runner's ``finish`` does."""
    runs, pre = be.runs(), prefix(c.ns)
    for x in names:
        want = len(runs[pre + x].placement.get("pods") or ())
        assert want, f"finish {x}: the backend placed no pod of it"
        running = wait_for(partial(running_pods, c, x, want), f"{x}'s {want} pods running, to end them")
        assert all(complete(c, p) for p in running), f"{x}: a pod stopped running"
    for x in names:
        wait_for(partial(job_complete, c, x), f"the Job {x} Complete")

    def seen() -> bool:
        done = {r.name: r for r in be.poll(clock())}
        return all(succeeded(done.get(pre + x)) for x in names)

    wait_for(seen, f"the backend to see {names} finished")


def running_pods(c: Cluster, job: str, want: int) -> list[str]:
    """The Job's ``want`` pods, all Running (empty until they are: the placement's pods)."""
    pods = [
        p
        for p in c.list("pods", c.ns, label_selector=f"job-name={job}")
        if not p["metadata"].get("deletionTimestamp")
    ]
    if len(pods) != want or any(p["status"].get("phase") != "Running" for p in pods):
        return []
    return [p["metadata"]["name"] for p in pods]


def job_complete(c: Cluster, name: str) -> bool:
    """The server's Job controller counted the Job's pods and marked it Complete."""
    conds = (c.get("jobs.batch", c.ns, name).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conds)


def succeeded(run: RunState | None) -> bool:
    return run is not None and run.finished and run.outcome == "Succeeded"


def pods_are(c: Cluster, job: str, want: list[Any]) -> Callable[[], bool]:
    return lambda: bound_pods(c, job) == want


def check_bound(c: Cluster, d: Sequence[Decisions], s: Side) -> None:
    """Every pod admitted this cycle is bound over HTTP on its node and devices; preempted and
    pending work has no pod bound; the kubelets' HAMi checks saw nothing wrong."""
    pre = prefix(c.ns)
    for a in (a for x in d for a in x.admitted):
        want = sorted((p.group, p.index, p.node, p.devices, p.gpu_milli) for p in a.pods)
        job = a.workload.removeprefix(pre)
        wait_for(pods_are(c, job, want), f"{job}'s pods bound as decided ({want})")
    for sh in (sh for x in d for p in x.preempted for sh in p.shrinks):  # elastic gangs shrunk
        r = s.ctl.engine.running[sh.workload]
        want = sorted((p.group, p.index, p.node, p.devices, p.gpu_milli) for p in r.admission.pods)
        job = sh.workload.removeprefix(pre)
        wait_for(pods_are(c, job, want), f"{job}'s pods after its shrink ({want})")
        assert c.get("jobs.batch", c.ns, job)["spec"]["parallelism"] == sh.replicas
    for m in (m for x in d for m in x.moved):  # consolidation: re-bound where reserved
        want = sorted((p.group, p.index, p.node, p.devices, p.gpu_milli) for p in m.pods)
        job = m.workload.removeprefix(pre)
        wait_for(pods_are(c, job, want), f"{job}'s pods re-bound after its move ({want})")
    for q in s.ctl.pending:
        job = q.removeprefix(pre)
        wait_for(pods_are(c, job, []), f"{job} (pending) without a bound pod")
    assert c.violations() == []


def run_kube(scn: Scenario, k: KubeTarget, tmp: Path, nodes: Sequence[Node]) -> list[dict[str, Any]]:
    cluster = Cluster(k, k.add_node_objects(nodes_from_cluster(scn.cluster)))
    pre = prefix(cluster.ns)
    # the Cluster manifest's racks are the nodes' gpupool.io/rack labels (the fake's zone label
    # keeps its own naming)
    be = cluster.fresh(inventory_options=InventoryOptions(rack_label="gpupool.io/rack"))
    clock = Clock()
    s = side(tmp, "kube", scn, be, clock)
    be.on_nodes_changed = s.ctl.nodes_changed
    events = Events()
    src = KubeSource(be.informers.by_kind, s.sub, events, settle_s=0.0)
    src.attach()
    try:
        s.ctl.recover()
        assert node_shape(s.ctl.nodes()) == node_shape(nodes)
        want_labels = {n.name: set(n.labels) for n in nodes}
        for node in s.ctl.nodes():  # what pools and workloads select on, as the manifest labels it
            assert want_labels[node.name] <= set(node.labels), node.name
        history = []
        for n, cycle in enumerate(scn.cycles):
            finish_jobs(cluster, be, clock, finished_in(cycle))
            submit_jobs(cluster, be, src, s, submitted_in(scn, cycle))
            d = cycle_once(s, clock, n, cycle)
            history.append(decisions(d, s.ctl, pre))
            check_finished(s, finished_in(cycle), pre)
            check_bound(cluster, d, s)
        assert events.seen == []  # the source refused nothing and found nothing unreadable
        return history
    finally:
        cluster.close()
        s.store.close()


def check_scenario(scn: Scenario, history: Sequence[Mapping[str, Any]]) -> None:
    """The virtual side's decisions are the ones the scenario file expects (what it says of the
    admitted, preempted and pending sets), so the parity is with the suite, not with anything."""
    for n, (cycle, got) in enumerate(zip(scn.cycles, history, strict=True)):
        exp = cycle.get("expect", {})
        if "admitted" in exp:
            assert set(got["admitted"]) == set(exp["admitted"]), f"{scn.name} cycle {n}: {got}"
        want_pre = {k: (v["by"], v["rule"]) for k, v in (exp.get("preempted") or {}).items()}
        assert got["preempted"] == want_pre, f"{scn.name} cycle {n}: {got}"
        want_sh = {k: (v["by"], v["rule"], v["replicas"]) for k, v in (exp.get("shrunk") or {}).items()}
        assert {k: v[:3] for k, v in got["shrunk"].items()} == want_sh, f"{scn.name} cycle {n}: {got}"
        if "moved" in exp:  # consolidation: who moved, for whom, and the reason's words
            assert {k: v[0] for k, v in got["moved"].items()} == {
                k: v["for"] for k, v in exp["moved"].items()
            }, f"{scn.name} cycle {n}: {got}"
            for k, v in exp["moved"].items():
                assert v.get("reason", "") in got["moved"][k][1], f"{scn.name} cycle {n}: {k}"
        for name, props in (exp.get("pending") or {}).items():
            assert name in got["pending"], f"{scn.name} cycle {n}: {name} not pending"
            if props and "code" in props:
                assert got["pending"][name] == props["code"], f"{scn.name} cycle {n}: {name}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_the_kubernetes_backend_decides_as_the_virtual_one(
    path: Path, kube_api: KubeTarget, tmp_path: Path
) -> None:
    scn = load(path)
    why = unexpressible(scn)
    if why:
        pytest.skip(f"{scn.name}: a Kubernetes object cannot express {why}")
    virtual, nodes = run_virtual(scn, tmp_path)
    check_scenario(scn, virtual)
    kube = run_kube(scn, kube_api, tmp_path, nodes)
    assert any(c["admitted"] for c in virtual), "a scenario that admits nothing proves nothing"
    for n, (a, b) in enumerate(zip(virtual, kube, strict=True)):
        assert b == a, f"{scn.name} cycle {n}: kubernetes {b} != virtual {a}"


# ------------------------------------------------------------------ the fixes the suite needed
def test_the_fake_builds_the_nodes_its_cluster_manifest_describes() -> None:
    """kube/fake/nodes.py: the example cluster (three node groups, racks, NVLink domains) read
    through the inventory is the manifest's own nodes: names, model, GPUs, racks, domains,
    labels (without this the pools' selectors and ``gpupool.io/rack`` selected other nodes)."""
    text = (EXAMPLES / "cluster" / "cluster.yaml").read_text()
    want = build(parse_documents(text, "cluster.yaml"), Bundle()).nodes
    objs = nodes_from_cluster(list(yaml.safe_load_all(text)))
    got = [node_inventory(o, (), InventoryOptions(rack_label="gpupool.io/rack")).node for o in objs]
    assert node_shape(got) == node_shape(want)
    assert len({n.rack for n in want}) > 1 and len({n.nvlink_domain for n in want}) > 3
    labels = {n.name: set(n.labels) for n in got}
    assert all(set(n.labels) <= labels[n.name] for n in want)


def test_a_bind_the_watch_confirmed_first_is_counted_once(kube_api: KubeTarget) -> None:
    """kube/runtime/tracker.py: when the watch shows a pod bound before the binder records its
    assumption, the late assumption is dropped; before the fix it stayed, so a half-GPU pod
    counted twice and the next pod sharing its device never bound (fractional.yaml above). On
    both servers: the pod bound through ``pods/binding`` with the annotations, as the binder
    binds, on a node without HAMi."""
    node = kube_api.add_gpu_nodes(1, gpus=8)[0]
    cluster = Cluster(kube_api, [node])
    ns = cluster.ns
    be = cluster.fresh()
    try:
        cluster.create(bare_pod("shared", run_s=100_000))
        ann = {WORKLOAD: f"{ns}.pod.shared", PODSET: "main", POD_INDEX: "0", NODE: node}
        ann |= {GPU_INDICES: "0", GPU_MILLI: "500", GPU_MEMORY_MIB: "40960"}
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "shared", "annotations": ann},
            "target": {"kind": "Node", "name": node},
        }
        r = kube_api.http.post(kube_api.path("pods", "shared/binding"), json=binding)
        assert r.status_code == 201, r.text
        wait_for(lambda: be.tracker.device_use(node) == {0: 500}, "the bound pod in the tracker")
        pod = be.informers.pods.get(ns, "shared")
        assert pod is not None
        be.tracker.assume(pod, node, (0,), 500)  # the binder's record, after the watch event
        assert be.tracker.device_use(node) == {0: 500}
    finally:
        # no kubelet on the node: the pod is removed now, before the next test's backend sees it
        cluster.delete("pods", ns, "shared", grace_period_seconds=0)
        cluster.close()
