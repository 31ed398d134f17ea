"""Where the simulators run: on the server's event loop, fed every committed write.

Why the event loop and not a thread of their own: with a second thread, every write woke it and
the two traded the GIL for each request (a profile showed most of a bind's time in that
hand-off). On the loop the simulators take turns with requests, in batches, at no switching
cost. The store calls listeners under its lock, so a listener only queues the write; the
simulators then write back through the same verbs as any client, never inside another write.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpupool.kube.fake.errors import ApiError
from gpupool.kube.fake.resources import ResourceType
from gpupool.kube.fake.storage import Obj

if TYPE_CHECKING:
    from gpupool.kube.fake.server import FakeApiServer

Handler = Callable[[ResourceType, str, Obj, Obj | None], None]
BATCH = 256  # writes handled per turn, so requests are served in between


class Runtime:
    """The queue of writes, the timers, and the simulators registered on them."""

    def __init__(self, srv: FakeApiServer, controllers: bool, kubelet: bool, hami: bool) -> None:
        self.srv = srv
        self.pending: deque[tuple[ResourceType, str, Obj, Obj | None]] = deque()
        self.handlers: dict[str, list[Handler]] = {}
        self.errors: list[str] = []
        self.sims: list[Any] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._scheduled = False
        self._timers = 0
        if controllers:
            from gpupool.kube.fake.operators import install as install_controllers

            install_controllers(self)
        if kubelet:
            from gpupool.kube.fake.kubelet import install as install_kubelet

            install_kubelet(self, hami)
        if self.handlers:
            srv.store.listeners.append(self._listen)

    def on(self, key: str, fn: Handler) -> None:
        self.handlers.setdefault(key, []).append(fn)

    def start(self, loop: asyncio.AbstractEventLoop, loop_thread: int) -> None:
        """Run on ``loop`` from now on (writes queued before are handled first)."""
        self.loop, self._loop_thread = loop, loop_thread
        with self.srv.store.lock:
            self._wake()

    def stop(self) -> None:
        self.loop = None

    def after(self, seconds: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop after ``seconds`` (already scaled by the caller)."""
        loop = self.loop
        if loop is None:
            return
        self._timers += 1
        if threading.get_ident() == self._loop_thread:
            loop.call_later(seconds, self._fire, fn)
        else:
            loop.call_soon_threadsafe(loop.call_later, seconds, self._fire, fn)

    def _fire(self, fn: Callable[[], None]) -> None:
        self._timers -= 1
        if self.loop is not None:
            self._guard(fn)

    def _listen(self, rt: ResourceType, etype: str, obj: Obj, old: Obj | None) -> None:
        if rt.key in self.handlers:
            self.pending.append((rt, etype, obj, old))
            self._wake()

    def _wake(self) -> None:
        """Schedule a drain unless one is due (called under the store lock)."""
        loop = self.loop
        if loop is None or self._scheduled or not self.pending:
            return
        self._scheduled = True
        if threading.get_ident() == self._loop_thread:
            loop.call_soon(self._drain)
        else:
            loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self.srv.store.lock:
            self._scheduled = False
        for _ in range(BATCH):
            if not self.pending or self.loop is None:
                return
            rt, etype, obj, old = self.pending.popleft()
            for fn in self.handlers.get(rt.key, ()):
                self._guard(functools.partial(fn, rt, etype, obj, old))
        with self.srv.store.lock:
            self._wake()

    def _guard(self, fn: Callable[[], None]) -> None:
        """Conflicts and vanished objects are normal for a controller; record anything else."""
        try:
            fn()
        except ApiError as exc:
            if exc.code not in (404, 409):
                self.errors.append(exc.message)
        except Exception as exc:  # a simulator bug must not stop the loop; tests assert errors == []
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def idle(self) -> bool:
        """True when no write waits to be handled (tests poll this to settle)."""
        return not self.pending and not self._scheduled
