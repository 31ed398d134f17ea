"""``gpupool bench kube``: what the Kubernetes adapter costs on top of the engine.

How it is measured (issue 12's benchmark, not a timed test):

* the fake API server (``gpupool.kube.fake``) runs in this process with ``--nodes`` nodes of 8
  GPUs; ``gpupool serve --backend kubernetes`` runs in a **subprocess** against it over HTTP (a
  real server, so it can be killed with SIGKILL);
* ``--jobs`` Jobs of ``--pods`` one-GPU pods, Kueue-style (queue label, ``suspend: true``), are
  created at once through the fake server's in-process ``create`` (the client's cost is not the
  scheduler's); the pods run far longer than the benchmark;
* reported: seconds from the last create until every admissible pod is bound (whole gangs that
  fit in the GPUs), binds per second over that time, API requests per bind (every request the
  fake server answered in the phase, the informers' lists and watches included), and the CPU
  seconds of each process: the fake server (this process) and the gpupool server apart, so the
  adapter's own cost per bind reads the same on an idle or a busy machine;
* restart: with the cluster full, the server is killed with SIGKILL, two empty nodes are added
  (so there is something to bind) and a new server is started: restart-to-first-bind is from
  spawning it to the first new pod bound, as observed on the fake server (the servers run with
  gpupool's bytecode compiled, as an installed package has it: ``server_env``);
* the same workloads through the virtual backend, in-process (engine, controller, store), so the
  difference is the adapter: seconds until the same number of workloads is admitted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

from gpupool.bench.serving import API, LABELS, QUEUE, compile_bytecode, config_dir, kill, serve, wait_ready


def job(i: int, pods: int) -> dict[str, Any]:
    """A Kueue-style Job of ``pods`` one-GPU pods that run for ten hours."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"bench-{i:05d}",
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": QUEUE},
        },
        "spec": {
            "suspend": True,
            "parallelism": pods,
            "completions": pods,
            "template": {
                "metadata": {"annotations": {"fake.gpupool.io/run-seconds": "36000"}},
                "spec": {
                    "schedulerName": "gpupool",
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "bench",
                            "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": "1", "memory": "1Gi"}},
                        }
                    ],
                },
            },
        },
    }


def _wait_binds(
    srv: Any, target: int, stall_s: float, deadline_s: float, first: list[float] | None = None
) -> tuple[int, float]:
    """Poll the fake server's bind counter until ``target`` (or no progress for ``stall_s``);
    (binds, when the last one was seen). ``first`` receives when the first new one was seen."""
    t0 = time.monotonic()
    last, last_at, at_target = srv.stats.binds, t0, None
    while True:
        time.sleep(0.05)
        n = srv.stats.binds
        now = time.monotonic()
        if n != last:
            if first is not None and not first:
                first.append(now)
            last, last_at = n, now
        if n >= target:
            at_target = now
            break
        if now - last_at > stall_s or now - t0 > deadline_s:
            break
    return last, (at_target or last_at)


def _first_bind_logged(log: Path, offset: int = 0, wait_s: float = 0.0) -> float | None:
    """The server's own figure (``first bind N s after process start``) from the lines written
    after ``offset`` (the log's size when that server was spawned: the servers share one log,
    and the previous server's line is not this one's), waiting up to ``wait_s`` for it."""
    end = time.monotonic() + wait_s
    while True:
        with log.open("rb") as f:
            f.seek(offset)
            got = _last_first_bind(f.read().decode(errors="replace"))
        if got is not None or time.monotonic() >= end:
            return got
        time.sleep(0.1)


def _last_first_bind(text: str) -> float | None:
    got = None
    for line in text.splitlines():
        if "first bind" in line and "after process start" in line:
            try:
                got = float(line.split("first bind", 1)[1].split()[0])
            except (ValueError, IndexError):
                continue
    return got


def run_kube(nodes: int, jobs: int, pods: int, work: Path, say: Any = lambda msg: None) -> dict[str, Any]:
    """The Kubernetes phase: bind everything admissible, then kill -9 and restart."""
    from gpupool.kube.fake import FakeApiServer

    srv = FakeApiServer(history_size=max(10_000, jobs * pods * 8), bookmark_interval_s=1.0)
    srv.add_gpu_nodes(nodes, labels=LABELS)
    srv.start(port=0)
    kc = srv.write_kubeconfig(work / "kubeconfig")
    cfg, log, state = config_dir(work, nodes, cluster=False), work / "serve.log", work / "state"
    procs: list[subprocess.Popen[bytes]] = []
    compile_bytecode(work)
    try:
        proc, port = serve(kc, state, cfg, log)
        procs.append(proc)
        wait_ready(proc, port, log)
        say(f"kubernetes: server up; creating {jobs} Jobs x {pods} pods")
        prof = _profile(proc.pid, work / "bind-profile.txt")
        out = _bind_phase(srv, nodes, jobs, pods, proc.pid)
        if prof is not None:
            prof.send_signal(signal.SIGINT)
            prof.wait(60)
        say(f"kubernetes: {out['bound']} pods bound in {out['seconds']:.1f}s; kill -9 and restart")
        kill(proc)
        out["restart"] = _restart_phase(srv, kc, state, cfg, log, procs)
        out["violations"] = len(srv.stats.violations)
    finally:
        for p in procs:
            kill(p, signal.SIGTERM)
        srv.stop()
    return out


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of a process (this one when None) so far."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _bind_phase(srv: Any, nodes: int, jobs: int, pods: int, server_pid: int) -> dict[str, Any]:
    """Create every Job at once; until every admissible pod is bound (where the CPU went too)."""
    req0, binds0 = dict(srv.stats.requests), srv.stats.binds
    cpu0 = (_cpu_s(), _cpu_s(server_pid))
    t0 = time.monotonic()
    for i in range(jobs):
        srv.create(job(i, pods))
    created = time.monotonic()
    admissible = min(jobs, nodes * 8 // pods) * pods
    first: list[float] = []
    n, done = _wait_binds(srv, binds0 + admissible, stall_s=60.0, deadline_s=3600.0, first=first)
    bound = n - binds0
    cpu = {"fake_api_server_and_bench": _cpu_s() - cpu0[0], "gpupool_server": _cpu_s(server_pid) - cpu0[1]}
    reqs = {k: v - req0.get(k, 0) for k, v in srv.stats.requests.items() if v - req0.get(k, 0)}
    total = sum(reqs.values())
    return {
        "nodes": nodes,
        "jobs": jobs,
        "pods": jobs * pods,
        "admissible": admissible,
        "bound": bound,
        "create_seconds": created - t0,
        "first_bind_s": first[0] - t0 if first else None,
        "seconds": done - t0,
        "binds_per_s": bound / (done - t0) if done > t0 else 0.0,
        "requests": total,
        "requests_per_bind": total / bound if bound else 0.0,
        "top_requests": dict(sorted(reqs.items(), key=lambda kv: -kv[1])[:6]),
        "cpu_seconds": cpu,
        # the adapter's own cost, whatever else the machine runs: CPU of the gpupool server per bind
        "gpupool_cpu_ms_per_bind": 1000 * cpu["gpupool_server"] / bound if bound else 0.0,
    }


def _restart_phase(
    srv: Any, kc: Path, state: Path, cfg: Path, log: Path, procs: list[subprocess.Popen[bytes]]
) -> dict[str, Any]:
    """Cluster full, server killed: two empty nodes appear, a new server starts; until its first bind."""
    srv.add_gpu_nodes(2, prefix="spare", labels=LABELS)
    b0 = srv.stats.binds
    offset = log.stat().st_size if log.exists() else 0
    t0 = time.monotonic()
    proc, _ = serve(kc, state, cfg, log)
    procs.append(proc)
    dumps = _stack_dumps(proc, log.parent / "restart-stacks.txt")
    n, at = _wait_binds(srv, b0 + 1, stall_s=600.0, deadline_s=600.0)
    if dumps is not None:
        dumps.set()
    return {
        "to_first_bind_s": at - t0 if n > b0 else None,
        "server_logged_s": _first_bind_logged(log, offset, wait_s=10.0) if n > b0 else None,
    }


def _py_spy() -> str | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return spy if Path(spy).exists() else None


def _profile(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """With ``GPUPOOL_BENCH_PROFILE=1`` and py-spy installed: sample the server during the bind
    phase into ``out`` (collapsed stacks of the thread holding the GIL, so the samples are where
    its CPU goes, not where threads wait; diagnostics, off by default)."""
    spy = _py_spy()
    if not os.environ.get("GPUPOOL_BENCH_PROFILE") or spy is None:
        return None
    cmd = [spy, "record", "--pid", str(pid), "--format", "raw", "--gil", "-r", "100", "-o", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stack_dumps(proc: subprocess.Popen[bytes], out: Path) -> Any:
    """Where the restarted server spends its time: with ``GPUPOOL_BENCH_STACKS=1`` and py-spy
    installed, its threads' stacks every 2 s until the first bind (diagnostics, off by default)."""
    import threading

    spy = _py_spy()
    if not os.environ.get("GPUPOOL_BENCH_STACKS") or spy is None:
        return None
    done = threading.Event()

    def loop() -> None:
        t0 = time.monotonic()
        with out.open("a") as f:
            while not done.wait(2.0):
                r = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True)
                f.write(f"==== {time.monotonic() - t0:.1f} s after spawn\n{r.stdout}{r.stderr}\n")

    threading.Thread(target=loop, daemon=True).start()
    return done


def _workload(i: int, pods: int) -> dict[str, Any]:
    """The same work as ``job(i, pods)``, as a gpupool manifest (for the virtual backend)."""
    res = {"nvidia.com/gpu": 1, "cpu": 1, "memory": "1Gi"}
    return {
        "apiVersion": API,
        "kind": "Workload",
        "metadata": {"name": f"bench-{i:05d}"},
        "spec": {
            "queue": QUEUE,
            "duration": "10h",
            "podGroups": [{"name": "main", "replicas": pods, "resources": res}],
        },
    }


def run_virtual(nodes: int, jobs: int, pods: int, work: Path) -> dict[str, Any]:
    """The same workloads through the virtual backend in-process: submit all, until admitted."""
    from fastapi.testclient import TestClient

    from gpupool.kube.wiring import ServiceSubmitter
    from gpupool.service.api import create_app
    from gpupool.service.config import ServiceConfig

    cfg = ServiceConfig(
        state_dir=work / "virtual",
        config_dir=config_dir(work, nodes, cluster=True),
        tick_s=0.2,
        min_interval_s=0.0,
    )
    app = create_app(cfg)
    admissible = min(jobs, nodes * 8 // pods)
    with TestClient(app):
        svc = app.state.svc
        sub = ServiceSubmitter(svc)
        t0 = time.monotonic()
        for k in range(0, jobs, 500):
            sub.submit_many([_workload(i, pods) for i in range(k, min(jobs, k + 500))])
        submitted = time.monotonic()
        last, last_at = -1, submitted
        while True:
            counts = svc.store.phase_counts()
            n = counts.get("Admitted", 0) + counts.get("Running", 0)
            now = time.monotonic()
            if n != last:
                last, last_at = n, now
            if n >= admissible or now - last_at > 30:
                break
            time.sleep(0.05)
    seconds = last_at - t0
    return {
        "admissible_workloads": admissible,
        "admitted_workloads": last,
        "pods": last * pods,
        "submit_seconds": submitted - t0,
        "seconds": seconds,
        "pods_per_s": last * pods / seconds if seconds > 0 else 0.0,
    }


def run_bench(
    nodes: int, jobs: int, pods: int, say: Any = lambda msg: None, keep: Path | None = None
) -> dict[str, Any]:
    """Both phases; ``keep``: a directory to leave the servers' logs and state in."""
    work = keep or Path(tempfile.mkdtemp(prefix="gpupool-bench-kube-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        kube = run_kube(nodes, jobs, pods, work, say)
        say("virtual backend: the same workloads")
        virtual = run_virtual(nodes, jobs, pods, work)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return {"kubernetes": kube, "virtual": virtual, "load_average_1m": load, "cpus": os.cpu_count()}


def format_result(r: dict[str, Any]) -> str:
    k, v, rs = r["kubernetes"], r["virtual"], r["kubernetes"]["restart"]
    first = rs["to_first_bind_s"]
    top = ", ".join(f"{n} {c}" for n, c in k["top_requests"].items())
    return (
        f"fake API server, {k['nodes']} nodes x 8 GPUs; {k['jobs']} Jobs x {k['pods'] // max(1, k['jobs'])} pods"
        f" ({k['pods']} pods, {k['admissible']} admissible); {r['cpus']} CPUs, load average {r['load_average_1m']:.1f}\n"
        f"  kubernetes : {k['bound']} pods bound in {k['seconds']:.1f} s (creates took {k['create_seconds']:.1f} s)"
        f" -> {k['binds_per_s']:.0f} binds/s; first bind after {k['first_bind_s'] or 0:.1f} s;"
        f" {k['requests_per_bind']:.2f} API requests per bind\n"
        f"               requests: {top}\n"
        f"               CPU: fake API server (and this bench) {k['cpu_seconds']['fake_api_server_and_bench']:.1f} s,"
        f" gpupool server {k['cpu_seconds']['gpupool_server']:.1f} s"
        f" ({k['gpupool_cpu_ms_per_bind']:.2f} ms per bind: {1000 / max(k['gpupool_cpu_ms_per_bind'], 1e-9):.0f}"
        f" binds per CPU-second)\n"
        f"  restart    : kill -9 with the cluster full, then first bind {first if first is None else f'{first:.1f}'} s"
        f" after spawning the new server (its own log: {rs['server_logged_s']} s); violations {k['violations']}\n"
        f"  virtual    : {v['admitted_workloads']} workloads ({v['pods']} pods) admitted in {v['seconds']:.1f} s"
        f" -> {v['pods_per_s']:.0f} pods/s (submits took {v['submit_seconds']:.1f} s)\n"
        f"  targets    : >= 500 binds/s {'met' if k['binds_per_s'] >= 500 else 'NOT met'};"
        f" restart-to-first-bind < 10 s {'met' if first is not None and first < 10 else 'NOT met'}\n"
    )


def bench_kube_command(
    nodes: int | None = typer.Option(
        None, "--nodes", min=1, help="nodes of 8 GPUs (default 100; with --versus the case's own)"
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", min=1, help="Jobs created at once (default 200; with --versus the case's own)"
    ),
    pods: int = typer.Option(5, "--pods", min=1, help="one-GPU pods per Job"),
    output: str = typer.Option("table", "-o", "--output", help="table or json"),
    keep: Path | None = typer.Option(
        None, "--keep", help="leave the servers' logs and state in this directory"
    ),
    chaos: float | None = typer.Option(
        None,
        "--chaos",
        min=1.0,
        help="seconds of faults while work flows (gpupool.bench.chaos); exit 1 unless all 0",
    ),
    seed: int = typer.Option(1, "--seed", help="the chaos run's fault schedule"),
    versus: str | None = typer.Option(
        None, "--versus", help="kueue: the same Jobs on real clusters, Kueue + kube-scheduler against gpupool"
    ),
    case: list[str] | None = typer.Option(
        None, "--case", help="with --versus: cohort-borrowing, reclaim or gang (repeatable; default all)"
    ),
) -> None:
    """Binds/s, API requests per bind and restart-to-first-bind against the fake API server,
    beside the same workloads through the virtual backend; or, with ``--chaos``, the faults run."""
    say = (lambda msg: None) if output == "json" else (lambda msg: typer.echo(msg, err=True))
    if chaos is not None:
        from gpupool.bench.chaos import COUNTS, format_chaos, run_chaos

        c = run_chaos(chaos, seed=seed, say=say)
        sys.stdout.write(json.dumps(c, indent=2) + "\n" if output == "json" else format_chaos(c))
        raise typer.Exit(1 if any(c[k] for k in COUNTS) else 0)
    if versus is not None:
        if versus != "kueue":
            raise typer.BadParameter("only 'kueue' is offered", param_hint="--versus")
        from gpupool.bench.kueue_versus import format_versus, run_versus, select_cases

        try:
            select_cases(case)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--case") from None
        v = run_versus(nodes, jobs, say, keep, case)
        sys.stdout.write(json.dumps(v, indent=2) + "\n" if output == "json" else format_versus(v))
        return
    r = run_bench(nodes or 100, jobs or 200, pods, say, keep)
    if output == "json":
        sys.stdout.write(json.dumps(r, indent=2) + "\n")
        return
    sys.stdout.write(format_result(r))


__all__ = ["bench_kube_command", "run_bench"]
