"""Exceptions raised by the SDK.

Every non-2xx answer from the API carries one body shape (docs/CONTRACTS.md, section 4)::

    {"error": {"code": str, "message": str, "details": [{"loc": [...], "msg": str, "type": str}]}}

`error_from_response` turns it into the `ApiError` subclass for its status, so callers can
``except NotFound`` instead of comparing numbers. Answers that do not follow the contract (a
proxy's HTML 502, say) still become an `ApiError`, with the start of the body as message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class TorchyardError(Exception):
    """Base class of everything the SDK raises on purpose."""


class ConnectionFailed(TorchyardError):
    """The API could not be reached at all (refused, DNS, TLS, timeout)."""


class ExportFailed(TorchyardError):
    """A checkpoint export ended `failed` (its `error` says why), or its download did not match
    the export's size and sha256."""


class ExportTimeout(TorchyardError, TimeoutError):
    """A checkpoint export was not ready within the time the caller gave it."""


@dataclass(frozen=True)
class ErrorDetail:
    """One entry of an error body's `details`: where (`loc`, a JSON path) and what (`msg`)."""

    loc: tuple[str | int, ...]
    msg: str
    type: str = ""

    @property
    def path(self) -> str:
        """`loc` as a dotted path without the request part, e.g. ``model.n_heads`` or
        ``data.include[0]``; ``<body>`` when the error is about the whole body."""
        parts = list(self.loc)
        if parts and parts[0] in ("body", "query", "path", "header"):
            parts = parts[1:]
        out = ""
        for part in parts:
            if isinstance(part, int):
                out += f"[{part}]"
            else:
                out += f".{part}" if out else str(part)
        return out or "<body>"


class ApiError(TorchyardError):
    """The API answered with an error status.

    Attributes: `status` (HTTP status), `code` (the contract's error code, e.g. ``not_found``),
    `message` (human-readable), `details` (field-level problems, mostly for 422).
    """

    def __init__(
        self, status: int, code: str, message: str, details: list[ErrorDetail] | None = None
    ) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []
        super().__init__(f"{status} {code}: {message}")


class BadRequest(ApiError):
    """400: the request was malformed."""


class Unauthorized(ApiError):
    """401: missing or wrong API key."""


class PermissionDenied(ApiError):
    """403: the key is valid but may not do this."""


class NotFound(ApiError):
    """404: no such job, dataset or route (or it belongs to another project)."""


class Conflict(ApiError):
    """409: illegal state transition (e.g. cancelling a finished job) or idempotency clash."""


class PayloadTooLarge(ApiError):
    """413: an upload over the server's size limit."""


class ValidationFailed(ApiError):
    """422: the spec or query is invalid; `details` name the JSON path of each bad field."""


class RateLimited(ApiError):
    """429: too many requests or over quota."""


class ServerError(ApiError):
    """5xx: the server failed; retrying later may help."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: RateLimited,
}


def error_class(status: int) -> type[ApiError]:
    """The `ApiError` subclass for an HTTP status."""
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, ApiError)


def error_from_response(status: int, body: Any, text: str = "") -> ApiError:
    """Build the exception for an error answer.

    `body` is the decoded JSON (or None when the body was not JSON); `text` the raw body, used
    for the message when the body does not follow the contract.
    """
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code") or f"http_{status}")
        message = str(err.get("message") or "")
        details = [_detail(d) for d in err.get("details") or [] if isinstance(d, dict)]
    elif isinstance(body, dict) and "detail" in body:
        # FastAPI's default shape, should a route escape the contract's handler.
        code, message, details = f"http_{status}", str(body["detail"]), []
    else:
        code, message, details = f"http_{status}", text.strip()[:500], []
    return error_class(status)(status, code, message or f"HTTP {status}", details)


def _detail(raw: dict[str, Any]) -> ErrorDetail:
    loc = tuple(p if isinstance(p, int) else str(p) for p in raw.get("loc") or ())
    return ErrorDetail(loc=loc, msg=str(raw.get("msg", "")), type=str(raw.get("type", "")))
