"""Recording failed runs: each failure becomes a requeue after its backoff, an at-once requeue
(a platform fault), or the final Failed, durably in one transaction.

Why apart (from ``policy``, which it applies): the outcome rules (what counts against
``maxRetries``, how long to back off, what the event's tail records) are one idea, read here
together with how backoffs are restored after a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpupool.audit import AuditEntry
from gpupool.service import task_types
from gpupool.store import PhaseChange, WorkloadRecord

if TYPE_CHECKING:
    from gpupool.service.controller.context import Context
from gpupool.service.failures.policy import (
    BACKOFF_CODE,
    MAX_PLATFORM_REQUEUES,
    PLATFORM_FAULTS,
    SCHEDULER,
    Fault,
    FaultState,
    RetryPolicy,
    policy_for,
)
from gpupool.store.failure_events import FAILED_EVENT, FailureRecord, failures
from gpupool.store.failure_events import iso_seconds as _iso


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What one failure becomes: the phase change, its audit record, the event, a backoff hold."""

    change: PhaseChange
    audit: AuditEntry
    event: tuple[str, str, str, str]
    hold: float | None = None


def record_failures(
    ctl: Context,
    queue_again: Callable[[WorkloadRecord], None],
    failed: Sequence[tuple[WorkloadRecord, Fault]],
    now: float,
) -> None:
    """Requeue each failed workload after its backoff, or end it Failed; one transaction for all.

    The caller has already stopped the runs in the backend (or the backend ended them itself);
    ``queue_again`` (the controller's pending set) holds each requeued workload as pending.
    """
    if not failed:
        return
    outcomes = [
        _outcome(rec, fault, _policy(ctl, rec), failures(ctl.store.list_events(rec.name)), now)
        for rec, fault in failed
    ]
    done = ctl.store.apply_transitions(
        [o.change for o in outcomes],
        audit=[o.audit for o in outcomes],
        at=_dt(now),
        events=[o.event for o in outcomes],
    )
    for rec, fault in failed:
        ctl.hooks.on_failure(rec.queue, fault.code)
    ctl.faults.holds.update({o.change.name: o.hold for o in outcomes if o.hold is not None})
    for new in done:
        if new.phase == "Pending":
            queue_again(new)
        else:
            ctl.faults.hints.pop(new.name, None)
            ctl.hooks.on_finish(new.queue, new.phase)


def _policy(ctl: Context, rec: WorkloadRecord) -> RetryPolicy:
    """The workload's retry policy, with the retry limit its task type resolved to."""
    return policy_for(rec.manifest, ctl.faults, task_types.max_retries(rec.manifest, ctl.bundle))


def _outcome(
    rec: WorkloadRecord, fault: Fault, pol: RetryPolicy, past: Sequence[FailureRecord], now: float
) -> _Outcome:
    """A platform fault is requeued at once (up to MAX_PLATFORM_REQUEUES), the job's own failure
    after its backoff while retries remain; otherwise the workload ends Failed."""
    infra = fault.code in PLATFORM_FAULTS
    retry = sum(f.code not in PLATFORM_FAULTS for f in past) + (0 if infra else 1)
    platform_n = sum(f.code in PLATFORM_FAULTS for f in past) + 1
    detail: dict[str, Any] = {
        "code": fault.code,
        "reason": fault.reason,
        "exitCode": fault.exit_code,
        "attempt": retry,
        "maxRetries": pol.max_retries,
    }
    if fault.ended_at is not None:  # the run ended before this was noticed: bill to its end
        detail["endedAt"] = datetime.fromtimestamp(fault.ended_at, UTC).isoformat()
    if infra and platform_n <= MAX_PLATFORM_REQUEUES:
        return _requeued_at_once(rec, fault, platform_n, detail, now)
    if not infra and retry <= pol.max_retries:
        return _backed_off(rec, fault, pol, retry, detail, now)
    return _final(rec, fault, pol, retry, past, detail, now)


def _tail(fault: Fault) -> str:
    return "none" if fault.exit_code is None else str(fault.exit_code)


def _requeued_at_once(
    rec: WorkloadRecord, fault: Fault, platform_n: int, detail: dict[str, Any], now: float
) -> _Outcome:
    why = (
        f"Requeued: {fault.what} at {_iso(now)}: {fault.reason}; a platform fault, not counted "
        f"against maxRetries ({platform_n} of {MAX_PLATFORM_REQUEUES} such requeues)"
    )
    msg = f"{fault.code}: {fault.reason}; retry at once, not counted against maxRetries "
    msg += f"[exit-code={_tail(fault)} retry-at={now:.3f}]"
    detail["counted"] = False
    return _Outcome(
        PhaseChange(rec.name, "Pending", why),
        AuditEntry(SCHEDULER, "workload.failure", "Workload", rec.name, detail),
        (rec.name, "Warning", FAILED_EVENT, msg),
    )


def _backed_off(
    rec: WorkloadRecord, fault: Fault, pol: RetryPolicy, retry: int, detail: dict[str, Any], now: float
) -> _Outcome:
    not_before = now + pol.delay(retry)
    why = (
        f"{BACKOFF_CODE}: retry {retry} of {pol.max_retries} after {fault.what} at {_iso(now)}; "
        f"not before {_iso(not_before)}"
    )
    msg = f"{fault.code}: {fault.reason}; retry {retry} of {pol.max_retries} not before "
    msg += f"{_iso(not_before)} [exit-code={_tail(fault)} retry-at={not_before:.3f}]"
    detail["retryAt"] = _iso(not_before)
    return _Outcome(
        PhaseChange(rec.name, "Pending", why),
        AuditEntry(SCHEDULER, "workload.failure", "Workload", rec.name, detail),
        (rec.name, "Warning", FAILED_EVENT, msg),
        not_before,
    )


def _final(
    rec: WorkloadRecord,
    fault: Fault,
    pol: RetryPolicy,
    retry: int,
    past: Sequence[FailureRecord],
    detail: dict[str, Any],
    now: float,
) -> _Outcome:
    attempts = [{"at": f.at.isoformat(), "exitCode": f.exit_code, "reason": f.code} for f in past]
    attempts.append({"at": _iso(now), "exitCode": fault.exit_code, "reason": fault.code})
    why = (
        f"RetriesExhausted: {fault.code} ({fault.what}): {fault.reason}; gave up after "
        f"{retry} failed attempts (maxRetries {pol.max_retries})"
    )
    msg = f"{fault.code}: {fault.reason}; no retries left after {retry} failed attempts "
    msg += f"[exit-code={_tail(fault)} final]"
    detail["final"] = True
    detail["attempts"] = attempts
    return _Outcome(
        PhaseChange(rec.name, "Failed", why),
        AuditEntry(SCHEDULER, "workload.fail", "Workload", rec.name, detail),
        (rec.name, "Warning", FAILED_EVENT, msg),
    )


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def load_holds(ctl: Context, stored_reasons: Mapping[str, str], now: float) -> None:
    """After a restart: the backoff of every Pending workload whose stored reason says Backoff."""
    ctl.faults.holds.clear()
    for name, reason in stored_reasons.items():
        if not reason.startswith(f"{BACKOFF_CODE}:"):
            continue
        past = failures(ctl.store.list_events(name))
        if past and past[-1].retry_at is not None and past[-1].retry_at > now:
            ctl.faults.holds[name] = past[-1].retry_at


def held(state: FaultState, pending: Mapping[str, Any], now: float) -> set[str]:
    """Pending workloads still in backoff (expired or no longer pending holds are dropped)."""
    for n in [n for n, t in state.holds.items() if t <= now or n not in pending]:
        del state.holds[n]
    return set(state.holds)
