"""Runs the YAML scenario tests: cluster + queues + workloads -> expected decisions per cycle.

Acts like a controller: admitted work runs, victims are requeued as pending, and the invariant
checker runs after every cycle.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.engine import Decisions, apply_decisions, decide
from gpupool.engine.invariants import check_cycle
from gpupool.manifests import Bundle, build, default_priority_classes, parse_documents
from gpupool.model import EngineConfig, PodGroup, PodRequest, Snapshot, Workload

HERE = Path(__file__).parent / "scenarios"


def load_scenario(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and "cycles" in data, f"{path}: not a scenario"
    return data


def _bundle(scn: dict[str, Any]) -> Bundle:
    base_docs = parse_documents((HERE / "_base.yaml").read_text(), "_base.yaml")
    docs = parse_documents(scn.get("manifests", ""), "scenario")
    overridden = {(d.kind, d.name) for d in docs if d.kind != "Cluster"}
    merged = [d for d in base_docs if (d.kind, d.name) not in overridden] + docs
    b = build(merged, Bundle(priority_classes=list(default_priority_classes())))
    classes = {p.name: p for p in b.priority_classes}
    seq = len(b.workloads)
    for g in scn.get("generate", []):
        pc = classes[g["priorityClass"]]
        for i in range(g["count"]):
            b.workloads.append(
                Workload(
                    f"{g['prefix']}{i:03d}",
                    g["queue"],
                    (PodGroup("main", 1, PodRequest(gpus=g["gpus"])),),
                    pc.name,
                    pc.value,
                    pc.preemptible,
                    arrival=float(seq),
                )
            )
            seq += 1
    return b


def run_scenario(scn: dict[str, Any]) -> list[tuple[Decisions, Snapshot]]:
    b = _bundle(scn)
    by_name = {w.name: w for w in b.workloads}
    config = EngineConfig(**scn.get("config", {}))
    snap = Snapshot(tuple(b.nodes), tuple(b.pools), tuple(b.queues), tuple(b.priority_classes), config=config)
    history = []
    for n, cycle in enumerate(scn["cycles"]):
        done = set(cycle.get("finish", []))
        if done:
            assert done <= {r.name for r in snap.running}, f"cycle {n}: finish {done}: not running"
            snap = replace(snap, running=tuple(r for r in snap.running if r.name not in done))
        sub = cycle.get("submit", [])
        names = [w.name for w in b.workloads] if sub == "all" else sub
        now = float(cycle.get("at", n))
        snap = replace(snap, pending=snap.pending + tuple(by_name[x] for x in names), now=now)
        d = decide(snap)
        after = apply_decisions(snap, d, now=now)
        problems = check_cycle(snap, d, after)
        assert not problems, f"cycle {n}: invariant violations: {problems}"
        victims = [by_name[v] for v in d.victims()]
        snap = replace(after, pending=after.pending + tuple(victims))
        check_expectations(n, cycle.get("expect", {}), d, snap)
        history.append((d, snap))
    return history


def check_expectations(n: int, exp: dict[str, Any], d: Decisions, snap: Snapshot) -> None:
    admitted = {a.workload: a for a in d.admitted}
    pending = {p.workload: p for p in d.pending}
    victims = {v.workload: (p.preemptor, v) for p in d.preempted for v in p.victims}
    where = f"cycle {n}"
    if "admitted" in exp:
        want = exp["admitted"]
        names = list(want) if isinstance(want, dict) else want
        assert set(admitted) == set(names), (
            f"{where}: admitted {sorted(admitted)}, expected {sorted(names)}; pending: {[(p.workload, p.reason) for p in d.pending]}"
        )
        if isinstance(want, dict):
            for name, props in want.items():
                a = admitted[name]
                props = props or {}
                if "borrowing" in props:
                    assert a.borrowing == props["borrowing"], f"{where}: {name} borrowing={a.borrowing}"
                if "nodes" in props:
                    got = sorted({p.node for p in a.pods})
                    assert got == sorted(props["nodes"]), (
                        f"{where}: {name} on {got}, expected {props['nodes']}"
                    )
                if "devices" in props:
                    got_d = sorted(
                        [p.node, d_, p.gpu_milli, p.gpu_memory_mib] for p in a.pods for d_ in p.devices
                    )
                    assert got_d == sorted(props["devices"]), f"{where}: {name} devices {got_d}"
                if "after_shrinking" in props:
                    assert sorted(a.after_shrinking) == sorted(props["after_shrinking"]), (
                        f"{where}: {name} shrinks {a.after_shrinking}"
                    )
                if "after_evicting" in props:
                    assert sorted(a.after_evicting) == sorted(props["after_evicting"]), (
                        f"{where}: {name} evicts {a.after_evicting}"
                    )
    if "admitted_per_queue" in exp:
        counts: dict[str, int] = {}
        for a in d.admitted:
            counts[a.queue] = counts.get(a.queue, 0) + 1
        assert counts == exp["admitted_per_queue"], f"{where}: admitted per queue {counts}"
    want_pre = exp.get("preempted", {})
    assert set(victims) == set(want_pre), f"{where}: victims {sorted(victims)}, expected {sorted(want_pre)}"
    for name, props in want_pre.items():
        by, v = victims[name]
        assert by == props["by"], f"{where}: {name} preempted by {by}"
        assert str(v.rule) == props["rule"], f"{where}: {name} rule {v.rule}"
    shrunk = {sh.workload: (p.preemptor, sh) for p in d.preempted for sh in p.shrinks}
    want_sh = exp.get("shrunk", {})
    assert set(shrunk) == set(want_sh), f"{where}: shrunk {sorted(shrunk)}, expected {sorted(want_sh)}"
    for name, props in want_sh.items():
        by, sh = shrunk[name]
        assert by == props["by"], f"{where}: {name} shrunk for {by}"
        assert str(sh.rule) == props["rule"], f"{where}: {name} rule {sh.rule}"
        assert sh.replicas == props["replicas"], f"{where}: {name} keeps {sh.replicas} pods"
    moved = {m.workload: m for m in d.moved}
    if "moved" in exp:
        want_mv = exp["moved"] or {}
        assert set(moved) == set(want_mv), f"{where}: moved {sorted(moved)}, expected {sorted(want_mv)}"
        for name, props in want_mv.items():
            m = moved[name]
            assert m.for_workload == props["for"], f"{where}: {name} moved for {m.for_workload}"
            if "reason" in props:
                assert props["reason"] in m.reason, f"{where}: {name} reason {m.reason!r}"
    for name, props in exp.get("pending", {}).items():
        assert name in pending, f"{where}: {name} not pending (admitted={name in admitted})"
        props = props or {}
        p = pending[name]
        if "code" in props:
            assert str(p.code) == props["code"], f"{where}: {name} code {p.code}: {p.reason}"
        if "reason" in props:
            assert props["reason"] in p.reason, (
                f"{where}: {name} reason {p.reason!r} lacks {props['reason']!r}"
            )
    for name, k in exp.get("running_pods", {}).items():
        got = [len(r.admission.pods) for r in snap.running if r.name == name]
        assert got == [k], f"{where}: {name} runs {got} pods, expected {k}"
    if "running" in exp:
        assert sorted(r.name for r in snap.running) == sorted(exp["running"]), (
            f"{where}: running {[r.name for r in snap.running]}"
        )
