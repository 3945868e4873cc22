"""What a resource of the client (`client.keys`, `client.sweeps`, `client.exports`, ...) needs of
the `torchyard.client.Client` it belongs to: a `Transport`. The resources import this protocol,
never the client, so the client can import them all without an import circle (issue 46)."""

from __future__ import annotations

from typing import Any, Protocol

import httpx


class Transport(Protocol):
    """The API connection a resource calls through (`torchyard.client.Client` is one).

    `base_url`: the API's address; `timeout`: seconds per request; `http`: the pooled
    `httpx.Client` (base URL and key set) for what `request` does not cover, streamed downloads
    and non-JSON answers."""

    base_url: str
    timeout: float

    @property
    def http(self) -> httpx.Client: ...

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        files: Any = None,
        data: dict[str, str] | None = None,
        timeout: httpx.Timeout | float | None = None,
    ) -> Any:
        """Send one request; the decoded JSON answer (None for an empty body). Raises the
        `torchyard.errors.ApiError` for the status, or `ConnectionFailed`."""
        ...
