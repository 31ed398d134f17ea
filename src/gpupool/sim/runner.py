"""Run every policy on every cluster variant of a scenario and collect the results."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.sim.metrics import compute, series, wait_quantiles
from gpupool.sim.scenario import Scenario
from gpupool.sim.simulator import RunResult, simulate


@dataclass(slots=True)
class Run:
    label: str
    result: RunResult
    metrics: dict[str, Any]


def run_label(policy: str, variant: str, n_variants: int) -> str:
    return policy if n_variants == 1 else f"{policy} @ {variant}"


def run_scenario(
    sc: Scenario,
    progress: Callable[[str, int, int], None] | None = None,
    check_invariants: bool | None = None,
) -> list[Run]:
    """Every (variant, policy) pair, in the scenario's order; progress(label, done, total)."""
    runs: list[Run] = []
    total = sum(1 for j in sc.trace.jobs)
    for v in sc.variants:
        for p in sc.policies:
            label = run_label(p, v.name, len(sc.variants))

            def tick(done: int, label: str = label) -> None:
                if progress is not None:
                    progress(label, done, total)

            r = simulate(sc, p, v, check_invariants, progress=tick if progress else None)
            runs.append(Run(label, r, compute(r)))
    return runs


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
        if with_series:
            entry["series"] = series(r.result)
            entry["wait_quantiles"] = wait_quantiles(r.result)
        out["runs"].append(entry)
    return out


def dumps(obj: Any) -> str:
    """Byte-stable JSON: sorted keys, fixed separators."""
    return json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
