"""``make bench-check``: has a change made the engine, the Philly replay or the CLI's start costlier?

Why ratios of CPU seconds, not times: the development machine has two cores shared with builds
and other runs, so wall times move by 2x with the load and even CPU seconds drift with the
machine. Each figure here is a ratio of CPU seconds taken in this process (or its children) in
the same run: the engine's cycle against the naive first-fit on the same snapshot, the replay's
gpupool run against FIFO on the same prefix and against a fixed pure-Python loop, the CLI's start
against a bare interpreter's. Every ratio is a cost (higher is worse), compared with
bench/baseline.json; a ratio more than ``tolerance`` above its baseline fails (exit 1).

Usage: ``.venv/bin/python bench/check.py [--jobs N] [--tolerance T] [--update]``. ``--update``
writes today's figures as the new baseline (after a change that is meant to move them; say so in
the commit). The replay needs ../shared/data (skipped, with a message, when it is absent).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BASELINE = Path(__file__).with_name("baseline.json")
PHILLY = REPO / "examples" / "sim" / "philly.yaml"
#: the engine bench's size: a few seconds of CPU, where the engine's lead over first-fit is thin
ENGINE_SIZE = {"nodes": 2000, "queues": 400, "cohorts": 10, "workloads": 20000, "seed": 1}
DEFAULT_JOBS = 10_000  # the replay's prefix: about 7 s of CPU for gpupool's run
# Each figure is the least CPU of several runs: load on a shared machine only ever adds to a
# run's CPU (contended caches and cores), so the least is the steadiest.
REPEATS = 3  # the engine, first-fit and the calibration loop
REPLAY_REPEATS = 2  # each replay (FIFO and gpupool alternately): the costliest part
CLI_RUNS = 7  # each process start
DEFAULT_TOLERANCE = 0.30


# -- comparison (pure: tests/bench/test_bench_check.py) ------------------------------------------
def compare(
    base: Mapping[str, float], now: Mapping[str, float], tolerance: float
) -> tuple[list[str], list[str]]:
    """One line per ratio saying how it moved against the baseline, and the names of those
    more than ``tolerance`` (a fraction: 0.3 is 30%) above it. A ratio not measured this time
    (the replay without its data) is reported and not failed; a new one has nothing to fail."""
    lines: list[str] = []
    worse: list[str] = []
    for name in sorted(set(base) | set(now)):
        if name not in now:
            lines.append(f"{name}: not measured this run (baseline {base[name]:.3f})")
            continue
        if name not in base or base[name] <= 0:
            lines.append(f"{name}: {now[name]:.3f} (not in the baseline)")
            continue
        change = now[name] / base[name] - 1
        if change > tolerance:
            verdict = f"WORSE by more than {tolerance:.0%}"
            worse.append(name)
        elif change < -tolerance:
            verdict = f"better by more than {tolerance:.0%}: update the baseline (--update)"
        else:
            verdict = "within tolerance"
        lines.append(f"{name}: {base[name]:.3f} -> {now[name]:.3f} ({change:+.1%}, {verdict})")
    return lines, worse


def changed_facts(base: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What the run decided that differs from the baseline's run (placements, the replay's
    fingerprint): not a failure here (a decision change is named in its own commit), but a
    ratio is only comparable when these agree."""
    return [
        f"{k}: {base[k]} -> {now[k]} (decisions differ from the baseline's run)"
        for k in sorted(set(base) & set(now))
        if base[k] != now[k]
    ]


# -- measurements ---------------------------------------------------------------------------
def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def _least_cpu(fn: Callable[[], Any], repeats: int = REPEATS) -> tuple[float, Any]:
    runs = [_cpu(fn) for _ in range(repeats)]
    return min(c for c, _ in runs), runs[-1][1]


def _calibration_loop() -> int:
    """A fixed pure-Python workload (dicts, tuples, sorting): what the interpreter does most
    in a replay, so a slower machine moves both sides of the replay's second ratio."""
    buckets: dict[int, int] = {}
    acc = 0
    for i in range(2_000_000):
        k = (i * 7919) % 1009
        buckets[k] = buckets.get(k, 0) + i
        acc ^= hash((k, i >> 3))
    return acc ^ sum(sorted(buckets.values())[:10])


def measure_engine() -> tuple[dict[str, float], dict[str, Any], dict[str, float]]:
    """The engine's full cycle and first-fit on the engine bench's synthetic snapshot."""
    from dataclasses import replace

    from gpupool.bench.engine import build_snapshot, first_fit
    from gpupool.engine import decide
    from gpupool.model import EngineConfig

    s = ENGINE_SIZE
    snap = replace(
        build_snapshot(s["nodes"], s["queues"], s["cohorts"], s["workloads"], s["seed"]),
        config=EngineConfig(score="auto"),
    )
    engine_cpu, d = _least_cpu(lambda: decide(snap))
    ff_cpu, ff_placed = _least_cpu(lambda: first_fit(snap))
    placed = sum(len(a.pods) for a in d.admitted)
    return (
        {"engine_cycle_vs_first_fit": engine_cpu / ff_cpu},
        {"engine_placements": placed, "first_fit_placements": ff_placed},
        {"engine_cycle_cpu_s": engine_cpu, "first_fit_cpu_s": ff_cpu},
    )


def prefix_scenario(jobs: int, where: Path) -> Path | None:
    """examples/sim/philly.yaml cut to its first ``jobs`` jobs, written under ``where``; None
    when the trace is absent."""
    import yaml

    raw = yaml.safe_load(PHILLY.read_text(encoding="utf-8"))
    philly = raw["spec"]["workload"]["philly"]
    data = (PHILLY.parent / philly["path"]).resolve()
    if not data.is_file():
        print(f"replay: skipped: {data} is absent (../shared/data holds the Philly trace)")
        return None
    philly.update(path=str(data), maxJobs=jobs)
    out = where / f"philly-first-{jobs}.yaml"
    out.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return out


def measure_replay(
    jobs: int, calibration_cpu: float
) -> tuple[dict[str, float], dict[str, Any], dict[str, float]]:
    """gpupool and FIFO first-fit on the first ``jobs`` Philly jobs."""
    with tempfile.TemporaryDirectory() as tmp:
        path = prefix_scenario(jobs, Path(tmp))
        if path is None:
            return {}, {}, {}
        from gpupool.sim.scenario import load_scenario
        from gpupool.sim.simulator import simulate

        sc = load_scenario(path)
        fifo, ours = [], []
        for _ in range(REPLAY_REPEATS):  # alternately, so a burst of load hits both sides
            fifo.append(_cpu(lambda: simulate(sc, "fifo-first-fit", sc.variants[0]))[0])
            cpu, r = _cpu(lambda: simulate(sc, "gpupool", sc.variants[0]))
            ours.append(cpu)
        fifo_cpu, ours_cpu = min(fifo), min(ours)
    h = hashlib.md5()  # bench/fingerprint.py's digest, over this prefix
    for j in r.jobs:
        h.update(f"{j.spec.name}:{j.first_start}:{j.finish}:{j.preempted}\n".encode())
    return (
        {
            "replay_gpupool_vs_fifo": ours_cpu / fifo_cpu,
            "replay_gpupool_vs_calibration": ours_cpu / calibration_cpu,
        },
        {"replay_jobs": jobs, "replay_fingerprint": h.hexdigest()[:10]},
        {"replay_gpupool_cpu_s": ours_cpu, "replay_fifo_cpu_s": fifo_cpu},
    )


def child_cpu(argv: list[str], expect: int) -> float:
    """The least CPU seconds (user + system) of ``argv`` run as a child, ``CLI_RUNS`` times."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    runs = []
    with tempfile.TemporaryDirectory() as cwd:  # no ./.gpupool to read a token or config from
        for _ in range(CLI_RUNS):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            rc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True).returncode
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if rc != expect:
                raise SystemExit(f"error: {' '.join(argv)} exited {rc}, expected {expect}")
            runs.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(runs)


def measure_cli() -> tuple[dict[str, float], dict[str, Any], dict[str, float]]:
    """``gpupool --version`` and a ``gpupool get`` that is refused at once (nothing listens on
    port 9: the whole client path without a server's time), against ``python -c pass``."""
    py = sys.executable
    gp = str(Path(py).parent / "gpupool")
    bare = child_cpu([py, "-c", "pass"], 0)
    version = child_cpu([gp, "--version"], 0)
    get = child_cpu([gp, "get", "workloads", "--server", "http://127.0.0.1:9", "--token", "t"], 1)
    return (
        {"cli_version_vs_python_start": version / bare, "cli_get_refused_vs_python_start": get / bare},
        {},
        {"python_start_cpu_s": bare, "cli_version_cpu_s": version, "cli_get_refused_cpu_s": get},
    )


def measure(jobs: int) -> dict[str, Any]:
    """Every figure of one run: the ratios compared, the decisions, the CPU seconds behind them."""
    ratios: dict[str, float] = {}
    facts: dict[str, Any] = {}
    cpu: dict[str, float] = {}
    calibration, _ = _least_cpu(_calibration_loop)
    cpu["calibration_cpu_s"] = calibration
    for step, run in (
        ("engine", measure_engine),
        ("replay", lambda: measure_replay(jobs, calibration)),
        ("cli", measure_cli),
    ):
        print(f"{step} ...", flush=True)
        r, f, c = run()
        ratios.update(r)
        facts.update(f)
        cpu.update(c)
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run([*git, "status", "--porcelain", "--", "src"], capture_output=True, text=True)
    return {
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "decisions": facts,
        "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
        "taken": {
            # the code measured: a commit, and whether src/ had changes not in it (or no git)
            "commit": commit.stdout.strip() or "unknown",
            "src_modified": bool(changed.stdout.strip()) or changed.returncode != 0,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(),
            "engine_size": ENGINE_SIZE,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="Philly prefix length")
    ap.add_argument("--tolerance", type=float, default=None, help="default: the baseline's")
    ap.add_argument("--update", action="store_true", help="write this run as bench/baseline.json")
    args = ap.parse_args(argv)
    now = measure(args.jobs)
    print(json.dumps({k: now[k] for k in ("cpu_seconds", "taken")}))
    load, cpus = now["taken"]["load_average"][0], now["taken"]["cpus"] or 1
    if load > cpus:
        print(
            f"note: load {load} on {cpus} CPUs: at about five times the CPUs a ratio moved by up "
            "to 25% between two runs of the same code; rerun before believing a move"
        )
    if args.update:
        now["tolerance"] = args.tolerance if args.tolerance is not None else DEFAULT_TOLERANCE
        BASELINE.write_text(json.dumps(now, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {BASELINE.relative_to(REPO)}")
        return 0
    if not BASELINE.is_file():
        print(f"error: no {BASELINE.relative_to(REPO)}: run with --update to take one")
        return 2
    base = json.loads(BASELINE.read_text(encoding="utf-8"))
    tolerance = args.tolerance if args.tolerance is not None else float(base["tolerance"])
    if base.get("decisions", {}).get("replay_jobs") not in (None, now["decisions"].get("replay_jobs")):
        print(f"note: the baseline replayed {base['decisions']['replay_jobs']} jobs, this run {args.jobs}")
    print(f"against the baseline of {base['taken']['commit']} ({base['taken']['date']}):")
    lines, worse = compare(base["ratios"], now["ratios"], tolerance)
    for line in [*lines, *changed_facts(base.get("decisions", {}), now["decisions"])]:
        print(f"  {line}")
    if worse:
        print(f"FAIL: {', '.join(worse)} more than {tolerance:.0%} above the baseline")
        return 1
    print(f"ok: no ratio more than {tolerance:.0%} above the baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
