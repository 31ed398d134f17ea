"""The simulators' thread: hears every committed write, runs controllers and the kubelet, and
fires their timers.

Why a thread of its own with a queue: the store calls listeners under its lock, so a listener
only enqueues; the controllers then write back through the same verbs as any client, without
re-entering a write that is still in progress.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpupool.kube.fake.errors import ApiError
from gpupool.kube.fake.resources import ResourceType
from gpupool.kube.fake.storage import Obj

if TYPE_CHECKING:
    from gpupool.kube.fake.server import FakeApiServer

Handler = Callable[[ResourceType, str, Obj, Obj | None], None]


class Runtime:
    """Event queue + timer heap + the simulators registered on it."""

    def __init__(self, srv: FakeApiServer, controllers: bool, kubelet: bool, hami: bool) -> None:
        self.srv = srv
        self.q: queue.SimpleQueue[tuple[ResourceType, str, Obj, Obj | None] | None] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.handlers: dict[str, list[Handler]] = {}
        self.errors: list[str] = []
        self.sims: list[Any] = []
        if controllers:
            from gpupool.kube.fake.controllers import install as install_controllers

            install_controllers(self)
        if kubelet:
            from gpupool.kube.fake.kubelet import install as install_kubelet

            install_kubelet(self, hami)
        if self.handlers:
            srv.store.listeners.append(self._listen)

    def on(self, key: str, fn: Handler) -> None:
        self.handlers.setdefault(key, []).append(fn)

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the simulator thread after ``seconds`` (already scaled by the caller)."""
        heapq.heappush(self._timers, (time.monotonic() + seconds, next(self._seq), fn))
        self.q.put(None)

    def _listen(self, rt: ResourceType, etype: str, obj: Obj, old: Obj | None) -> None:
        if rt.key in self.handlers:
            self.q.put((rt, etype, obj, old))

    def start(self) -> None:
        if self._thread is None and self.handlers:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="fake-simulators", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop = True
            self.q.put(None)
            self._thread.join(5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop:
            wait = self._timers[0][0] - time.monotonic() if self._timers else 0.5
            try:
                item = self.q.get(timeout=max(0.0, min(wait, 0.5)))
            except queue.Empty:
                item = None
            if item is not None:
                self._dispatch(*item)
            while self._timers and self._timers[0][0] <= time.monotonic():
                _, _, fn = heapq.heappop(self._timers)
                self._guard(fn)

    def _dispatch(self, rt: ResourceType, etype: str, obj: Obj, old: Obj | None) -> None:
        for fn in self.handlers.get(rt.key, ()):
            self._guard(functools.partial(fn, rt, etype, obj, old))

    def _guard(self, fn: Callable[[], None]) -> None:
        """Conflicts and vanished objects are normal for a controller; record anything else."""
        try:
            fn()
        except ApiError as exc:
            if exc.code not in (404, 409):
                self.errors.append(exc.message)
        except Exception as exc:  # a simulator bug must not kill the thread; tests assert errors == []
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def idle(self) -> bool:
        """True when no write is waiting to be handled (tests poll this to settle)."""
        return self.q.empty()
