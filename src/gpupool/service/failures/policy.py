"""The failure policy: retry policies, faults, the run hints and the annotations they read.

Why apart (from ``record`` and ``nodes`` beside it): these are the pure parts (no controller,
no store writes): what a workload's retry policy is and what a fault is. How a stored
``RunFailed`` event's machine-readable tail is parsed back, so the attempt history and a
backoff's "not before" survive a restart, is ``gpupool.store.failure_events``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpupool.quantity import QuantityError, parse_duration

if TYPE_CHECKING:
    pass

SCHEDULER = "scheduler"

#: faults of the platform, not of the job: requeued at once and not counted against the
#: workload's maxRetries (as Slurm requeues on node failure); past this many such requeues in a
#: row of one workload, it fails like any other (a fault that follows it is likely its own).
#: BindFailed: the Kubernetes backend could not bind a gang before its deadline (API server or
#: node trouble, never the job's code); UnexpectedAdmissionError: the kubelet refused the pod
#: at admission (device plugin out of step), again before any of the job's code ran.
PLATFORM_FAULTS = frozenset({"NodeFailure", "DeviceUnhealthy", "BindFailed", "UnexpectedAdmissionError"})

MAX_PLATFORM_REQUEUES = 10

BACKOFF_CODE = "Backoff"

#: per-workload annotations read by the virtual backend (a run that fails after this virtual time)
FAIL_AFTER_ANNOTATION = "gpupool.io/fail-after"

EXIT_CODE_ANNOTATION = "gpupool.io/exit-code"

#: per-workload overrides of the retry backoff (durations)
BACKOFF_ANNOTATION = "gpupool.io/retry-backoff"

MAX_BACKOFF_ANNOTATION = "gpupool.io/retry-max-backoff"

#: on a Cluster object: JSON {"<node>/<index>": "<reason>"} of devices marked unhealthy
UNHEALTHY_ANNOTATION = "gpupool.io/unhealthy-devices"

RUN_HINTS = (FAIL_AFTER_ANNOTATION, EXIT_CODE_ANNOTATION)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failed run is retried, and how long it waits before each retry."""

    max_retries: int
    backoff_s: float
    max_backoff_s: float
    factor: float = 2.0

    def delay(self, retry: int) -> float:
        """Wait before retry number ``retry`` (1-based): exponential, capped."""
        return min(self.max_backoff_s, self.backoff_s * self.factor ** max(0, retry - 1))


#: defaults by task type: serving comes back fast and often; long training waits longer
DEFAULT_POLICIES: Mapping[str, RetryPolicy] = {
    "inference": RetryPolicy(5, 5.0, 60.0),
    "training": RetryPolicy(3, 60.0, 1800.0),
    "fine-tuning": RetryPolicy(3, 30.0, 900.0),
    "evaluation": RetryPolicy(2, 10.0, 300.0),
    "batch": RetryPolicy(2, 30.0, 600.0),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """Why one run ended abnormally or must leave its node."""

    code: str  # Error | OOMKilled | NodeFailure | DeviceUnhealthy | NodeRemoved | NoExecuteTaint | Drained
    reason: str
    exit_code: int | None = None
    counted: bool = True  # a failure under the retry policy (False: an eviction, requeued at once)
    ended_at: float | None = None  # when the run ended, if before it was noticed (billing)

    @property
    def what(self) -> str:
        return f"exit code {self.exit_code}" if self.exit_code is not None else self.code


@dataclass(slots=True)
class FaultState:
    """What the controller knows about failures and faults between cycles."""

    #: workloads in backoff: name -> (not before, epoch seconds)
    holds: dict[str, float] = field(default_factory=dict)
    #: devices marked unhealthy through the API: node -> index -> reason
    unhealthy: dict[str, dict[int, str]] = field(default_factory=dict)
    #: of those, the ones the backend reported (its device plugin), kept apart so that a device
    #: it reports healthy again is given back, and one marked through the API is not
    reported: dict[str, dict[int, str]] = field(default_factory=dict)
    #: nodes the backend reports failed: node -> reason
    down: dict[str, str] = field(default_factory=dict)
    #: run hints (fail-after annotations) of workloads that carry them, for the backend
    hints: dict[str, dict[str, str]] = field(default_factory=dict)
    #: base/cap of the backoff for every task type, when set (ServiceConfig)
    backoff_s: float | None = None
    max_backoff_s: float | None = None


def policy_for(manifest: Mapping[str, Any], state: FaultState, max_retries: int | None = None) -> RetryPolicy:
    """The retry policy of a workload: its type's default, then the retry limit its task type
    resolved to (``max_retries``: queue ``typeDefaults`` or the Cluster's ``taskTypes``, see
    gpupool.service.task_types), then ``spec.maxRetries`` and annotations."""
    spec = manifest.get("spec") if isinstance(manifest, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}
    pol = DEFAULT_POLICIES.get(str(spec.get("type") or "batch"), DEFAULT_POLICIES["batch"])
    if max_retries is not None:
        pol = replace(pol, max_retries=max_retries)
    if state.backoff_s is not None:
        pol = replace(pol, backoff_s=state.backoff_s)
    if state.max_backoff_s is not None:
        pol = replace(pol, max_backoff_s=state.max_backoff_s)
    mr = spec.get("maxRetries")
    if isinstance(mr, int) and not isinstance(mr, bool) and mr >= 0:
        pol = replace(pol, max_retries=mr)
    md = manifest.get("metadata") if isinstance(manifest, Mapping) else None
    ann = md.get("annotations") if isinstance(md, Mapping) else None
    if isinstance(ann, Mapping):
        try:
            if BACKOFF_ANNOTATION in ann:
                pol = replace(pol, backoff_s=parse_duration(ann[BACKOFF_ANNOTATION]))
            if MAX_BACKOFF_ANNOTATION in ann:
                pol = replace(pol, max_backoff_s=parse_duration(ann[MAX_BACKOFF_ANNOTATION]))
        except QuantityError:
            pass  # a malformed override keeps the default (the workload still runs)
    return pol


def run_hints(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The annotations a backend may act on (fail-after, exit-code); usually empty."""
    md = manifest.get("metadata") if isinstance(manifest, Mapping) else None
    ann = md.get("annotations") if isinstance(md, Mapping) else None
    if not isinstance(ann, Mapping):
        return {}
    return {k: str(ann[k]) for k in RUN_HINTS if k in ann}


def parse_failure_rates(values: Sequence[str]) -> dict[str, float]:
    """``--failure-rate`` values: ``TYPE=RATE`` or ``RATE`` (any type), abnormal exits per running hour."""
    out: dict[str, float] = {}
    for v in values:
        key, _, rate = v.rpartition("=")
        try:
            r = float(rate)
        except ValueError:
            raise ValueError(
                f"--failure-rate {v!r}: expected TYPE=RATE or RATE (exits per running hour)"
            ) from None
        if not 0 <= r < 1e6 or r != r:
            raise ValueError(f"--failure-rate {v!r}: the rate must be between 0 and 1e6")
        if key and key not in DEFAULT_POLICIES and key != "*":
            raise ValueError(
                f"--failure-rate {v!r}: unknown task type {key!r}; one of {', '.join(DEFAULT_POLICIES)}"
            )
        out[key or "*"] = r
    return out
