"""One background thread per adapter part (the source, the status writer, the configuration
source): started, woken and stopped the same way, so each part says only what its loop does."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod


class LoopThread(ABC):
    """A daemon thread running ``self._run`` until ``stop``; ``_wake`` cuts its wait short.

    Why a mixin and not a wrapper: the loops read their owner's state on every pass, and the
    owners' tests drive ``_run``'s steps directly."""

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def _run(self) -> None:
        """The loop itself: until ``self._stop`` is set, wait on ``self._wake`` and do a pass."""

    def _start_loop(self, name: str) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _stop_loop(self) -> None:
        """Ask the loop to end and wait for it (at most 10 s: a daemon thread never holds up exit)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
