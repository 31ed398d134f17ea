"""Watch streams: newline-delimited JSON events, bookmarks, timeouts, 410 Gone, dropped streams.

Why a buffer per stream fed under the store lock: a bookmark may only carry the current
resourceVersion when every earlier event for this stream has already been written, otherwise
a client resuming from the bookmark would skip events. Taking the store lock while checking
that the buffer is empty makes that true.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from gpupool.kube.fake.errors import ApiError
from gpupool.kube.fake.resources import ResourceType
from gpupool.kube.fake.selectors import Pred
from gpupool.kube.fake.storage import Event, Store

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


def event_line(ev: Event) -> bytes:
    """The encoded watch line of an event, made once and shared by all streams."""
    line = ev.line
    if line is None:
        line = ev.line = (
            json.dumps({"type": ev.type, "object": ev.obj}, separators=(",", ":")).encode() + b"\n"
        )
    return line


class WatchStream:
    """One open watch: receives events from the store, writes them to the client."""

    def __init__(self, store: Store, rt: ResourceType, loop: asyncio.AbstractEventLoop) -> None:
        self.store, self.rt, self.loop = store, rt, loop
        self.buf: deque[Event] = deque()
        self.wake = asyncio.Event()
        self.closed = False
        self._loop_thread = threading.get_ident()
        #: re-encodes each event (kubectl's ``as=Table`` watch); None: the shared line
        self.encode: Callable[[Event], bytes] | None = None

    def offer(self, ev: Event) -> None:
        self.buf.append(ev)
        if threading.get_ident() == self._loop_thread:
            self.wake.set()
        else:
            self.loop.call_soon_threadsafe(self.wake.set)

    def close(self) -> None:
        self.closed = True
        self.loop.call_soon_threadsafe(self.wake.set)

    async def run(
        self,
        send: Send,
        receive: Receive,
        ns: str,
        pred: Pred | None,
        since: int | None,
        opts: dict[str, Any],
    ) -> None:
        """Serve the stream until timeout, client disconnect, server stop or an injected drop."""
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"cache-control", b"no-cache")],
            }
        )
        try:
            replay, start_rv = self.store.watch(self.rt, ns, pred, since, self)
        except ApiError as exc:
            body = json.dumps({"type": "ERROR", "object": exc.status()}).encode() + b"\n"
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        watcher = asyncio.ensure_future(self._watch_disconnect(receive))
        try:
            encode = self.encode or event_line
            chunk = b"".join(encode(e) for e in replay)
            if opts.get("initial_events_end") and since is None:
                chunk += self._bookmark(start_rv, initial_end=True)
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await self._pump(send, opts)
        finally:
            watcher.cancel()
            self.store.unwatch(self.rt, self)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _watch_disconnect(self, receive: Receive) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                self.closed = True
                self.wake.set()
                return

    async def _pump(self, send: Send, opts: dict[str, Any]) -> None:
        now = time.monotonic()
        deadline = now + float(opts.get("timeout", 1800))
        drop_at = now + opts["drop_after"] if opts.get("drop_after") else None
        bookmarks, interval = bool(opts.get("bookmarks")), float(opts.get("bookmark_interval", 1.0))
        next_bm = now + interval
        while not self.closed:
            now = time.monotonic()
            if drop_at is not None and now >= drop_at:
                self.store.stats.watches_dropped += 1
                return
            if now >= deadline:
                return
            if bookmarks and now >= next_bm:
                next_bm = now + interval
                line = self._bookmark_if_idle()
                if line:
                    await send({"type": "http.response.body", "body": line, "more_body": True})
            until = min(deadline, next_bm if bookmarks else deadline, drop_at or deadline)
            try:
                await asyncio.wait_for(self.wake.wait(), max(0.001, until - now))
            except TimeoutError:
                continue
            self.wake.clear()
            lines = []
            encode = self.encode or event_line
            while self.buf:
                lines.append(encode(self.buf.popleft()))
            if lines and not self.closed:
                await send({"type": "http.response.body", "body": b"".join(lines), "more_body": True})

    def _bookmark_if_idle(self) -> bytes:
        with self.store.lock:
            if self.buf:
                return b""
            return self._bookmark(self.store.rv)

    def _bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        md: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            md["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": self.rt.kind, "apiVersion": self.rt.api_version, "metadata": md}
        return json.dumps({"type": "BOOKMARK", "object": obj}, separators=(",", ":")).encode() + b"\n"
