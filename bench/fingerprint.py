"""The Philly replay's fingerprint: md5 of every job's first start, finish and preemption count.

Why: restructuring must not change a single scheduling decision; this hash over the whole trace
(82,247 jobs, gpupool policy) changes if any job starts or finishes at another time or is
preempted a different number of times. Usage: ``.venv/bin/python bench/fingerprint.py
[SCENARIO] [--metrics]`` (default examples/sim/philly.yaml; needs ../shared/data, skips cleanly
without). ``--metrics`` also prints the run's headline figures (wait, JCT, preemptions, ...) as
one JSON line, so two commits can be compared on the same run.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from gpupool.sim import metrics
from gpupool.sim.scenario import load_scenario
from gpupool.sim.simulator import simulate
from gpupool.sim.sources import SimInputError


def fingerprint(path: Path, policy: str = "gpupool") -> tuple[str, float, dict[str, Any]]:
    """The digest, the run's CPU seconds and its scalar metrics."""
    sc = load_scenario(path)
    t0 = time.process_time()
    r = simulate(sc, policy, sc.variants[0])
    cpu = time.process_time() - t0
    h = hashlib.md5()
    for j in r.jobs:
        h.update(f"{j.spec.name}:{j.first_start}:{j.finish}:{j.preempted}\n".encode())
    figures = {k: v for k, v in metrics.compute(r).items() if not isinstance(v, (dict, list))}
    return h.hexdigest()[:10], cpu, figures


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--metrics"]
    scenario = Path(args[0] if args else "examples/sim/philly.yaml")
    try:
        digest, cpu, figures = fingerprint(scenario)
    except SimInputError as exc:  # the trace is absent (a clean skip) or the scenario is bad
        absent = str(exc).endswith("no such file")
        print(f"{'skipped' if absent else 'error'}: {exc}")
        raise SystemExit(0 if absent else 2) from None
    print(f"{scenario}: fingerprint {digest}, gpupool run {cpu:.1f} s CPU")
    if "--metrics" in sys.argv[1:]:
        print(json.dumps(figures))
