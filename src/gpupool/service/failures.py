"""Failures and node faults in the live service: the retry policy, and evictions for node faults.

Why a module of its own: the controller owns every phase change, but what to do with a failed run
(how long to back off, when to give up, what to record) and which running work a node fault must
displace are policies; keeping them here keeps the controller's cycle readable and lets the
policy be tested on its own.

Durability: every failure is one transaction that changes the phase (``Running -> Pending`` for a
retry, ``-> Failed`` when the retries are spent) and appends a ``RunFailed`` event and an audit
record. The event's message ends with a machine-readable tail (``[exit-code=137 retry-at=...]``),
so the attempt history and the backoff's "not before" are derived from stored events after a
restart: nothing about a backoff lives only in memory.

Node faults: a node removed from the configuration, a ``NoExecute`` taint a workload does not
tolerate and a drain are *evictions* (requeued at once, not counted against ``maxRetries``); a
node failure reported by the backend and an unhealthy device are *failures* of the run recorded
as such, but faults of the platform: requeued at once, not counted against ``maxRetries`` (up to
``MAX_PLATFORM_REQUEUES`` of them). Evictions are write-ahead like preemptions:
``Preempted`` with the reason is committed, the backend stops the run, then it is requeued.
"""

from __future__ import annotations

# the parts, one idea a module; their public names stay importable from here
from gpupool.service.failure_policy import (
    BACKOFF_ANNOTATION,
    BACKOFF_CODE,
    DEFAULT_POLICIES,
    EXIT_CODE_ANNOTATION,
    FAIL_AFTER_ANNOTATION,
    MAX_BACKOFF_ANNOTATION,
    MAX_PLATFORM_REQUEUES,
    PLATFORM_FAULTS,
    RUN_HINTS,
    SCHEDULER,
    UNHEALTHY_ANNOTATION,
    Fault,
    FaultState,
    RetryPolicy,
    parse_failure_rates,
    policy_for,
    run_hints,
)

# tests/test_failures.py reaches the outcome rule here
from gpupool.service.failure_record import (
    _outcome,  # noqa: F401
    held,
    load_holds,
    record_failures,
)
from gpupool.service.node_faults import (
    device_health,
    effective_nodes,
    evict,
    fault_evictions,
    fault_of,
    merge_reported,
    node_health,
    occupy_unhealthy,
    on_node,
    unhealthy_devices,
)
from gpupool.store.failure_events import (
    FAILED_EVENT,
    FailureRecord,
    failures,
    history_view,
    parse_failure,
)

__all__ = [
    "BACKOFF_ANNOTATION",
    "BACKOFF_CODE",
    "DEFAULT_POLICIES",
    "EXIT_CODE_ANNOTATION",
    "FAILED_EVENT",
    "FAIL_AFTER_ANNOTATION",
    "MAX_BACKOFF_ANNOTATION",
    "MAX_PLATFORM_REQUEUES",
    "PLATFORM_FAULTS",
    "RUN_HINTS",
    "SCHEDULER",
    "UNHEALTHY_ANNOTATION",
    "FailureRecord",
    "Fault",
    "FaultState",
    "RetryPolicy",
    "device_health",
    "effective_nodes",
    "evict",
    "failures",
    "fault_evictions",
    "fault_of",
    "held",
    "history_view",
    "load_holds",
    "merge_reported",
    "node_health",
    "occupy_unhealthy",
    "on_node",
    "parse_failure",
    "parse_failure_rates",
    "policy_for",
    "record_failures",
    "run_hints",
    "unhealthy_devices",
]
