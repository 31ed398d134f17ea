"""The workload lifecycle: which phase may follow which, and which phases end a workload.

Why its own module: the store enforces these rules on every phase change, and the service and
the Kubernetes source read the same sets to tell a finished workload from a live one.
"""

from __future__ import annotations

from collections.abc import Mapping

TERMINAL_PHASES = frozenset({"Succeeded", "Failed", "Cancelled", "Rejected"})
ALLOWED_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "Pending": frozenset({"AwaitingApproval", "Admitted", "Rejected", "Cancelled", "Failed"}),
    "AwaitingApproval": frozenset({"Pending", "Admitted", "Rejected", "Cancelled"}),
    "Admitted": frozenset({"Running", "Pending", "Preempted", "Cancelled", "Failed", "Succeeded"}),
    # Running -> Pending: a failed run requeued by its retry policy (the backend already stopped it)
    "Running": frozenset({"Succeeded", "Failed", "Cancelled", "Preempted", "Pending"}),
    "Preempted": frozenset({"Pending", "Cancelled", "Failed"}),
    **{p: frozenset() for p in TERMINAL_PHASES},
}
#: phases whose event is a Warning (the others are Normal)
WARNING_PHASES = frozenset({"Failed", "Rejected", "Preempted"})
EVENT_TYPES = ("Normal", "Warning")
