"""The POC evidence bundle (验收材料): one zip with what a trial must show.

Why a bundle: a trial is accepted on evidence an auditor can re-check away from the cluster —
every admission with its placement and rule, every preemption with its victims (allocation
proof); waits, completion and utilization (run evidence); failures, retries, requeues, node
faults and time to recover (failure-recovery records); and the audit chain with the result of
verifying it. Each file's sha256 is listed in ``MANIFEST.json``.

From a live store (``--db``) everything comes from the audit chain and the metered history; from
a simulator replay (``--sim``) it comes from the replay, and there is no audit chain to verify.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpupool.cost.history import History
from gpupool.cost.metering import US_PER_S, us_between
from gpupool.cost.reports import CostData, usage_report
from gpupool.cost.weekly import series

ALLOCATION = ("workload.admit", "workload.preempt")
RECOVERY = ("workload.failure", "workload.fail", "workload.requeue", "workload.evict", "workload.lost")
NODE_FAULTS = ("node.drain", "node.cordon", "node.uncordon", "device.health")


def _csv(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(["" if v is None else v for v in r] for r in rows)
    return buf.getvalue()


def _jsonl(items: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(i, sort_keys=True, default=str) + "\n" for i in items)


def run_files(data: CostData) -> dict[str, str]:
    """Run evidence: usage, every wait, every workload's outcome, utilization per pool per hour."""
    h = data.history
    waits = [
        [w.workload, h.workloads[w.workload].queue, h.workloads[w.workload].task_type, w.start.isoformat(),
         w.end.isoformat() if w.end else None, round(us_between(w.start, w.end or data.window.end) / (60 * US_PER_S), 3),
         w.admitted, w.reason]
        for w in h.waits
    ]  # fmt: skip
    runs = [
        [r.workload, r.attempt, r.res.pool, r.res.gpu_model, r.res.gpu_milli, r.start.isoformat(),
         r.end.isoformat() if r.end else None, r.outcome]
        for r in h.runs
    ]  # fmt: skip
    util = series(data)
    util_rows = [
        [pool, t, a, s["capacity"]]
        for pool, s in util.items()
        for t, a in zip(s["t"], s["allocated"], strict=True)
    ]
    return {
        "run/usage.json": json.dumps(usage_report(data), indent=2) + "\n",
        "run/waits.csv": _csv(
            ["workload", "queue", "type", "start", "end", "minutes", "admitted", "reason"], waits
        ),
        "run/runs.csv": _csv(
            ["workload", "attempt", "pool", "gpuModel", "gpuMilli", "start", "end", "outcome"], runs
        ),
        "run/utilization.csv": _csv(["pool", "hour", "gpusAllocated", "gpusCapacity"], util_rows),
    }


def recovery_rows(h: History) -> list[list[Any]]:
    """Each failure with the time until the workload ran again (empty while it has not)."""
    starts: dict[str, list[Any]] = {}
    for r in h.runs:
        starts.setdefault(r.workload, []).append(r.start)
    rows = []
    for name, at, code in sorted(h.failures, key=lambda f: (f[1], f[0])):
        nxt = min((s for s in starts.get(name, []) if s > at), default=None)
        mins = None if nxt is None else round(us_between(at, nxt) / (60 * US_PER_S), 3)
        rows.append([name, h.workloads[name].queue, at.isoformat(), code, mins])
    return rows


def store_files(store: Any, data: CostData) -> dict[str, str]:
    """Allocation proof, failure-recovery records and the audit chain from a live store."""
    inside = [r for r in store.audit_records() if data.window.start <= r.at < data.window.end]
    admits = [r.to_dict() for r in inside if r.action == "workload.admit"]
    preempts: dict[str, list[dict[str, Any]]] = {}
    for r in inside:
        if r.action == "workload.preempt":
            preempts.setdefault(str(r.detail.get("preemptor", "")), []).append(
                {"victim": r.name, **r.to_dict()}
            )
    audit = io.StringIO()
    count = store.export_audit("jsonl", audit)
    v = store.verify_audit()
    verdict = {
        "ok": v.ok,
        "count": v.count,
        "headHash": v.head_hash,
        "firstBadSeq": v.first_bad_seq,
        "problem": v.problem,
    }
    return {
        "allocation/admissions.jsonl": _jsonl(admits),
        "allocation/preemptions.json": json.dumps(preempts, indent=2, sort_keys=True, default=str) + "\n",
        "recovery/records.jsonl": _jsonl(r.to_dict() for r in inside if r.action in RECOVERY),
        "recovery/node-faults.jsonl": _jsonl(r.to_dict() for r in inside if r.action in NODE_FAULTS),
        "audit/audit.jsonl": audit.getvalue(),
        "audit/verify.json": json.dumps({**verdict, "exported": count}, indent=2) + "\n",
    }


def sim_files(data: CostData, events: Sequence[Any]) -> dict[str, str]:
    """Allocation proof and recovery records from a replay's own account (no audit chain)."""
    h = data.history
    admits = [
        {"workload": r.workload, "queue": h.workloads[r.workload].queue, "pool": r.res.pool, "gpuMilli": r.res.gpu_milli,
         "at": r.start.isoformat(), "outcome": r.outcome}
        for r in h.runs
    ]  # fmt: skip
    pre = [{"t": e.time, "victim": e.subject, "detail": e.detail} for e in events if e.kind == "preempted"]
    faults = [
        {"t": e.time, "kind": e.kind, "subject": e.subject, "detail": e.detail}
        for e in events
        if e.kind != "preempted"
    ]
    return {
        "allocation/admissions.jsonl": _jsonl(admits),
        "allocation/preemptions.jsonl": _jsonl(pre),
        "recovery/events.jsonl": _jsonl(faults),
        "audit/verify.json": json.dumps(
            {"ok": None, "problem": "a simulator replay has no audit chain"}, indent=2
        )
        + "\n",
    }


def write_bundle(path: Path, files: Mapping[str, str], about: Mapping[str, Any]) -> dict[str, Any]:
    """The zip, with MANIFEST.json listing every file's size and sha256, and the bundle's window."""
    manifest = {
        **about,
        "files": {
            n: {"bytes": len(t.encode()), "sha256": hashlib.sha256(t.encode()).hexdigest()}
            for n, t in sorted(files.items())
        },
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, text in sorted(files.items()):
            z.writestr(name, text)
        z.writestr("MANIFEST.json", json.dumps(manifest, indent=2) + "\n")
    return manifest


def evidence(data: CostData, store: Any | None = None, events: Sequence[Any] = ()) -> dict[str, str]:
    """Every file of the bundle for a store (``store``) or a replay (``events``)."""
    files = run_files(data)
    files["recovery/failures.csv"] = _csv(
        ["workload", "queue", "at", "reason", "minutesToRunAgain"], recovery_rows(data.history)
    )
    files.update(store_files(store, data) if store is not None else sim_files(data, events))
    return files
