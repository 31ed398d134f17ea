"""What a simulation records: per job (``JobRecord``), notable moments (``Event``), per run
(``RunResult``). Plain data, read by ``metrics``, ``runner`` and ``report``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.sim.sources import JobSpec


@dataclass(slots=True)
class JobRecord:
    """What happened to one job under one policy."""

    spec: JobSpec
    index: int
    status: str = "waiting"  # waiting | pending | running | completed | failed | rejected
    attempt: int = 0  # starts so far
    retries: int = 0  # retries used after faults
    first_start: float | None = None
    start: float | None = None
    finish: float | None = None
    work_done: float = 0.0  # seconds of the current run already done (restarts begin at 0)
    lost_gpu_s: float = 0.0  # GPU-seconds of work thrown away by preemption
    lost_fault_gpu_s: float = 0.0  # ... by abnormal exits and node failures
    preempted: int = 0
    faults: int = 0
    fault_at: float | None = None  # when the last fault/eviction happened (for time to recover)
    recover_s: list[float] = field(default_factory=list)
    reject_reason: str = ""
    #: every admission time (the first is ``first_start``; later ones follow preemptions/faults)
    starts: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Event:
    """A moment worth showing (a fault, a preemption, a rejection), in the run's event log."""

    time: float
    kind: str
    subject: str
    detail: str = ""


@dataclass(slots=True, kw_only=True)
class RunResult:
    """One policy on one variant: every job, the sampled series, and the run's counters."""

    policy: str
    variant: str
    jobs: list[JobRecord]
    #: allocation series, one point per event time: GPU milli allocated and schedulable, counts
    times: list[float]
    alloc_milli: list[int]
    cap_milli: list[int]
    pending: list[int]
    running: list[int]
    #: fragmentation, sampled at ``Scenario.samples`` evenly spaced times
    frag_times: list[float]
    frag: list[float]
    queue_usage_gpu_s: dict[str, float]
    queue_guarantee_milli: dict[str, int]
    events: list[Event]
    preemptions: int
    cycles: int
    engine_calls: int
    violations: list[str]
    end: float
    #: the resource the allocation, usage and loss figures count: GPUs, or CPU on a cluster
    #: without GPUs (the ``gpu_*`` names of those figures then mean CPUs)
    resource: str = "nvidia.com/gpu"
    #: consolidation moves, and the GPU-seconds of work they threw away (also in each job's
    #: ``lost_gpu_s``)
    moves: int = 0
    moved_gpu_s_lost: float = 0.0


class Series:
    """The allocation series as the run goes: one point per event time (the last write wins)."""

    __slots__ = ("allocs", "caps", "npend", "nrun", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.allocs: list[int] = []
        self.caps: list[int] = []
        self.npend: list[int] = []
        self.nrun: list[int] = []

    def record(self, t: float, alloc: int, cap: int, pending: int, running: int) -> None:
        if self.times and self.times[-1] == t:
            self.allocs[-1], self.caps[-1], self.npend[-1], self.nrun[-1] = alloc, cap, pending, running
            return
        self.times.append(t)
        self.allocs.append(alloc)
        self.caps.append(cap)
        self.npend.append(pending)
        self.nrun.append(running)
