"""The virtual cluster: simulated nodes where a workload runs for its declared duration.

Why it persists its state to a file: it stands in for a real cluster, whose pods keep running
when the controller is killed. Keeping the simulated cluster outside the controller's memory
lets a restarted controller reconcile against it exactly as it would against Kubernetes, and
lets tests check that nothing was started twice and no device was handed out twice.
The file is replaced atomically (write, then rename), so a kill -9 leaves the old or the new
state, never a torn one.

Failures are injected the way the simulator models them (docs/simulator.md, "faults"): a rate of
abnormal exits per running hour for each task type, node failures with a mean time between
failures and a repair time, and per workload the annotation ``gpupool.io/fail-after: 30s``
(optionally ``gpupool.io/exit-code: 137``) that makes each of its runs fail after that virtual
time. Every draw comes from a generator seeded by (seed, workload, start count) or (seed, node,
failure count), so a restart decides the same, and the decided failure time is stored with the
run. All rates default to 0: without options the virtual cluster only ever succeeds.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpupool.model import Node
from gpupool.quantity import QuantityError, parse_duration
from gpupool.service.backends import BackendError, BackendHealth, Capability, RunSpec, RunState
from gpupool.service.backends.run_logs import SyntheticLogs


class VirtualBackend:
    """Simulated nodes. ``time_scale`` > 1 makes declared durations pass faster (60: a minute per second)."""

    name = "virtual"
    capabilities = frozenset(
        {
            Capability.RELOAD,
            Capability.SHRINK,
            Capability.MOVE,
            Capability.NEXT_FINISH,
            Capability.DOWN_NODES,
            Capability.RUN_LOGS,
            Capability.TIME_SCALE,
        }
    )

    def __init__(
        self,
        state_file: str | Path | None = None,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
        *,
        failure_rates: Mapping[str, float] | None = None,
        node_mtbf_s: float | None = None,
        node_repair_s: float = 7200.0,
        seed: int = 1,
    ) -> None:
        """``failure_rates``: abnormal exits per running (virtual) hour by task type (``*``: any
        type); ``node_mtbf_s``: mean virtual seconds between failures of one node, repaired after
        ``node_repair_s``. Both off by default."""
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if any(r < 0 for r in (failure_rates or {}).values()) or (
            node_mtbf_s is not None and node_mtbf_s <= 0
        ):
            raise ValueError("failure rates must be >= 0 and node_mtbf_s > 0")
        self.failure_rates = dict(failure_rates or {})
        self.node_mtbf_s = node_mtbf_s
        self.node_repair_s = node_repair_s
        self.seed = seed
        self.time_scale = time_scale
        self.clock = clock
        self.path = Path(state_file) if state_file is not None else None
        self._lock = threading.Lock()
        self._nodes: dict[str, Node] = {}
        self._runs: dict[str, dict[str, Any]] = {}
        #: how many times each workload was started, ever (evidence that nothing ran twice)
        self.starts: dict[str, int] = {}
        #: device over-commitments refused by start() (should stay empty)
        self.violations: list[str] = []
        #: failed nodes: name -> {"until": epoch of the repair, "reason": ...}
        self.nodes_down: dict[str, dict[str, Any]] = {}
        #: next injected failure of each node (epoch), and how many it had
        self._node_next: dict[str, float] = {}
        self._node_failures: dict[str, int] = {}
        #: a synthetic line per attempt, so the logs API and dashboard can be tried without GPUs
        self.run_logs = SyntheticLogs(lambda n: self.starts.get(n, 0), self._log_line)
        self._load()

    # -- persistence --------------------------------------------------------------------------
    def _load(self) -> None:
        if self.path is not None and self.path.exists():
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._runs = data.get("runs", {})
            self.starts = data.get("starts", {})
            self.violations = data.get("violations", [])
            self.nodes_down = data.get("nodesDown", {})
            self._node_next = data.get("nodeNext", {})
            self._node_failures = data.get("nodeFailures", {})

    def reload(self) -> None:
        """Re-read the state file: a standby taking over (gpupool.service.leader) finds the
        cluster as the previous leader left it, not as it was when this process started."""
        with self._lock:
            self._load()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        data = {
            "runs": self._runs,
            "starts": self.starts,
            "violations": self.violations,
            "nodesDown": self.nodes_down,
            "nodeNext": self._node_next,
            "nodeFailures": self._node_failures,
        }
        tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, self.path)

    def _log_line(self, name: str, attempt: int) -> str:
        """The stand-in output of one attempt: where and when the latest ran and how it ended."""
        head = f"[virtual cluster] {name} attempt {attempt}:"
        with self._lock:
            r = self._runs.get(name) if attempt == self.starts.get(name, 0) else None
            r = dict(r) if r is not None else None
        if r is None:
            return f"{head} ran on the virtual cluster, which runs no process and keeps no past output"
        nodes = sorted({str(p["node"]) for p in r["placement"].get("pods", ())})
        at = datetime.fromtimestamp(float(r["started_at"]), UTC).isoformat(timespec="seconds")
        line = f"{head} started {at} on {', '.join(nodes) or 'no node'}; no process runs here"
        return f"{line}; {r['outcome']}: {r['message']}" if r.get("finished") else line

    # -- the Backend protocol -----------------------------------------------------------------
    def set_nodes(self, nodes: Sequence[Node]) -> None:
        with self._lock:
            self._nodes = {n.name: n for n in nodes}
            if self.node_mtbf_s is not None and any(n not in self._node_next for n in self._nodes):
                now = self.clock()
                for n in self._nodes:
                    if n not in self._node_next and n not in self.nodes_down:
                        self._schedule_node_failure(n, now)
                self._save()

    def _device_use(self) -> dict[tuple[str, int], int]:
        use: dict[tuple[str, int], int] = defaultdict(int)
        for r in self._runs.values():
            if r.get("finished"):
                continue
            for p in r["placement"].get("pods", ()):
                for d in p.get("devices", ()):
                    use[(p["node"], d)] += int(p.get("gpuMilli", 1000))
        return use

    def start(self, runs: Sequence[RunSpec]) -> None:
        with self._lock:
            use = self._device_use()
            refused: list[str] = []
            changed = False
            for spec in runs:
                if spec.name in self._runs:
                    continue  # idempotent: already running (or finished and not yet forgotten)
                bad = []
                for p in spec.placement.get("pods", ()):
                    node = self._nodes.get(p["node"])
                    if self._nodes and node is None:
                        bad.append(f"node {p['node']} does not exist")
                        continue
                    if p["node"] in self.nodes_down:
                        bad.append(f"node {p['node']} is down")
                    for d in p.get("devices", ()):
                        if node is not None and not 0 <= d < node.gpu_count:
                            bad.append(f"device {p['node']}/{d} does not exist")
                        if use[(p["node"], d)] + int(p.get("gpuMilli", 1000)) > 1000:
                            bad.append(f"device {p['node']}/{d} is already fully allocated")
                if bad:
                    msg = f"{spec.name}: " + "; ".join(bad)
                    self.violations.append(msg)
                    refused.append(msg)
                    changed = True
                    continue
                for p in spec.placement.get("pods", ()):
                    for d in p.get("devices", ()):
                        use[(p["node"], d)] += int(p.get("gpuMilli", 1000))
                self.starts[spec.name] = self.starts.get(spec.name, 0) + 1
                self._runs[spec.name] = {
                    "placement": dict(spec.placement),
                    "started_at": self.clock(),
                    "duration_s": spec.duration_s,
                    "finished": False,
                    "outcome": "",
                    "message": "",
                    **self._planned_failure(spec),
                }
                changed = True
            if changed:
                self._save()
        if refused:
            raise BackendError("; ".join(refused))

    def stop(self, names: Sequence[str]) -> None:
        with self._lock:
            hit = [n for n in names if n in self._runs]
            for n in hit:
                del self._runs[n]
            if hit:
                self._save()

    def shrink(self, name: str, placement: Mapping[str, Any], message: str = "") -> None:
        """An elastic gang loses its pods above the minimum (the engine's ``Shrink``): the run
        keeps only the pods of ``placement``, whose devices alone it holds from now on; an
        unknown or finished run is left alone (idempotent, like ``stop``)."""
        with self._lock:
            r = self._runs.get(name)
            if r is None or r.get("finished"):
                return
            r["placement"] = dict(placement)
            self._save()

    def move(self, spec: RunSpec, message: str = "") -> bool:
        """A consolidation move (the engine's ``Move``): the run stops where it is and restarts
        at once on ``spec.placement``, from the beginning (a new start: its progress is lost).
        Idempotent: a run already on that admission, or unknown or finished, is left alone. A
        device of the new placement held by another run is refused (``BackendError``)."""
        with self._lock:
            r = self._runs.get(spec.name)
            if r is None or r.get("finished"):
                return True
            if r["placement"].get("admittedAt") == spec.placement.get("admittedAt"):
                return True
            use = self._device_use()
            for p in r["placement"].get("pods", ()):
                for d in p.get("devices", ()):
                    use[(p["node"], d)] -= int(p.get("gpuMilli", 1000))
            bad = [
                f"device {p['node']}/{d} is already fully allocated"
                for p in spec.placement.get("pods", ())
                for d in p.get("devices", ())
                if use[(p["node"], d)] + int(p.get("gpuMilli", 1000)) > 1000
            ]
            if bad:
                msg = f"{spec.name}: cannot move: " + "; ".join(bad)
                self.violations.append(msg)
                self._save()
                raise BackendError(msg)
            self.starts[spec.name] = self.starts.get(spec.name, 0) + 1
            for k in ("fail_at_s", "exit_code", "fail_reason"):  # drawn again for the new start
                r.pop(k, None)
            r.update(
                placement=dict(spec.placement),
                started_at=self.clock(),
                duration_s=spec.duration_s,
                **self._planned_failure(spec),
            )
            self._save()
        return True

    def _ends_at(self, r: dict[str, Any]) -> float | None:
        d = r.get("duration_s")
        f = r.get("fail_at_s")
        if f is not None and (d is None or float(f) < float(d)):
            d = f
        return None if d is None else float(r["started_at"]) + float(d) / self.time_scale

    def poll(self, now: float) -> list[RunState]:
        with self._lock:
            changed = self._advance_nodes(now)
            for r in self._runs.values():
                end = self._ends_at(r)
                if not r["finished"] and end is not None and now >= end:
                    r["finished"] = True
                    fail = r.get("fail_at_s")
                    if fail is not None and (r.get("duration_s") is None or fail < r["duration_s"]):
                        r["outcome"] = "Failed"
                        r["message"] = f"exited with code {r.get('exit_code')} after {float(fail):g}s"
                    else:
                        r["outcome"] = "Succeeded"
                        r["message"] = f"completed after its declared duration of {r['duration_s']:g}s"
                    changed = True
            if changed:
                self._save()
            return [self._state(n, r) for n, r in self._runs.items() if r["finished"]]

    def forget(self, names: Sequence[str]) -> None:
        self.stop(names)

    def runs(self) -> dict[str, RunState]:
        with self._lock:
            return {n: self._state(n, r) for n, r in self._runs.items()}

    def health(self) -> BackendHealth:
        with self._lock:
            return BackendHealth(
                True,
                {
                    "backend": self.name,
                    "nodes": len(self._nodes),
                    "runs": len(self._runs),
                    "timeScale": self.time_scale,
                },
            )

    def next_finish(self) -> float | None:
        """Wall time of the next declared finish (or failure, or node event), to sleep until then."""
        with self._lock:
            ends = [
                e for r in self._runs.values() if not r["finished"] and (e := self._ends_at(r)) is not None
            ]
            ends += [float(d["until"]) for d in self.nodes_down.values()]
            ends += [t for n, t in self._node_next.items() if n in self._nodes]
        return min(ends) if ends else None

    # -- injected failures --------------------------------------------------------------------
    def _planned_failure(self, spec: RunSpec) -> dict[str, Any]:
        """When (virtual seconds after its start) and how this run will fail, if it will."""
        hints = spec.hints or {}
        code = 1
        try:
            code = int(hints.get("gpupool.io/exit-code", 1))
        except ValueError:
            code = 1
        if "gpupool.io/fail-after" in hints:
            try:
                at = parse_duration(hints["gpupool.io/fail-after"])
            except QuantityError:
                return {}
            return {
                "fail_at_s": at,
                "exit_code": code,
                "fail_reason": "OOMKilled" if code == 137 else "Error",
            }
        rate = self.failure_rates.get(spec.task_type, self.failure_rates.get("*", 0.0))
        if rate <= 0:
            return {}
        rng = random.Random(f"{self.seed}:{spec.name}:{self.starts.get(spec.name, 0)}")
        at = rng.expovariate(rate / 3600.0)
        if spec.duration_s is not None and at >= spec.duration_s:
            return {}
        code, why = rng.choice(((1, "Error"), (137, "OOMKilled"), (139, "Error")))
        return {"fail_at_s": at, "exit_code": code, "fail_reason": why}

    def _schedule_node_failure(self, node: str, now: float) -> None:
        assert self.node_mtbf_s is not None
        k = self._node_failures.get(node, 0)
        rng = random.Random(f"{self.seed}:node:{node}:{k}")
        self._node_next[node] = now + rng.expovariate(1.0 / self.node_mtbf_s) / self.time_scale

    def _advance_nodes(self, now: float) -> bool:
        """Repair nodes whose repair time passed, fail those whose failure time came."""
        changed = False
        for n in [n for n, d in self.nodes_down.items() if float(d["until"]) <= now]:
            del self.nodes_down[n]
            if self.node_mtbf_s is not None:
                self._schedule_node_failure(n, now)
            changed = True
        for n in [n for n, t in self._node_next.items() if t <= now and n in self._nodes]:
            del self._node_next[n]
            self._fail_node(n, now, self.node_repair_s, "injected failure (mean time between failures)")
            changed = True
        return changed

    def _fail_node(self, node: str, now: float, repair_s: float, reason: str) -> None:
        self._node_failures[node] = self._node_failures.get(node, 0) + 1
        self.nodes_down[node] = {"until": now + repair_s / self.time_scale, "reason": reason}
        for r in self._runs.values():
            if not r["finished"] and any(p["node"] == node for p in r["placement"].get("pods", ())):
                r.update(
                    finished=True,
                    outcome="Failed",
                    message=f"node {node} failed: {reason}",
                    exit_code=None,
                    fail_reason="NodeFailure",
                )

    def fail_node(self, node: str, repair_s: float | None = None, reason: str = "injected failure") -> None:
        """Fail a node now (its runs end Failed with NodeFailure); it is repaired after ``repair_s``."""
        with self._lock:
            self._fail_node(node, self.clock(), self.node_repair_s if repair_s is None else repair_s, reason)
            self._save()

    def down_nodes(self, now: float) -> dict[str, str]:
        """Failed nodes not yet repaired: name -> reason."""
        with self._lock:
            if self._advance_nodes(now):
                self._save()
            return {n: str(d.get("reason", "")) for n, d in self.nodes_down.items()}

    @staticmethod
    def _state(name: str, r: dict[str, Any]) -> RunState:
        return RunState(
            name,
            r["placement"],
            float(r["started_at"]),
            r.get("duration_s"),
            bool(r["finished"]),
            r.get("outcome", ""),
            r.get("message", ""),
            r.get("exit_code") if r.get("outcome") == "Failed" else None,
            str(r.get("fail_reason", "")) if r.get("outcome") == "Failed" else "",
        )
