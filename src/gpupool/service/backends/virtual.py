"""The virtual cluster: simulated nodes where a workload runs for its declared duration.

Why it persists its state to a file: it stands in for a real cluster, whose pods keep running
when the controller is killed. Keeping the simulated cluster outside the controller's memory
lets a restarted controller reconcile against it exactly as it would against Kubernetes, and
lets tests check that nothing was started twice and no device was handed out twice.
The file is replaced atomically (write, then rename), so a kill -9 leaves the old or the new
state, never a torn one.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpupool.model import Node
from gpupool.service.backends import BackendError, BackendHealth, RunSpec, RunState


class VirtualBackend:
    """Simulated nodes. ``time_scale`` > 1 makes declared durations pass faster (60: a minute per second)."""

    name = "virtual"

    def __init__(
        self,
        state_file: str | Path | None = None,
        time_scale: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
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
        if self.path is not None and self.path.exists():
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._runs = data.get("runs", {})
            self.starts = data.get("starts", {})
            self.violations = data.get("violations", [])

    # -- persistence --------------------------------------------------------------------------
    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        data = {"runs": self._runs, "starts": self.starts, "violations": self.violations}
        tmp.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, self.path)

    # -- the Backend protocol -----------------------------------------------------------------
    def set_nodes(self, nodes: Sequence[Node]) -> None:
        with self._lock:
            self._nodes = {n.name: n for n in nodes}

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
                self._runs[spec.name] = {
                    "placement": dict(spec.placement),
                    "started_at": self.clock(),
                    "duration_s": spec.duration_s,
                    "finished": False,
                    "outcome": "",
                    "message": "",
                }
                self.starts[spec.name] = self.starts.get(spec.name, 0) + 1
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

    def _ends_at(self, r: dict[str, Any]) -> float | None:
        d = r.get("duration_s")
        return None if d is None else float(r["started_at"]) + float(d) / self.time_scale

    def poll(self, now: float) -> list[RunState]:
        with self._lock:
            changed = False
            for r in self._runs.values():
                end = self._ends_at(r)
                if not r["finished"] and end is not None and now >= end:
                    r["finished"] = True
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
        """Wall time of the next declared finish, so the controller can sleep until then."""
        with self._lock:
            ends = [
                e for r in self._runs.values() if not r["finished"] and (e := self._ends_at(r)) is not None
            ]
        return min(ends) if ends else None

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
        )
