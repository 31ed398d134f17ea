"""Print the Kueue-baseline figures: makespan / physical limit, evictions and time to admission
per class, capacity thrown away, for each policy of ``kueue-baseline.yaml``.

    .venv/bin/python examples/sim/kueue-baseline-report.py [--scale 0.2] [--cohorts 5] [--seed-shift S]
        [--policies gpupool,gpupool-no-preemption] [--set preemption_wait_s=0.1 ...]

``--scale`` shrinks every set's count (a quick look); ``--shift`` moves each set's start by a
multiple of the seed-like offset (a variant the parameters were not chosen on); ``--set`` runs
the ``gpupool`` policy with other cost-model knobs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpupool.sim.baselines import Policy
from gpupool.sim.metrics import compute
from gpupool.sim.scenario import load_scenario
from gpupool.sim.simulator import Simulation

HERE = Path(__file__).resolve().parent


def variant_text(scale: float, cohorts: int, shift: float, mix: str) -> str:
    """The scenario with fewer workloads or cohorts, set starts shifted, or another class mix."""
    doc = yaml.safe_load((HERE / "kueue-baseline.yaml").read_text())
    spec = doc["spec"]
    spec["cluster"]["cohorts"][0]["count"] = cohorts
    mult = [float(x) for x in mix.split(",")] if mix else [1.0] * len(spec["workload"]["sets"])
    for i, s in enumerate(spec["workload"]["sets"]):
        s["count"] = max(1, round(s["count"] * scale * mult[i]))
        s["start"] = round(shift * (i + 1), 3)
    node = spec["cluster"]["documents"][0]["spec"]["nodes"][0]
    node["cpu"] = 120 * cohorts
    return yaml.safe_dump(doc)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    text = variant_text(args.scale, args.cohorts, args.shift, args.mix)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=HERE, delete=False) as f:
        f.write(text)
    try:
        sc = load_scenario(Path(f.name))
    finally:
        Path(f.name).unlink()
    knobs = dict(kv.split("=", 1) for kv in args.set)
    out = []
    for name in args.policies.split(","):
        pol = Policy.named(name)
        if knobs and name == "gpupool":
            cfg = replace(pol.config, **{k: type(getattr(pol.config, k))(v) for k, v in knobs.items()})
            pol = replace(pol, config=cfg)
        t0 = time.process_time()
        r = Simulation(sc, pol, sc.variants[0]).run()
        m = compute(r)
        m["cpu_s"] = time.process_time() - t0
        out.append(m)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--cohorts", type=int, default=5)
    ap.add_argument("--shift", type=float, default=0.0)
    ap.add_argument("--mix", default="", help="count multipliers per class, e.g. 1,1.5,0.8")
    ap.add_argument("--policies", default="gpupool,gpupool-eager-preemption,gpupool-no-preemption")
    ap.add_argument("--set", action="append", default=[], help="knob=value for the gpupool policy")
    args = ap.parse_args()
    for m in run(args):
        print(
            f"{m['policy']:26s} makespan {m['makespan_s']:.2f}s / limit {m['physical_limit_s']:.2f}s"
            f" = {m['makespan_over_limit']:.3f}x  lost {100 * m['preemption_lost_share']:.1f}%"
            f"  preemptions {m['preemptions']}  ({m['cpu_s']:.0f}s CPU)"
        )
        for c, v in m["per_class"].items():
            print(
                f"    {c:8s} jobs {v['jobs']:5d}  evictions/job {v['evictions_per_job']:.2f}"
                f"  admission p50 {v['wait_p50_s']:.3f}s p90 {v['wait_p90_s']:.3f}s"
                f"  JCT mean {v['jct_mean_s']:.3f}s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
