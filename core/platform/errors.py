"""Domain errors. The API maps each to one HTTP status with one body shape."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base class: `code` is the machine-readable error code in the API body."""

    code = "error"

    def __init__(self, message: str, *, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class NotFound(DomainError):
    code = "not_found"


class Conflict(DomainError):
    code = "conflict"


class InvalidInput(DomainError):
    """Input that parsed but is wrong: `details` carry `loc` paths like a 422 from pydantic."""

    code = "validation_error"


class TooLarge(DomainError):
    code = "payload_too_large"


class Gone(DomainError):
    """The resource existed and has ended for good (a training session past its idle timeout):
    410, which the Tinker client takes as "stop" (its heartbeat loop ends)."""

    code = "gone"


class Unauthorized(DomainError):
    code = "unauthorized"


class Forbidden(DomainError):
    code = "forbidden"


class Unavailable(DomainError):
    """A service the request depends on (such as the SSO issuer's JWKS) cannot be reached: 503."""

    code = "unavailable"


class TooManyRequests(DomainError):
    """Come back later: `retry_after_s` becomes the `Retry-After` header (seconds)."""

    code = "too_many_requests"

    def __init__(
        self, message: str, *, retry_after_s: int, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message, details=details)
        self.retry_after_s = max(1, int(retry_after_s))


class QuotaExceeded(TooManyRequests):
    """A project quota refuses more (`max_queued_jobs` at submission)."""

    code = "quota_exceeded"
