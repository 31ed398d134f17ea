"""Print the Kueue-baseline table: per setting, makespan / physical limit, capacity thrown away,
evictions per medium job, time to admission per class; and the zero-wait bound.

    .venv/bin/python examples/sim/kueue-baseline-report.py [variant options] [--row NAME=SPEC ...]

A row's SPEC is ``POLICY[:knob=value;knob=value][@class=duration;class=duration]``: a simulator
policy, its ``EngineConfig`` knobs, and ``spec.preemptionWait`` set on priority classes of the
scenario (so ``gpupool@large=0s`` is the default engine with the large class evicting at once).
Without ``--row``: gpupool, gpupool@large=0s, eager preemption, no preemption; ``--set
knob=value`` applies to every row of the ``gpupool`` policy.

Variants (for choosing knobs on cases other than the baseline): ``--scale`` shrinks every set's
count, ``--cohorts`` the number of cohorts (capacity follows), ``--shift`` moves each set's
start by a multiple of it, ``--mix`` multiplies the counts per class, ``--stagger SEED`` gives
every queue's sets their own random start within one interval (the waves no longer line up),
``--now-queues N`` puts the large jobs of the first N queues of each cohort in a class with
``preemptionWait: 0s`` (an operator's mix of never-waiting and waiting large work).
``--time-scale K`` multiplies every time (set intervals, starts and durations, class waits) by
``K``: ``--time-scale 1000`` is the scenario in seconds instead of milliseconds, and gives the
same table with every time x 1000 (docs/engine.md, "Time-scale invariance").
The knobs of docs/engine.md ("Preemption cost") were chosen on these six, then reported on the
baseline: ``--cohorts 2 --scale 0.2``; ``--cohorts 2 --scale 0.5 --shift 0.05``; ``--cohorts 3
--scale 0.3 --stagger 1``; ``--cohorts 2 --scale 0.3 --mix 1,1.5,0.8``; ``--cohorts 2 --scale
0.3 --mix 0.5,1,1.2``; ``--cohorts 5 --scale 0.2 --stagger 2``.

The bound (``gpupool.sim.bounds``): the least makespan any schedule reaches when every large
job starts at its arrival. CPU seconds are process time (the machine may be shared).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.sim.baselines import Policy
from gpupool.sim.bounds import zero_wait_bound
from gpupool.sim.metrics import compute, job_class
from gpupool.sim.scenario import Scenario, load_scenario
from gpupool.sim.sets import duration_s
from gpupool.sim.simulator import Simulation

HERE = Path(__file__).resolve().parent
DEFAULT_ROWS = [
    "gpupool=gpupool",
    "gpupool, large 0s=gpupool@large=0s",
    "eager=gpupool-eager-preemption",
    "no preemption=gpupool-no-preemption",
]


def variant_doc(args: argparse.Namespace, waits: dict[str, str]) -> dict[str, Any]:
    """The scenario document of the variant asked for, with ``preemptionWait`` per class."""
    doc = yaml.safe_load((HERE / "kueue-baseline.yaml").read_text())
    spec = doc["spec"]
    spec["cluster"]["cohorts"][0]["count"] = args.cohorts
    spec["cluster"]["documents"][0]["spec"]["nodes"][0]["cpu"] = 120 * args.cohorts
    for d in spec["cluster"]["documents"]:
        if d["kind"] == "PriorityClass" and d["metadata"]["name"] in waits:
            d["spec"]["preemptionWait"] = waits[d["metadata"]["name"]]
    sets = spec["workload"]["sets"]
    mult = [float(x) for x in args.mix.split(",")] if args.mix else [1.0] * len(sets)
    for i, s in enumerate(sets):
        s["count"] = max(1, round(s["count"] * args.scale * mult[i]))
        s["start"] = round(args.shift * (i + 1), 3)
    if args.now_queues:
        _split_large(spec, args.now_queues)
    if args.stagger is not None:
        spec["workload"]["sets"] = _staggered(spec["workload"]["sets"], args.cohorts, args.stagger)
    if args.time_scale != 1.0:
        _rescale(spec, args.time_scale)
    return doc


def _rescale(spec: dict[str, Any], k: float) -> None:
    """Every time of the scenario (set interval, start, duration; class preemptionWait) x ``k``,
    as seconds."""
    for s in spec["workload"]["sets"]:
        for key in ("interval", "start", "duration"):
            if key in s:
                s[key] = duration_s(s[key], key) * k
    for d in spec["cluster"]["documents"]:
        if d["kind"] == "PriorityClass" and "preemptionWait" in d["spec"]:
            d["spec"]["preemptionWait"] = duration_s(d["spec"]["preemptionWait"], "preemptionWait") * k


def _split_large(spec: dict[str, Any], n: int) -> None:
    """The large jobs of the first ``n`` queues of every cohort in a class ``large-now`` (the
    same priority, ``preemptionWait: 0s``); still reported as the class ``large``."""
    pc = {"value": 200, "preemptionWait": "0s"}
    spec["cluster"]["documents"].append(
        {
            "apiVersion": "gpupool.io/v1alpha1",
            "kind": "PriorityClass",
            "metadata": {"name": "large-now"},
            "spec": pc,
        }
    )
    sets = spec["workload"]["sets"]
    big = next(s for s in sets if s["className"] == "large")
    sets.remove(big)
    sets.append(dict(big, queues=[f"cq-*-{q}" for q in range(n)], priorityClass="large-now"))
    if n < 6:
        sets.append(dict(big, queues=[f"cq-*-{q}" for q in range(n, 6)]))


def _staggered(sets: list[dict[str, Any]], cohorts: int, seed: int) -> list[dict[str, Any]]:
    """One set per class and queue, each starting at its own random point of one interval."""
    rng = random.Random(seed)
    out = []
    for s in sets:
        interval = float(s["interval"].removesuffix("ms")) / 1000.0
        for c in range(cohorts):
            for q in range(6):
                one = dict(s, queues=[f"cq-{c}-{q}"])
                one["start"] = round(float(s.get("start", 0)) + rng.uniform(0, interval), 3)
                out.append(one)
    return out


def load(doc: dict[str, Any]) -> Scenario:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=HERE, delete=False) as f:
        f.write(yaml.safe_dump(doc))
    try:
        return load_scenario(Path(f.name))
    finally:
        Path(f.name).unlink()


def parse_row(text: str) -> tuple[str, str, dict[str, str], dict[str, str]]:
    """``NAME=POLICY[:k=v;k=v][@class=dur;class=dur]`` as (name, policy, knobs, class waits)."""
    name, _, spec = text.partition("=")
    spec, _, waits = spec.partition("@")
    policy, _, knobs = spec.partition(":")

    def pairs(s: str) -> dict[str, str]:
        return dict(kv.split("=", 1) for kv in s.split(";") if kv)

    return name, policy, pairs(knobs), pairs(waits)


def run_row(args: argparse.Namespace, row: str) -> dict[str, Any]:
    """One row of the table: the variant with the row's class waits, under the row's policy."""
    name, policy, knobs, waits = parse_row(row)
    if policy == "gpupool":  # --set knob=value: for every row of the default engine
        knobs = {**dict(kv.split("=", 1) for kv in args.set), **knobs}
    sc = load(variant_doc(args, waits))
    pol = Policy.named(policy)
    if knobs:
        cfg = replace(pol.config, **{k: _typed(getattr(pol.config, k), v) for k, v in knobs.items()})
        pol = replace(pol, config=cfg)
    t0 = time.process_time()
    r = Simulation(sc, pol, sc.variants[0]).run()
    m = compute(r)
    m["cpu_s"] = time.process_time() - t0
    m["row"] = name
    large = [
        j.first_start - j.spec.submit
        for j in r.jobs
        if job_class(j.spec) == "large" and j.first_start is not None
    ]
    m["large_wait_max_s"] = max(large, default=0.0)
    m["large_waited_share"] = sum(w > 1e-9 * args.time_scale for w in large) / max(1, len(large))
    return m


def _typed(default: object, text: str) -> object:
    """A knob's value from text, of its default's type (a number where the default is None)."""
    return float(text) if default is None else type(default)(text)


def table_line(m: dict[str, Any]) -> str:
    pc = m["per_class"]
    lg, md, sm = pc.get("large", {}), pc.get("medium", {}), pc.get("small", {})
    return (
        f"| {m['row']} | {m['makespan_over_limit']:.3f} | {100 * m['preemption_lost_share']:.1f}% "
        f"| {md.get('evictions_per_job', 0):.2f} | {lg.get('wait_p50_s', 0):.2f} / {lg.get('wait_p90_s', 0):.2f}"
        f" / {m['large_wait_max_s']:.2f} ({100 * m['large_waited_share']:.0f}%) "
        f"| {md.get('wait_p50_s', 0):.1f} / {md.get('wait_p90_s', 0):.1f} "
        f"| {sm.get('wait_p50_s', 0):.1f} / {sm.get('wait_p90_s', 0):.1f} | {m['cpu_s']:.1f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--cohorts", type=int, default=5)
    ap.add_argument("--shift", type=float, default=0.0)
    ap.add_argument("--mix", default="", help="count multipliers per class, e.g. 1,1.5,0.8")
    ap.add_argument("--stagger", type=int, default=None, help="seed of per-queue random starts")
    ap.add_argument("--now-queues", type=int, default=0, help="large of the first N queues per cohort at 0s")
    ap.add_argument("--row", action="append", default=[], help="NAME=POLICY[:k=v;...][@class=dur;...]")
    ap.add_argument("--set", action="append", default=[], help="knob=value for every gpupool row")
    ap.add_argument("--time-scale", type=float, default=1.0, help="every time x K (1000: seconds)")
    args = ap.parse_args()
    sc = load(variant_doc(args, {}))
    b = zero_wait_bound(sc.trace.jobs, 120.0 * args.cohorts, "large")
    print(
        f"physical limit {b.physical_limit_s:.2f} s; zero-wait bound for large: {b.makespan_s:.2f} s"
        f" = {b.ratio:.3f}x (saturated until {b.saturated_until_s:.2f} s, other work useful before"
        f" it at most {b.useful_before_s:.0f} of {b.other_work:.0f} CPU-s)\n"
    )
    print(
        "| setting | makespan / limit | capacity lost | evictions / medium job "
        "| large admission p50 / p90 / max s (share that waited) | medium p50 / p90 s | small p50 / p90 s | CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in args.row or DEFAULT_ROWS:
        print(table_line(run_row(args, row)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
