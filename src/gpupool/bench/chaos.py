"""``gpupool bench kube --chaos DURATION``: faults while work flows, and the counts that must be 0.

What it does: the fake API server runs in this process with a few HAMi nodes, ``gpupool serve
--backend kubernetes`` in a subprocess against it (as ``gpupool bench kube`` does). For
DURATION seconds, Kueue-style Jobs (whole and shared GPUs, gangs of up to four pods, three
priority classes, so that preemption happens) are created at a steady rate, and faults are
injected on a seeded schedule: a node flapped NotReady then Ready, a node deleted, the server
killed with SIGKILL and started again, the server frozen with SIGSTOP for a few seconds, API
errors and conflicts, watches dropped.

What it counts, from what the cluster shows (never from gpupool's own view):

* ``double_booked``: distinct devices ever seen held by more pods than they can take, read
  from every pod's device annotations every sampling tick (``gpupool.kube.exclusive``);
* ``fake_violations``: what the fake kubelet's device ledger refused (HAMi's own check);
* ``lost``: Jobs created and still present that gpupool, once it has settled, neither runs,
  queues nor finished (no pod bound, not suspended waiting in a queue, no final condition);
* ``late_binds``: pods first seen bound more than the backend's bind deadline after their
  admission (the decision written on the pod);
* ``unexplained_restarts``: Jobs whose pods ran more times than gpupool decided to start
  them, by its audit log (an admission for each run), so a restart without a decision shows.

All must be 0.

The same run against another cluster (issue 24): ``run_chaos(target=...)`` takes a
``ChaosTarget``, e.g. a real control plane with node agents as kubelets (tests/kube/test_chaos.py),
and ``faults=`` the faults it can take: API errors and dropped watches are the fake's own fault
injection, so a real kube-apiserver gets the node flaps and deletions and the leader's kill -9
and SIGSTOP only. ``fake_violations`` is then what that cluster's kubelets' ledgers refused.
"""

from __future__ import annotations

import inspect
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpupool.bench.serving import LABELS, compile_bytecode, config_dir, kill, serve, wait_ready
from gpupool.kube.adapters.backend import KubernetesBackend

CLASSES = ("experiment", "training", "inference-critical")
#: the backend's bind deadline (a gang not bound by then is given up and requeued)
BIND_DEADLINE_S = float(inspect.signature(KubernetesBackend).parameters["bind_deadline_s"].default)
SAMPLE_S = 0.2  # how often the cluster is read
#: every fault of the schedule; a target takes the ones it can
FAULTS = frozenset({"flap", "kill9", "freeze", "api", "delete_node"})


class ChaosTarget(Protocol):
    """The cluster a chaos run drives: its kubeconfig, a namespace for its Jobs, its GPU nodes
    (labelled ``LABELS``, with a kubelet), objects by the fake's resource keys, and its faults."""

    kubeconfig: Path
    ns: str
    nodes: list[str]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def get(self, key: str, ns: str, name: str) -> dict[str, Any]: ...

    def set_node_ready(self, name: str, ready: bool) -> None: ...

    def delete_node(self, name: str) -> None: ...

    def violations(self) -> list[str]: ...

    def api_faults(self, seed: int | None) -> str:
        """Start failing the gpupool server's requests and dropping its watches (seeded), or stop
        (``None``); returns what the fault is called (the ``api`` fault only)."""
        ...

    def list(self, key: str, ns: str = "", label_selector: str = "", field_selector: str = "") -> Any: ...


class FakeTarget:
    """gpupool's fake API server in this process, with ``nodes`` HAMi nodes (``default``)."""

    ns = "default"

    def __init__(self, work: Path, nodes: int) -> None:
        from gpupool.kube.fake import FakeApiServer

        self.srv = FakeApiServer(history_size=50_000, bookmark_interval_s=1.0)
        self.nodes = self.srv.add_gpu_nodes(nodes, gpus=8, hami=True, labels=LABELS)
        self.srv.start(port=0)
        self.kubeconfig = self.srv.write_kubeconfig(work / "kubeconfig")
        self.create, self.get, self.list = self.srv.create, self.srv.get, self.srv.list
        self.set_node_ready = self.srv.set_node_ready

    def delete_node(self, name: str) -> None:
        self.srv.delete("nodes", "", name)

    def violations(self) -> list[str]:
        return list(self.srv.stats.violations)

    def api_faults(self, seed: int | None) -> str:
        from gpupool.kube.fake.faults import FaultConfig

        self.srv.faults = (
            FaultConfig()
            if seed is None
            else FaultConfig(conflict_rate=0.05, error_rate=0.05, drop_watches_after_s=2.0, seed=seed)
        )
        return "API errors and dropped watches"

    def close(self) -> None:
        self.srv.stop()


@dataclass
class Tally:
    """What the sampling saw."""

    double_booked: set[str] = field(default_factory=set)
    #: Job -> completion index -> the uids of the pods seen Running in that slot
    running_uids: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    samples: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    #: pods first seen bound later than the bind deadline after their admission (decision)
    late_binds: set[str] = field(default_factory=set)
    _seen_bound: set[str] = field(default_factory=set)
    ns: str = "default"  # the namespace of the Jobs

    def sample(self, srv: Any) -> None:
        from gpupool.kube.exclusive import overbooked

        pods = srv.list("pods", self.ns)
        self.samples += 1
        for o in overbooked(pods):
            self.double_booked.add(o.message())
        now = time.time()
        for p in pods:
            self._bound_on_time(p, now)
            owner = (p["metadata"].get("labels") or {}).get("job-name")
            if owner and (p.get("status") or {}).get("phase") == "Running":
                index = (p["metadata"].get("annotations") or {}).get(
                    "batch.kubernetes.io/job-completion-index", ""
                )
                self.running_uids.setdefault(owner, {}).setdefault(index, set()).add(p["metadata"]["uid"])

    def _bound_on_time(self, p: dict[str, Any], now: float) -> None:
        uid = p["metadata"]["uid"]
        if not p["spec"].get("nodeName") or uid in self._seen_bound:
            return
        self._seen_bound.add(uid)
        decision = (p["metadata"].get("annotations") or {}).get("gpupool.io/decision", "")
        try:
            admitted = float(decision)
        except ValueError:
            return
        if admitted and now - admitted > BIND_DEADLINE_S + SAMPLE_S:
            self.late_binds.add(f"{p['metadata']['name']} bound {now - admitted:.0f} s after its admission")

    def fault(self, what: str) -> None:
        self.faults[what] = self.faults.get(what, 0) + 1


def chaos_job(i: int, rng: random.Random, ns: str = "default") -> dict[str, Any]:
    """A Kueue-style Job: 1-4 pods of a whole GPU, two, or half of one; a random class."""
    pods = rng.choice((1, 1, 2, 4))
    share = rng.choice(("1", "1", "2", "500m"))
    run_s = rng.uniform(3.0, 20.0)
    limits = (
        {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50}
        if share == "500m"
        else {"nvidia.com/gpu": int(share)}
    )
    labels = {"kueue.x-k8s.io/queue-name": "bench", "gpupool.io/priority-class": rng.choice(CLASSES)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"chaos-{i:05d}", "namespace": ns, "labels": labels},
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"fake.gpupool.io/run-seconds": f"{run_s:.2f}"}},
                "spec": {
                    "schedulerName": "gpupool",
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
                },
            },
        },
    }


class Chaos:
    """The gpupool server, the cluster (``target``: the fake unless given) and the faults."""

    def __init__(
        self,
        work: Path,
        nodes: int,
        seed: int,
        target: ChaosTarget | None = None,
        faults: frozenset[str] = FAULTS,
    ) -> None:
        self.work, self.rng = work, random.Random(seed)
        self.own = target is None
        self.srv: Any = FakeTarget(work, nodes) if target is None else target
        self.tally = Tally(ns=self.srv.ns)
        self.faults = faults
        self.nodes = list(self.srv.nodes)
        self.kc = self.srv.kubeconfig
        self.cfg, self.log, self.state = (
            config_dir(work, nodes, cluster=False),
            work / "serve.log",
            work / "state",
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.created: list[str] = []

    def start_server(self) -> None:
        self.proc, port = serve(self.kc, self.state, self.cfg, self.log, lease_namespace=self.srv.ns)
        wait_ready(self.proc, port, self.log)

    def step(self, i: int) -> None:
        """One tick: a Job now and then, and sometimes a fault."""
        if self.rng.random() < 0.6:
            self.srv.create(chaos_job(len(self.created), self.rng, self.srv.ns))
            self.created.append(f"chaos-{len(self.created):05d}")
        r, on = self.rng.random(), self.faults
        if r < 0.06 and "flap" in on:
            self._flap()
        elif 0.06 <= r < 0.08 and "kill9" in on:
            self._kill9()
        elif 0.08 <= r < 0.10 and "freeze" in on:
            self._freeze()
        elif 0.10 <= r < 0.13 and "api" in on:
            self._api_faults()
        elif 0.13 <= r < 0.14 and len(self.nodes) > 2 and "delete_node" in on:
            self._delete_node()

    def _flap(self) -> None:
        node = self.rng.choice(self.nodes)
        self.srv.set_node_ready(node, False)
        self.tally.fault("node NotReady/Ready flaps")
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.srv.set_node_ready(node, True)

    def _kill9(self) -> None:
        if self.proc is not None:
            kill(self.proc)
        self.tally.fault("kill -9 of the leader")
        self.start_server()

    def _freeze(self) -> None:
        if self.proc is None:
            return
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.tally.fault("frozen leader (SIGSTOP)")
        time.sleep(self.rng.uniform(1.0, 4.0))
        os.kill(self.proc.pid, signal.SIGCONT)

    def _api_faults(self) -> None:
        self.tally.fault(self.srv.api_faults(self.rng.randrange(1 << 30)))
        time.sleep(self.rng.uniform(1.0, 3.0))
        self.srv.api_faults(None)

    def _delete_node(self) -> None:
        node = self.nodes.pop(self.rng.randrange(len(self.nodes)))
        self.srv.delete_node(node)
        self.tally.fault("node deletions")

    def close(self) -> None:
        if self.proc is not None:
            kill(self.proc, signal.SIGTERM)
        if self.own:
            self.srv.close()


def _admissions(state: Path) -> dict[str, int]:
    """Admissions per workload in gpupool's audit (its store, read after the server stopped)."""
    from gpupool.store import Store

    db = state / "gpupool.db"
    if not db.exists():
        return {}
    store = Store.open(f"sqlite:///{db}")
    try:
        out: dict[str, int] = {}
        for a in store.audit_records():
            if a.action in ("workload.admit", "workload.adopt"):
                out[a.name] = out.get(a.name, 0) + 1
        return out
    finally:
        store.close()


def _lost(srv: Any, created: list[str], ns: str = "default") -> list[str]:
    """Jobs still there that neither run, wait suspended in a queue, nor have ended."""
    out = []
    for name in created:
        j = srv.get("jobs.batch", ns, name) if _exists(srv, name, ns) else None
        if j is None:
            continue
        conds = {
            c.get("type")
            for c in (j.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"
        }
        if conds & {"Complete", "Failed"} or j["spec"].get("suspend"):
            continue
        pods = srv.list("pods", ns, label_selector=f"job-name={name}")
        if not any(p["spec"].get("nodeName") for p in pods) and not pods:
            out.append(name)
    return out


def _exists(srv: Any, name: str, ns: str = "default") -> bool:
    return bool(srv.list("jobs.batch", ns, field_selector=f"metadata.name={name}"))


def run_chaos(
    duration_s: float,
    nodes: int = 4,
    seed: int = 1,
    say: Any = lambda msg: None,
    target: ChaosTarget | None = None,
    faults: frozenset[str] = FAULTS,
) -> dict[str, Any]:
    """Faults for ``duration_s`` while Jobs flow; then a quiet settle and the counts. On the fake
    (``nodes`` nodes, every fault) unless ``target`` is given, with the ``faults`` it takes."""
    work = Path(tempfile.mkdtemp(prefix="gpupool-chaos-"))
    ch = Chaos(work, nodes, seed, target, faults)
    t0 = time.monotonic()
    try:
        compile_bytecode(work)
        ch.start_server()
        say(f"chaos: server up; faults for {duration_s:g} s")
        i, next_sample = 0, 0.0
        while time.monotonic() - t0 < duration_s:
            ch.step(i)
            i += 1
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                if time.monotonic() >= next_sample:
                    ch.tally.sample(ch.srv)
                    next_sample = time.monotonic() + SAMPLE_S
                time.sleep(0.05)
        settle_end = time.monotonic() + max(10.0, duration_s / 3)
        while time.monotonic() < settle_end:  # quiet: the last faults' requeues go through
            ch.tally.sample(ch.srv)
            time.sleep(0.2)
        lost = _lost(ch.srv, ch.created, ch.srv.ns)
        violations = ch.srv.violations()
    finally:
        ch.close()
    admits = _admissions(ch.state)
    unexplained = sorted(
        j
        for j, slots in ch.tally.running_uids.items()
        if max(len(u) for u in slots.values()) > admits.get(f"{ch.srv.ns}.job.{j}", 0)
    )
    return {
        "duration_s": duration_s,
        "jobs": len(ch.created),
        "ran": len(ch.tally.running_uids),  # Jobs seen with a pod Running
        "faults": ch.tally.faults,
        "samples": ch.tally.samples,
        "double_booked": len(ch.tally.double_booked),
        "double_booked_examples": sorted(ch.tally.double_booked)[:5],
        "fake_violations": len(violations),
        "fake_violation_examples": violations[:5],
        "lost": len(lost),
        "lost_examples": lost[:5],
        "late_binds": len(ch.tally.late_binds),
        "late_bind_examples": sorted(ch.tally.late_binds)[:5],
        "unexplained_restarts": len(unexplained),
        "unexplained_examples": unexplained[:5],
        "work": str(work),
    }


COUNTS = {
    "double_booked": "double_booked_examples",
    "fake_violations": "fake_violation_examples",
    "lost": "lost_examples",
    "late_binds": "late_bind_examples",
    "unexplained_restarts": "unexplained_examples",
}


def format_chaos(r: dict[str, Any]) -> str:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(r["faults"].items())) or "none"
    lines = [
        f"chaos for {r['duration_s']:g} s: {r['jobs']} Jobs ({r['ran']} seen running); faults: {faults};"
        f" {r['samples']} samples"
    ]
    for key, examples in COUNTS.items():
        lines.append(f"  {key:22}: {r[key]}" + (f"  e.g. {r[examples]}" if r[key] else ""))
    bad = {k: r[k] for k in COUNTS if r[k]}
    lines.append("  all 0" if not bad else f"  NOT all 0: {json.dumps(bad)} (logs and state in {r['work']})")
    return "\n".join(lines) + "\n"


__all__ = ["COUNTS", "FAULTS", "ChaosTarget", "FakeTarget", "chaos_job", "format_chaos", "run_chaos"]
