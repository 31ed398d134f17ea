"""The local backend: real processes on this host, one process group per pod.

Why it keeps its own state file: pods outlive the controller. Every run is written down (the
file replaced atomically, as the virtual backend does) *before* its processes start, and again
with their pids and start times once they run; a restarted backend adopts them from there
(``local_process`` says why the start time guards against reused pids), reports a pod that
ended meanwhile with the status its wrapper recorded, and never starts a name twice. A start
interrupted between the two writes is found by the pid file each wrapper writes first; a run
whose pods did not all start is killed and dropped, so the controller requeues it as lost.

The verbs follow ``Backend``: ``start`` starts each pod with ``CUDA_VISIBLE_DEVICES`` set to its
devices (UUIDs; indexes of fake devices) and a gang's pods together with torchrun's variables;
``stop`` sends SIGTERM to each pod's group and SIGKILL after ``grace_s`` (from ``poll``, so the
controller never waits); ``poll`` turns exits into outcomes (``local_process.ending``). A
request the host cannot honour (a fractional GPU without isolation, a missing working
directory, a pod group with nothing to run) is refused by ``start`` with the reason, which the
controller records as the workload's failure.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.discovery.nvml import Device, Discovery, StaticDiscovery, discover
from gpupool.model import Node
from gpupool.service.backends import BackendError, BackendHealth, Capability, PodCommand, RunSpec, RunState
from gpupool.service.backends import local_host as host
from gpupool.service.backends import local_process as proc
from gpupool.service.backends.local_mps import MpsControl, fraction_refusal
from gpupool.service.backends.run_logs import FileLogs

if TYPE_CHECKING:
    import subprocess

    from gpupool.service.core import Service

log = logging.getLogger(__name__)
STATE_FILE = "local-backend.json"


class LocalBackend:
    """Runs workloads as processes on this host; see the module docstring."""

    name = "local"
    capabilities = frozenset(
        {
            Capability.RELOAD,
            Capability.BIND,
            Capability.NEXT_FINISH,
            Capability.RUN_LOGS,
            Capability.NEEDS_COMMANDS,
        }
    )
    #: the controller fills RunSpec.commands for this backend (it runs what the pod groups say)
    needs_commands = True
    #: after an interrupted start, how long to wait for a just-spawned wrapper's pid file
    PID_FILE_WAIT_S = 2.0

    def __init__(
        self,
        state_dir: str | Path | None = None,
        devices: Discovery | Sequence[Device] | None = None,
        *,
        fake_gpus: str | None = None,
        allow_unenforced: bool = False,
        grace_s: float = 10.0,
        health_interval_s: float = 5.0,
        node: str | None = None,
        mps: MpsControl | None = None,
        clock: Callable[[], float] = time.time,
        state_file: str | Path | None = None,
        **_other_backends: Any,
    ) -> None:
        """``devices``: a Discovery, a list of devices, or None (``fake_gpus`` if given, else NVML,
        else none). ``state_file`` (the virtual backend's option, as ``create_app`` passes it):
        its directory is the state directory when ``state_dir`` is not given; options of other
        backends (time scale, injected failures) do not apply to real processes and are ignored."""
        if state_dir is None:
            state_dir = Path(state_file).parent if state_file is not None else Path(".gpupool")
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / STATE_FILE
        #: each attempt's output, where ``_launch`` writes it (the logs API reads it from here)
        self.run_logs = FileLogs(self.state_dir / "runs")
        if devices is None:
            self.discovery: Discovery = discover(fake_gpus)
        elif isinstance(devices, Sequence):
            self.discovery = StaticDiscovery(list(devices), any(d.fake for d in devices))
        else:
            self.discovery = devices
        self.devices = {d.index: d for d in self.discovery.devices()}
        self.node = node or host.node_name()
        self.allow_unenforced = allow_unenforced
        self.grace_s = grace_s
        self.clock = clock
        self.mps = mps or MpsControl(self.state_dir / "mps")
        self.refusal = fraction_refusal(self.discovery.fake, self.mps.available, allow_unenforced)
        self.health_watch = host.HealthWatch(self.node, self.discovery.refresh, health_interval_s)
        self._lock = threading.Lock()
        self._nodes: set[str] = set()
        self._runs: dict[str, dict[str, Any]] = {}
        #: how many times each workload was started, ever (evidence that nothing ran twice)
        self.starts: dict[str, int] = {}
        #: stopped pods' groups waiting for SIGKILL: {"pgid", "ticks", "killAt"}
        self._stopping: list[dict[str, Any]] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._load()

    # -- persistence --------------------------------------------------------------------------
    def _load(self) -> None:
        data = proc.read_json(self.path) or {}
        self._runs = data.get("runs", {})
        self.starts = data.get("starts", {})
        self._stopping = data.get("stopping", [])
        changed = False
        for name in [n for n, r in self._runs.items() if r.get("phase") == "starting"]:
            changed |= self._finish_interrupted_start(name)
        if changed:
            self._save()

    def reload(self) -> None:
        """Re-read the state file (a standby taking over finds the pods as the leader left them)."""
        with self._lock:
            self._load()

    def _save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        data = {"runs": self._runs, "starts": self.starts, "stopping": self._stopping}
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _finish_interrupted_start(self, name: str) -> bool:
        """A run saved as starting: adopt its pods from their pid files, or undo the start."""
        r = self._runs[name]
        deadline = time.monotonic() + self.PID_FILE_WAIT_S
        for p in r["pods"]:
            while p.get("pid") is None:
                if pid := proc.read_json(Path(p["dir"]) / "pid.json"):
                    p["pid"], p["ticks"] = pid.get("pid"), pid.get("ticks")
                elif time.monotonic() >= deadline:
                    break  # never spawned: no wrapper will write it
                else:
                    time.sleep(0.02)  # spawned a moment ago: its wrapper writes it within ms
        if all(p.get("pid") is not None for p in r["pods"]):
            r["phase"] = "running"
            return True
        for p in r["pods"]:  # some pod never started: no half gang runs; the controller requeues it
            if proc.alive(p.get("pid"), p.get("ticks")):
                proc.signal_group(int(p["pid"]), signal.SIGKILL)
        del self._runs[name]
        log.warning("dropped %s: its start was interrupted before every pod ran", name)
        return True

    # -- this host ----------------------------------------------------------------------------
    def isolation(self) -> str:
        """How fractional GPUs run here: ``mps``, ``unenforced`` or ``refused``."""
        if self.refusal:
            return "refused"
        return "mps" if self.mps.available and not self.discovery.fake else "unenforced"

    def cluster_manifest(self) -> dict[str, Any]:
        """This host as the Cluster object ``local`` (gpupool serve seeds and syncs it)."""
        cpu, mem = host.host_resources()
        devs = [self.devices[i] for i in sorted(self.devices)]
        return host.cluster_manifest(self.node, devs, self.discovery.fake, cpu, mem, self.isolation())

    def bind(self, svc: Service) -> None:
        """Start reading device health; a device NVML reports broken is marked unhealthy."""
        self.health_watch.start(svc)

    def close(self) -> None:
        self.health_watch.stop()

    # -- the Backend protocol -----------------------------------------------------------------
    def set_nodes(self, nodes: Sequence[Node]) -> None:
        with self._lock:
            self._nodes = {n.name for n in nodes}

    def start(self, runs: Sequence[RunSpec]) -> None:
        refused: list[str] = []
        with self._lock:
            for spec in runs:
                if spec.name in self._runs:
                    continue  # idempotent: running, or finished and not yet forgotten
                why = self._refusal(spec)
                if not why:
                    why = self._launch(spec)
                if why:
                    refused.append(f"{spec.name}: {why}")
        if refused:
            raise BackendError("; ".join(refused))

    def stop(self, names: Sequence[str]) -> None:
        with self._lock:
            hit = [n for n in names if n in self._runs]
            for n in hit:
                self._terminate_pods(self._runs.pop(n))
            if hit:
                self._save()

    def poll(self, now: float) -> list[RunState]:
        with self._lock:
            changed = self._kill_stragglers(now)
            for name, r in self._runs.items():
                if r["phase"] == "running":
                    changed |= self._check_run(name, r)
            if changed:
                self._save()
            return [self._state(n, r) for n, r in self._runs.items() if r["phase"] == "finished"]

    def forget(self, names: Sequence[str]) -> None:
        with self._lock:
            hit = [n for n in names if n in self._runs and self._runs[n]["phase"] == "finished"]
            for n in hit:
                del self._runs[n]
            if hit:
                self._save()

    def runs(self) -> dict[str, RunState]:
        with self._lock:
            return {n: self._state(n, r) for n, r in self._runs.items()}

    def health(self) -> BackendHealth:
        with self._lock:
            detail: dict[str, Any] = {
                "backend": self.name,
                "node": self.node,
                "runs": len(self._runs),
                "stopping": len(self._stopping),
                "gpus": self.discovery.describe(),
                "fakeGpus": self.discovery.fake,
                "fractionalGpus": self.isolation(),
                "mps": self.mps.describe(),
            }
        if self.refusal:
            detail["fractionalRefusal"] = self.refusal
        if self.isolation() == "unenforced":
            detail["warning"] = "fractional GPUs run WITHOUT isolation (--allow-unenforced)"
        return BackendHealth(True, detail)

    def next_finish(self) -> float | None:
        """When the next stopped pod is due its SIGKILL (the controller wakes for it)."""
        with self._lock:
            due = [float(s["killAt"]) for s in self._stopping]
        return min(due) if due else None

    # -- logs ---------------------------------------------------------------------------------
    def log_path(self, name: str, pod: int = 0) -> Path | None:
        """The log of pod ``pod`` (its rank) of the workload's latest run, None if there is none."""
        for a in reversed(self.run_logs.attempts(name)):
            if pod in a.pods:
                return self.run_logs.path(name, a.attempt, pod)
        return None

    def log_pods(self, name: str) -> list[int]:
        """The ranks that have a log in the workload's latest run."""
        attempts = self.run_logs.attempts(name)
        return list(attempts[-1].pods) if attempts else []

    # -- starting -----------------------------------------------------------------------------
    def _refusal(self, spec: RunSpec) -> str:
        """Why this run cannot start on this host ('' when it can)."""
        bad: list[str] = []
        use = self._device_use()
        # device health is the controller's to judge (an operator may put a device NVML
        # reported back in service): broken devices reach it as marks, never as refusals here
        for p in spec.placement.get("pods", ()):
            if p["node"] != self.node:
                bad.append(f"node {p['node']} is not this host ({self.node})")
                continue
            milli = int(p.get("gpuMilli", 1000))
            for d in p.get("devices", ()):
                if d not in self.devices:
                    bad.append(f"device {d} does not exist on {self.node}")
                elif use.get(d, 0) + milli > 1000:
                    bad.append(f"device {d} is already fully allocated")
            if p.get("devices") and milli < 1000 and self.refusal:
                bad.append(self.refusal)
            cmd = self._command(spec, str(p.get("group", "main")))
            if isinstance(cmd, str):
                bad.append(cmd)
            elif cmd.working_dir and not Path(cmd.working_dir).is_dir():
                bad.append(f"pod group {p.get('group')}: workingDir {cmd.working_dir} is not a directory")
        return "; ".join(dict.fromkeys(bad))

    def _command(self, spec: RunSpec, group: str) -> PodCommand | str:
        """The pod group's command, a stand-in that sleeps for the declared duration, or why not."""
        cmd = spec.commands.get(group)
        if cmd is not None and cmd.command:
            return cmd
        if cmd is not None and cmd.args:
            return PodCommand(cmd.args, (), cmd.env, cmd.working_dir)
        if spec.duration_s is not None:
            stand_in = ("sleep", f"{spec.duration_s:g}")
            return PodCommand(stand_in, (), cmd.env if cmd else {}, cmd.working_dir if cmd else None)
        return (
            f"pod group {group} declares nothing to run: set spec.podGroups[].command "
            "(or spec.duration, to run a stand-in that sleeps that long)"
        )

    def _device_use(self) -> dict[int, int]:
        use: dict[int, int] = {}
        for r in self._runs.values():
            if r["phase"] == "finished":
                continue
            for p in r["placement"].get("pods", ()):
                for d in p.get("devices", ()):
                    use[d] = use.get(d, 0) + int(p.get("gpuMilli", 1000))
        return use

    def _launch(self, spec: RunSpec) -> str:
        """Write the run down, then start its pods; '' when all started, else why not."""
        attempt = self.starts.get(spec.name, 0) + 1
        run_dir = self.run_logs.root / spec.name / str(attempt)
        pods = list(spec.placement.get("pods", ()))
        rec: dict[str, Any] = {
            "attempt": attempt,
            "placement": dict(spec.placement),
            "started_at": self.clock(),
            "duration_s": spec.duration_s,
            "phase": "starting",
            "masterPort": proc.free_port(),
            "pods": [
                {
                    "rank": k,
                    "group": str(p.get("group", "main")),
                    "index": int(p.get("index", k)),
                    "dir": str(run_dir / f"pod-{k}"),
                    "log": str(run_dir / f"pod-{k}.log"),
                    "pid": None,
                    "ticks": None,
                }
                for k, p in enumerate(pods)
            ],
        }
        self.starts[spec.name] = attempt
        self._runs[spec.name] = rec
        self._save()  # write-ahead: a kill -9 from here on finds the run (and its pid files)
        try:
            for k, p in enumerate(pods):
                child = proc.spawn(self._pod_launch(spec, rec, p, k))
                self._procs[child.pid] = child
                rec["pods"][k].update(pid=child.pid, ticks=proc.start_ticks(child.pid))
        except OSError as exc:
            self._terminate_pods(rec, grace=False)
            del self._runs[spec.name]
            self._save()
            return f"could not start its processes: {exc}"
        rec["phase"] = "running"
        self._save()
        return ""

    def _pod_launch(
        self, spec: RunSpec, rec: Mapping[str, Any], p: Mapping[str, Any], rank: int
    ) -> proc.Launch:
        cmd = self._command(spec, str(p.get("group", "main")))
        assert isinstance(cmd, PodCommand) and cmd.command  # _refusal checked it
        devs = [self.devices[d] for d in p.get("devices", ())]
        milli = int(p.get("gpuMilli", 1000))
        world = len(rec["pods"])
        env = proc.base_env(cmd.env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(d.visible_id for d in devs),
                "WORLD_SIZE": str(world),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),  # one host: every pod is local
                "LOCAL_WORLD_SIZE": str(world),
                "NODE_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(rec["masterPort"]),
                "GPUPOOL_WORKLOAD": spec.name,
                "GPUPOOL_POD": f"{p.get('group', 'main')}-{p.get('index', rank)}",
                "GPUPOOL_ATTEMPT": str(rec["attempt"]),
            }
        )
        if devs and milli < 1000:
            env.update(self._fraction_env(devs[0], milli, int(p.get("gpuMemoryMiB", 0))))
        pod = rec["pods"][rank]
        mem = int(p.get("memoryMiB", 0))
        # CPU-only pods get their memory as an address-space limit; GPU pods cannot (CUDA
        # reserves far more address space than it uses), their memory is accounted only
        rlimit = mem << 20 if mem and not devs else None
        return proc.Launch(
            (*cmd.command, *cmd.args), env, cmd.working_dir, Path(pod["dir"]), Path(pod["log"]), rlimit
        )

    def _fraction_env(self, dev: Device, milli: int, mem_mib: int) -> dict[str, str]:
        limit = mem_mib or dev.memory_mib * milli // 1000
        if self.isolation() == "mps":
            why = self.mps.ensure_running()
            if why:
                raise OSError(f"the CUDA MPS control daemon is not running: {why}")
            return {**self.mps.client_env(milli, limit), "GPUPOOL_GPU_ISOLATION": "mps"}
        log.warning("a fractional pod runs on device %d WITHOUT isolation (--allow-unenforced)", dev.index)
        return {"GPUPOOL_GPU_ISOLATION": "none (--allow-unenforced: nothing limits this pod)"}

    # -- watching and stopping ----------------------------------------------------------------
    def _reap(self) -> None:
        for pid, child in list(self._procs.items()):
            if child.poll() is not None:
                del self._procs[pid]

    def _check_run(self, name: str, r: dict[str, Any]) -> bool:
        """Record pods that ended; finish the run when one failed or all succeeded."""
        self._reap()
        changed = False
        for p in r["pods"]:
            if not p.get("ended") and not proc.alive(p.get("pid"), p.get("ticks")):
                p["ended"] = True
                p["status"] = proc.read_json(Path(p["dir"]) / "exit.json")
                changed = True
        ends = [(p, proc.ending(p.get("status"))) for p in r["pods"] if p.get("ended")]
        failed = next(((p, e) for p, e in ends if not e.succeeded), None)
        if failed is not None:
            p, e = failed
            r["ended_at"] = _ended_at([p])
            self._terminate_pods(r)  # a gang fails as one: its other pods are stopped
            what = f"pod {p['rank']} ({p['group']}-{p['index']})" if len(r["pods"]) > 1 else "the pod"
            r.update(phase="finished", outcome="Failed", message=f"{what} {e.message}")
            r.update(exit_code=e.exit_code, reason=e.reason)
            return True
        if ends and len(ends) == len(r["pods"]):
            n = len(r["pods"])
            r.update(phase="finished", outcome="Succeeded", message=f"{n} of {n} pods exited with code 0")
            r["ended_at"] = _ended_at(r["pods"])
            return True
        return changed

    def _terminate_pods(self, r: Mapping[str, Any], grace: bool = True) -> None:
        """SIGTERM every live pod of a run now; SIGKILL follows after the grace period."""
        now = self.clock()
        for p in r["pods"]:
            if p.get("pid") is None:
                pid = proc.read_json(Path(p["dir"]) / "pid.json") or {}
                p["pid"], p["ticks"] = pid.get("pid"), pid.get("ticks")
            if p.get("ended") or not proc.alive(p.get("pid"), p.get("ticks")):
                continue
            pgid = int(p["pid"])
            proc.signal_group(pgid, signal.SIGTERM if grace else signal.SIGKILL)
            self._stopping.append(
                {"pgid": pgid, "ticks": p["ticks"], "killAt": now + (self.grace_s if grace else 0)}
            )

    def _kill_stragglers(self, now: float) -> bool:
        """SIGKILL the groups whose grace period is over; forget the groups that are gone."""
        self._reap()
        keep = []
        for s in self._stopping:
            if not proc.signal_group(int(s["pgid"]), 0):
                continue  # the whole group is gone
            if now >= float(s["killAt"]):
                # SIGKILL cannot be caught: the group is done (its processes may linger as
                # zombies until their parent reaps them, which is no longer this backend)
                proc.signal_group(int(s["pgid"]), signal.SIGKILL)
                continue
            keep.append(s)
        changed = len(keep) != len(self._stopping)
        self._stopping = keep
        return changed

    @staticmethod
    def _state(name: str, r: Mapping[str, Any]) -> RunState:
        failed = r.get("outcome") == "Failed"
        return RunState(
            name,
            r["placement"],
            float(r["started_at"]),
            r.get("duration_s"),
            r["phase"] == "finished",
            str(r.get("outcome", "")),
            str(r.get("message", "")),
            r.get("exit_code") if failed else None,
            str(r.get("reason", "")) if failed else "",
            r.get("ended_at"),
        )


def _ended_at(pods: Sequence[Mapping[str, Any]]) -> float | None:
    """The last of the pods' own exit times (their wrapper's ``finishedAt``); None when one is
    unknown (a wrapper killed before it could write it)."""
    times: list[float] = []
    for p in pods:
        t = (p.get("status") or {}).get("finishedAt")
        if t is None:
            return None
        times.append(float(t))
    return max(times, default=None)


__all__ = ["STATE_FILE", "LocalBackend"]
