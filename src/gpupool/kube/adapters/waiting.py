"""Why a pending workload waits, as the Kubernetes objects show it (pod condition, Event, mirror).

Why a module of its own: the status writer (``status``) builds these from the controller and
the Workload mirrors (``mirror``) show them; with the value here, the mirror needs nothing of
the writer, and the writer imports the mirror without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pending workload's reason as ``explain`` gives it, with its queue position."""

    code: str
    reason: str
    queue: str
    position: int | None
    length: int

    def message(self) -> str:
        where = f"position {self.position} of {self.length} in queue {self.queue}" if self.position else ""
        return f"gpupool: {self.code}: {self.reason}" + (f" ({where})" if where else "")
