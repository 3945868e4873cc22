"""Request body size limits, answered with 413 in the contract's error body.

JSON bodies (job specs, dataset registrations) are small; a cap keeps a client from making the
server buffer an arbitrarily large body. Uploads have their own, larger limit
(`settings.max_upload_bytes`, enforced while streaming in `api.uploads`), so their path is exempt.
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response

MAX_JSON_BYTES = 1 << 20


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes")


def content_length(headers: Headers) -> int | None:
    """The declared body size, or None when absent or not a number."""
    value = headers.get("content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class BodyLimit:
    """Refuse bodies over `max_bytes`: by Content-Length before reading, else while reading."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, exempt: Collection[str] = ()) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = frozenset(exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        declared = content_length(Headers(scope=scope))
        if declared is not None and declared > self.max_bytes:
            response = error_response(413, f"request body exceeds {self.max_bytes} bytes")
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)
