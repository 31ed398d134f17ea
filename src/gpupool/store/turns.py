"""The leader lease's turn at the database: a bulk write steps aside between its batches.

Why: on SQLite one writer holds the database at a time, and a busy writer that commits batch
after batch can take the lock again before the lease keeper's busy handler retries, so the
keeper could wait past the lease's expiry (and the only server lose its own lease) behind a
write that is making progress. The keeper announces that it waits (``first``); a bulk writer
calls ``step_aside`` before each batch and lets it go first. On PostgreSQL the lease row is
not locked by a bulk write, so the turn costs nothing there but is kept for one behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: the longest a bulk writer waits for the lease keeper (the keeper's write is one UPDATE)
STEP_ASIDE_S = 5.0


class WriteTurn:
    """Counts lease writers waiting; bulk writers wait for none to be waiting."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._waiting = 0
        #: how many times a bulk writer waited for the keeper, and how many batches bulk
        #: writers committed (for tests and metrics)
        self.yields = 0
        self.batches = 0

    @contextmanager
    def first(self) -> Iterator[None]:
        """Around the lease keeper's write: bulk writers do not start a batch meanwhile."""
        with self._cv:
            self._waiting += 1
        try:
            yield
        finally:
            with self._cv:
                self._waiting -= 1
                self._cv.notify_all()

    def step_aside(self, timeout_s: float = STEP_ASIDE_S) -> None:
        """Before a bulk writer's next batch: let a waiting lease write go first."""
        with self._cv:
            if self._waiting:
                self.yields += 1
                self._cv.wait_for(lambda: self._waiting == 0, timeout_s)
