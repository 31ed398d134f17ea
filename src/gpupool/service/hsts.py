"""``Strict-Transport-Security`` on every answer served over HTTPS.

Why on the scheme of the request rather than a setting: RFC 6797 lets the header count only
when it arrives over a secure connection, and the scheme is what uvicorn reports for it (https
with ``gpupool serve --tls-cert``, or a trusted proxy's ``X-Forwarded-Proto``). So a plain HTTP
server never sends it and an HTTPS one always does, the dashboard and every error included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: one year, the value browsers' preload lists ask for; subdomains are not the server's to bind
HSTS_VALUE: Final = b"max-age=31536000"


class StrictTransport:
    """ASGI middleware adding the HSTS header to the response start of an https request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((b"strict-transport-security", HSTS_VALUE))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_header)
