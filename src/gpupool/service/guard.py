"""The request guard: limits every request must meet before an endpoint sees it.

Why one ASGI middleware: the limits (body size, JSON nesting, text a store cannot keep, NUL in
the path or query) hold for every endpoint, including those whose body FastAPI parses itself,
and an unexpected exception must become a JSON 500 *inside* the app — Starlette's outermost
error middleware re-raises after answering, which made the server drop the kept-alive
connection after any 500. The parsed JSON body is left in the scope so the submit path does not
parse it twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote_to_bytes

from gpupool.manifests import unstorable_text

log = logging.getLogger("gpupool.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY = 4 << 20  # 4 MiB: a Cluster of thousands of explicit nodes still fits
PARSED_KEY = "gpupool.json"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class GuardError(Exception):
    def __init__(self, status: int, field: str, problem: str) -> None:
        super().__init__(problem)
        self.status, self.field, self.problem = status, field, problem


def error_body(status: int, message: str, errors: list[dict[str, str]]) -> bytes:
    return json.dumps({"error": {"status": status, "message": message, "errors": errors}}).encode()


async def _respond(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra)})
    await send({"type": "http.response.body", "body": body})


def _check_url(scope: Scope) -> None:
    if "\x00" in scope.get("path", ""):
        raise GuardError(422, "path", "contains a NUL character")
    raw = scope.get("query_string", b"")
    if raw and b"\x00" in unquote_to_bytes(raw):
        raise GuardError(422, "query", "contains a NUL character")


def _depth_ok(value: Any, limit: int) -> bool:
    """Iterative, so a hostile document cannot exhaust the stack here either."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            return False
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return True


def check_json(body: bytes, max_depth: int) -> Any:
    """The parsed body, or GuardError; None when it is not JSON (the endpoint reports that)."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except RecursionError:
        raise GuardError(422, "body", f"JSON nested more than {max_depth} levels deep") from None
    except ValueError:
        return None
    if not _depth_ok(value, max_depth):
        raise GuardError(422, "body", f"JSON nested more than {max_depth} levels deep")
    bad = unstorable_text(value)
    if bad is not None:
        raise GuardError(422, bad[0], bad[1])
    return value


class RequestGuard:
    """ASGI middleware: body size, JSON depth and text limits, and a JSON 500 that keeps the connection."""

    def __init__(self, app: ASGIApp, max_body: int = DEFAULT_MAX_BODY, max_depth: int = 32) -> None:
        self.app = app
        self.max_body = max_body
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            _check_url(scope)
            if scope.get("method") in _BODY_METHODS:
                receive = await self._buffer(scope, receive)
            await self.app(scope, receive, tracking_send)
        except GuardError as g:
            msg = f"{'request too large' if g.status == 413 else 'invalid request'}: {g.field}: {g.problem}"
            await _respond(
                send, g.status, error_body(g.status, msg, [{"field": g.field, "problem": g.problem}])
            )
        except Exception as exc:  # the last resort: never a traceback, never a dropped connection
            log.exception("unhandled error")
            if started:
                raise
            msg = f"internal error ({type(exc).__name__}); the request was not applied"
            await _respond(send, 500, error_body(500, msg, []))

    async def _buffer(self, scope: Scope, receive: Receive) -> Receive:
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise GuardError(413, "body", f"{int(declared):,} bytes; at most {self.max_body:,}")
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return receive
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise GuardError(413, "body", f"more than {self.max_body:,} bytes")
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        scope[PARSED_KEY] = check_json(body, self.max_depth)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay


__all__ = ["DEFAULT_MAX_BODY", "PARSED_KEY", "RequestGuard", "check_json"]
