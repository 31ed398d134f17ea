"""Run every policy on every cluster variant of a scenario and collect the results."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, fields, replace
from typing import Any

from gpupool.sim.metrics import compute, job_class, series, wait_quantiles
from gpupool.sim.results import JobRecord, RunResult
from gpupool.sim.scenario import Scenario
from gpupool.sim.simulator import simulate


@dataclass(slots=True)
class Run:
    label: str
    result: RunResult
    metrics: dict[str, Any]


def run_label(policy: str, variant: str, n_variants: int) -> str:
    return policy if n_variants == 1 else f"{policy} @ {variant}"


#: below this many jobs a run takes about as long as starting a worker process
PARALLEL_MIN_JOBS = 5000

_progress_queue: Any = None
#: the scenario, set before worker processes are forked (they inherit it instead of unpickling it)
_inherited: Scenario | None = None


def _init_worker(q: Any) -> None:
    global _progress_queue
    _progress_queue = q


#: a job record's fields after its spec, in constructor order
_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))[1:]
_Packed = tuple[str, RunResult, list[tuple[Any, ...]], dict[str, Any]]


def _pack(run: Run) -> _Packed:
    """A run as a worker sends it back: job records as plain rows, without their specs (the
    parent has every spec already). Pickling 82k dataclasses each way cost seconds of wall time
    after the run itself had finished."""
    rows = [tuple([getattr(j, f) for f in _RECORD_FIELDS]) for j in run.result.jobs]
    return run.label, replace(run.result, jobs=[]), rows, run.metrics


def _unpack(sc: Scenario, packed: _Packed) -> Run:
    label, result, rows, metrics = packed
    specs = sc.trace.jobs
    result.jobs = [JobRecord(specs[row[0]], *row) for row in rows]
    return Run(label, result, metrics)


def _run_one(sc: Scenario | None, vi: int, policy: str, label: str, check: bool | None) -> _Packed:
    """One (variant, policy) run in a worker process; progress goes back through a queue."""
    sc = sc or _inherited
    assert sc is not None
    q = _progress_queue
    # the scenario (every job of the trace) lives for the whole run: keep the cyclic GC from
    # walking it again and again (this process does nothing else)
    gc.collect()
    gc.freeze()

    def tick(done: int) -> None:
        if q is not None and done % 256 == 0:
            q.put((label, done))

    r = simulate(sc, policy, sc.variants[vi], check, progress=tick)
    return _pack(Run(label, r, compute(r)))


def run_scenario(
    sc: Scenario,
    progress: Callable[[str, int, int], None] | None = None,
    check_invariants: bool | None = None,
    workers: int | None = None,
) -> list[Run]:
    """Every (variant, policy) pair, in the scenario's order; progress(label, done, total).

    Runs are independent and deterministic, so long ones go to worker processes, one per core
    (``workers``; by default only for traces of PARALLEL_MIN_JOBS jobs or more): the results
    are the same, in the same order, as a sequential run."""
    total = len(sc.trace.jobs)
    todo = [
        (vi, p, run_label(p, v.name, len(sc.variants)))
        for vi, v in enumerate(sc.variants)
        for p in sc.policies
    ]
    if workers is None:
        workers = min(len(todo), os.cpu_count() or 1) if total >= PARALLEL_MIN_JOBS else 1
    if workers > 1 and len(todo) > 1:
        return _run_parallel(sc, todo, progress, check_invariants, workers, total)
    runs: list[Run] = []
    for vi, p, label in todo:

        def tick(done: int, label: str = label) -> None:
            if progress is not None:
                progress(label, done, total)

        r = simulate(sc, p, sc.variants[vi], check_invariants, progress=tick if progress else None)
        runs.append(Run(label, r, compute(r)))
    return runs


def start_method() -> str:
    """Fork when this process runs no other thread: workers then inherit the scenario instead
    of importing gpupool and unpickling every job (seconds on a big trace). Otherwise spawn: a
    thread (a progress bar's) could hold a lock at the moment of the fork and deadlock a child."""
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return "fork"
    return "spawn"


def _run_parallel(
    sc: Scenario,
    todo: list[tuple[int, str, str]],
    progress: Callable[[str, int, int], None] | None,
    check: bool | None,
    workers: int,
    total: int,
) -> list[Run]:
    global _inherited
    method = start_method()
    fork = method == "fork"
    ctx = multiprocessing.get_context(method)
    q = ctx.Queue() if progress is not None else None
    _inherited = sc if fork else None
    try:
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(q,)) as ex:
            arg = None if fork else sc
            futs = [ex.submit(_run_one, arg, vi, p, label, check) for vi, p, label in todo]
            pending = set(futs)
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                while q is not None and progress is not None:
                    try:
                        label, n = q.get_nowait()
                    except queue.Empty:
                        break
                    progress(label, n, total)
                for f in done:
                    if progress is not None:
                        progress(f.result()[0], total, total)
            return [_unpack(sc, f.result()) for f in futs]
    finally:
        _inherited = None


def to_json(sc: Scenario, runs: list[Run], with_series: bool = True) -> dict[str, Any]:
    """Everything a program needs: metrics per run, rejected jobs, fault events, series."""
    first = runs[0].result if runs else None
    rejected = (
        [
            {"job": j.spec.name, "source": j.spec.source, "reason": j.reject_reason}
            for j in first.jobs
            if j.reject_reason
        ]
        if first
        else []
    )
    out: dict[str, Any] = {
        "scenario": sc.name,
        "seed": sc.seed,
        "jobs": len(sc.trace.jobs),
        "policies": sc.policies,
        "variants": [
            {"name": v.name, "nodes": len(v.nodes), "gpus": sum(n.gpu_count for n in v.nodes)}
            for v in sc.variants
        ],
        "rejected": {"count": len(rejected), "jobs": rejected},
        "runs": [],
    }
    for r in runs:
        entry: dict[str, Any] = {"label": r.label, "metrics": r.metrics}
        entry["events"] = [
            {"time": round(e.time, 3), "kind": e.kind, "subject": e.subject, "detail": e.detail}
            for e in r.result.events
            if e.kind != "rejected"
        ]
        entry["invariant_violations"] = r.result.violations[:100]
        entry["job_admissions"] = job_admissions(r.result)
        if with_series:
            entry["series"] = series(r.result)
            entry["wait_quantiles"] = wait_quantiles(r.result)
        out["runs"].append(entry)
    return out


def job_admissions(r: RunResult) -> dict[str, Any]:
    """Per job, in trace order, as columns (a row per job would repeat every key 15,000 times):
    name, class, submit time, every admission time, finish time (None: never) and evictions."""
    jobs = [j for j in r.jobs if j.status != "rejected"]
    return {
        "name": [j.spec.name for j in jobs],
        "class": [job_class(j.spec) for j in jobs],
        "submit": [round(j.spec.submit, 4) for j in jobs],
        "admitted": [[round(t, 4) for t in j.starts] for j in jobs],
        "finish": [None if j.finish is None else round(j.finish, 4) for j in jobs],
        "evictions": [j.preempted for j in jobs],
    }


def dumps(obj: Any) -> str:
    """Byte-stable JSON: sorted keys, fixed separators."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
