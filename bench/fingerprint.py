"""The Philly replay's fingerprint: md5 of every job's first start, finish and preemption count.

Why: restructuring must not change a single scheduling decision; this hash over the whole trace
(82,247 jobs, gpupool policy) changes if any job starts or finishes at another time or is
preempted a different number of times. Usage: ``.venv/bin/python bench/fingerprint.py
[SCENARIO]`` (default examples/sim/philly.yaml; needs ../shared/data, skips cleanly without).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from gpupool.sim.scenario import load_scenario
from gpupool.sim.simulator import simulate


def fingerprint(path: Path, policy: str = "gpupool") -> tuple[str, float]:
    sc = load_scenario(path)
    t0 = time.process_time()
    r = simulate(sc, policy, sc.variants[0])
    cpu = time.process_time() - t0
    h = hashlib.md5()
    for j in r.jobs:
        h.update(f"{j.spec.name}:{j.first_start}:{j.finish}:{j.preempted}\n".encode())
    return h.hexdigest()[:10], cpu


if __name__ == "__main__":
    scenario = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/sim/philly.yaml")
    try:
        digest, cpu = fingerprint(scenario)
    except FileNotFoundError as exc:
        print(f"skipped: {exc}")
        raise SystemExit(0) from None
    print(f"{scenario}: fingerprint {digest}, gpupool run {cpu:.1f} s CPU")
