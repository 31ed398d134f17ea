"""A run's failure as it is stored: the ``RunFailed`` event and its machine-readable tail, read back.

Why a module of its own, this low: the service writes one ``RunFailed`` event per failure (its
message ends with ``[exit-code=137 retry-at=...]`` or ``[exit-code=... final]``), and more than
the service reads them back: the controller derives attempts and backoffs after a restart, the
API shows a workload's failures, and the cost history (``gpupool.cost.history``) counts them.
Reading a stored event needs nothing above the store, so the cost reports need not import the
service to do it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpupool.store.records import EventRecord

#: the reason of the event recorded for every failed run
FAILED_EVENT = "RunFailed"

_TAIL = re.compile(r" \[exit-code=(?P<code>\S+) (?:retry-at=(?P<at>[0-9.]+)|final)\]$")


def iso_seconds(ts: float) -> str:
    """A Unix time as ISO 8601 in UTC, to the second (as failures are shown and written)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class FailureRecord:
    at: datetime
    code: str
    reason: str
    exit_code: int | None
    retry_at: float | None  # None: the final failure

    def view(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "exitCode": self.exit_code,
            "reason": f"{self.code}: {self.reason}",
            "retryAt": iso_seconds(self.retry_at) if self.retry_at is not None else None,
        }


def parse_failure(ev: EventRecord) -> FailureRecord | None:
    """A stored ``RunFailed`` event back as a record (None for any other event)."""
    if ev.reason != FAILED_EVENT:
        return None
    m = _TAIL.search(ev.message)
    head = ev.message[: m.start()] if m else ev.message
    code, _, why = head.partition(": ")
    exit_code = None
    if m and m["code"] != "none":
        try:
            exit_code = int(m["code"])
        except ValueError:
            exit_code = None
    retry_at = float(m["at"]) if m and m["at"] else None
    return FailureRecord(ev.at, code, why.split("; retry ")[0].split("; no retries")[0], exit_code, retry_at)


def failures(events: Iterable[EventRecord]) -> list[FailureRecord]:
    return [f for e in events if (f := parse_failure(e)) is not None]


def history_view(events: Sequence[EventRecord]) -> dict[str, Any]:
    """``attempts`` (runs started) and ``failures`` [{at, exitCode, reason, retryAt}] of a workload."""
    return {
        "attempts": sum(1 for e in events if e.reason == "Running"),
        "failures": [f.view() for f in failures(events)],
    }
