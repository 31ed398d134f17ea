"""Backends carry the controller's decisions out on real or simulated machines.

Why a protocol: the controller is written once against ``Backend``; the virtual cluster is the
default (it serves on any machine), Kubernetes and local backends come later behind the same
five verbs. Every verb is idempotent by workload name so a controller that crashed half-way
through applying a decision can simply apply it again after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from gpupool.model import Node


@dataclass(frozen=True, slots=True)
class PodCommand:
    """What the pods of one pod group run (read by the local backend; Kubernetes takes it from
    the pod template). ``command`` None: the manifest declares nothing to run."""

    command: tuple[str, ...] | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: str | None = None


def pod_commands(manifest: Mapping[str, Any]) -> dict[str, PodCommand]:
    """Each pod group's command, args, env and workingDir from a stored Workload manifest."""
    spec = manifest.get("spec") if isinstance(manifest, Mapping) else None
    groups = spec.get("podGroups") if isinstance(spec, Mapping) else None
    out: dict[str, PodCommand] = {}
    for g in groups if isinstance(groups, list) else ():
        if not isinstance(g, Mapping):
            continue
        cmd = g.get("command")
        out[str(g.get("name") or "main")] = PodCommand(
            tuple(str(c) for c in cmd) if isinstance(cmd, list) else None,
            tuple(str(a) for a in g.get("args") or ()),
            {str(k): str(v) for k, v in (g.get("env") or {}).items()},
            str(g["workingDir"]) if g.get("workingDir") else None,
        )
    return out


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What to start: a workload's placement (JSON form, as stored) and its declared duration."""

    name: str
    placement: Mapping[str, Any]
    duration_s: float | None = None
    task_type: str = ""
    #: annotations a backend may act on (the virtual one: ``gpupool.io/fail-after``, ``exit-code``)
    hints: Mapping[str, str] = field(default_factory=dict)
    #: what each pod group runs, by group name (filled only for a backend whose
    #: ``needs_commands`` is true: the local backend)
    commands: Mapping[str, PodCommand] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RunState:
    """What the backend says about one workload it knows."""

    name: str
    placement: Mapping[str, Any]
    started_at: float
    duration_s: float | None
    finished: bool = False
    outcome: str = ""  # "Succeeded" | "Failed" once finished
    message: str = ""
    exit_code: int | None = None  # of a failed run, when known
    reason: str = ""  # a failed run's cause as a code: Error, OOMKilled, NodeFailure, ...
    #: when it ended, where the backend knows (local: the pods' exit.json), so a run that ended
    #: while the controller was down is billed to its end, not to the restart
    ended_at: float | None = None


@dataclass(slots=True)
class BackendHealth:
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


class BackendError(RuntimeError):
    """The backend refused or failed an operation (the controller records it, never crashes)."""


class Capability(StrEnum):
    """An optional part of the backend protocol; its value is the name of the method (or, for
    ``RUN_LOGS``, the attribute) a backend that declares it has.

    Why declared rather than probed with ``getattr``: what a backend can do is then written once
    on the backend, a typo is a failure (tests/service/test_backend_capabilities.py: a declared
    capability's method exists, and an existing one is declared), and a reader of the
    controller sees which optional parts it uses."""

    #: ``down_nodes(now) -> {node: reason}``: the nodes that have failed and are not yet
    #: repaired; the controller requeues their work and places nothing there until they are back
    DOWN_NODES = "down_nodes"
    #: ``observed_nodes() -> list[Node]``: the backend is the source of its nodes (Kubernetes:
    #: the cluster's Node objects); the controller uses them instead of the configured ones
    OBSERVED_NODES = "observed_nodes"
    #: ``reported_unhealthy() -> {node: {index: reason}}``: devices the node's plugin reports bad
    REPORTED_UNHEALTHY = "reported_unhealthy"
    #: ``refuses(name, submitter) -> reason | None``: the backend refuses a submission itself
    REFUSES = "refuses"
    #: ``vouches(name) -> bool``: a run found at restart is the backend's own (adoption)
    VOUCHES = "vouches"
    #: ``overbooked() -> list``: devices more than one run holds (exclusive access broken)
    OVERBOOKED = "overbooked"
    #: ``shrink(name, placement, message)``: an elastic gang keeps only the pods of ``placement``
    SHRINK = "shrink"
    #: ``move(run, message) -> bool``: a running workload is stopped and restarted at once on
    #: ``run.placement`` (consolidation's ``Move``: reserved for it); False when it cannot be
    #: moved here. A backend without it gets no consolidation planned (controller/moves.py)
    MOVE = "move"
    #: ``movable(manifest) -> bool``: whether a workload of this stored manifest can be moved
    #: (``Workload.movable``); without it every workload is
    MOVABLE = "movable"
    #: ``next_finish() -> float | None``: when the next run ends, so the loop wakes then
    NEXT_FINISH = "next_finish"
    #: ``reload()``: read the backend's persisted state again (a standby becoming leader)
    RELOAD = "reload"
    #: ``bind(svc)``: the backend is handed the service (the local backend's device health)
    BIND = "bind"
    #: ``run_logs``: a ``RunLogs`` (``gpupool logs``)
    RUN_LOGS = "run_logs"
    #: ``needs_commands`` (attribute): runs are processes the backend starts, so a ``RunSpec``
    #: carries each pod's command (the local backend)
    NEEDS_COMMANDS = "needs_commands"
    #: ``time_scale`` (attribute): backend seconds per wall second (the virtual cluster), so an
    #: expected end is ``admitted_at + duration / time_scale``
    TIME_SCALE = "time_scale"
    #: ``claims_settled() -> bool``: the workload source has caught up, so runs found at restart
    #: and not yet claimed will not be (adoption stops waiting; Kubernetes)
    CLAIMS_SETTLED = "claims_settled"
    #: ``leader_gate`` (attribute, ``() -> bool`` or None): a second lease the backend needs; a
    #: replica leads only while it holds both (the Kubernetes Lease)
    LEADER_GATE = "leader_gate"


def capability(backend: Backend, cap: Capability) -> Any:
    """The backend's method (or attribute) for ``cap`` when it declares it, else None."""
    return getattr(backend, cap.value) if cap in backend.capabilities else None


@runtime_checkable
class Backend(Protocol):
    """The controller's view of a cluster."""

    name: str
    #: the optional parts of the protocol this backend has (see ``Capability``)
    capabilities: frozenset[Capability]

    def set_nodes(self, nodes: Sequence[Node]) -> None:
        """Tell the backend which nodes exist (the Cluster objects changed)."""

    def start(self, runs: Sequence[RunSpec]) -> None:
        """Start workloads where placed; a name already running is left alone (idempotent)."""

    def stop(self, names: Sequence[str]) -> None:
        """Stop workloads (eviction or cancel); unknown names are ignored (idempotent)."""

    def poll(self, now: float) -> list[RunState]:
        """Runs that have finished and not yet been forgotten."""

    def forget(self, names: Sequence[str]) -> None:
        """Drop finished runs once the controller has recorded their outcome."""

    def runs(self) -> dict[str, RunState]:
        """Everything the backend currently knows (used to reconcile after a restart)."""

    def health(self) -> BackendHealth:
        """Readiness of the backend."""

    # The optional parts are declared in ``capabilities`` and looked up with ``capability``. A
    # backend with OBSERVED_NODES calls ``controller.nodes_changed()`` when its nodes change.


__all__ = [
    "Backend",
    "BackendError",
    "BackendHealth",
    "Capability",
    "PodCommand",
    "RunSpec",
    "RunState",
    "capability",
    "pod_commands",
]
