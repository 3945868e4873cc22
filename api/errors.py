"""One error body for every failure (docs/CONTRACTS.md, section 4).

``{"error": {"code": str, "message": str, "details": [{"loc": [...], "msg": str, "type": str}]}}``

Domain errors from `core` map to their status here; request validation, unknown routes and
anything unexpected get the same shape, so a client parses one thing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import DataError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from core.jobs import references
from core.platform import errors as domain
from core.platform.server_paths import ServerPaths
from jobspec.job import SPEC_KINDS

log = logging.getLogger("torchyard.api")

STATUS_OF: dict[type[domain.DomainError], int] = {
    domain.Unauthorized: 401,
    domain.Forbidden: 403,
    domain.NotFound: 404,
    domain.Conflict: 409,
    domain.Gone: 410,
    domain.TooLarge: 413,
    domain.InvalidInput: 422,
    domain.Unavailable: 503,
    domain.TooManyRequests: 429,
}
CODE_OF_STATUS: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    410: "gone",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


class ErrorDetail(BaseModel):
    """One problem with the request, at one place in it."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    loc: list[str | int]
    """Where: `body`, `query`, `path` or `header`, then field names and list indexes."""
    msg: str
    """What is wrong, in words."""
    type: str
    """A stable name for the kind of problem, such as `missing` or `greater_than_equal`."""
    line: int | None = None
    """1-based line of the field in a YAML/JSON text checked by `POST /v1/spec/validate`."""
    column: int | None = None
    """1-based column of the field on that line, where known."""


class ErrorInfo(BaseModel):
    """The error: a code, a message and, for bad input, each problem."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    code: str
    """A stable name per HTTP status, such as `not_found`, `conflict` or `validation_error`."""
    message: str
    """What went wrong, in one line."""
    details: list[ErrorDetail] = []
    """Each problem with the request (bad input); else empty."""


class ErrorBody(BaseModel):
    """The body of every non-2xx answer."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    error: ErrorInfo
    """What went wrong."""


LAST_ORG_ADMIN = {
    "model": ErrorBody,
    "description": "It would leave the organisation no active organisation admin credential",
}
"""The 409 of operations that would take away the organisation's last admin credential."""


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    details: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {
        "error": {
            "code": code or CODE_OF_STATUS.get(status, f"http_{status}"),
            "message": _text(message),
            "details": [_detail(d) for d in details or []],
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)


def _detail(d: dict[str, Any]) -> dict[str, Any]:
    """Only `loc`, `msg`, `type` (and `line`, `column` where a text was parsed), JSON-safe
    (pydantic errors also carry inputs and contexts)."""
    loc = [part if isinstance(part, int) else _text(part) for part in d.get("loc", ())]
    out = {"loc": loc, "msg": _text(d.get("msg", "")), "type": _text(d.get("type", ""))}
    for key in ("line", "column"):
        if type(d.get(key)) is int:
            out[key] = d[key]
    return out


def _text(value: object) -> str:
    """`value` as a string that encodes to UTF-8 (a request may carry lone surrogates)."""
    return str(value).encode("utf-8", "replace").decode("utf-8")


def status_of(exc: domain.DomainError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 400


async def _domain_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, domain.DomainError)
    status = status_of(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if isinstance(exc, domain.TooManyRequests):
        headers = {"Retry-After": str(exc.retry_after_s)}
    # A message may name a file of the server (a checkpoint gone, an unreadable upload).
    paths: ServerPaths = request.app.state.server_paths
    message, details = paths.hide(exc.message), paths.hide(exc.details)
    return error_response(status, message, code=exc.code, details=details, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [{**e, "loc": _without_kind(tuple(e.get("loc", ())))} for e in exc.errors()]
    route = request.scope.get("route")
    if getattr(route, "operation_id", None) in SPEC_BODY_OPERATIONS and isinstance(exc.body, dict):
        # every problem of the spec in one answer, not pydantic's first layer (issue 28)
        found = await run_in_threadpool(_spec_problems, request, exc.body)
        if found:
            errors = [e for e in errors if e["loc"][:1] != ["body"]] + found
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    message = f"invalid request: {where}: {first.get('msg', '')}" if errors else "invalid request"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return error_response(422, message, details=errors)


# Operations whose body is a job spec: a refused one gets `core.jobs.references.problems`.
SPEC_BODY_OPERATIONS = frozenset({"jobs_create"})


def _spec_problems(request: Request, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every problem of a job spec body: its fields and rules, then its references when the
    caller is known (the auth dependency ran before the body was refused)."""
    principal = getattr(request.state, "principal", None)
    settings = request.app.state.settings
    if principal is None:
        return references.problems(session=None, settings=settings, project_id=None, data=body)
    with request.app.state.sessionmaker() as session:
        return references.problems(
            session=session, settings=settings, project_id=principal.project_id, data=body
        )


def _without_kind(loc: tuple[Any, ...]) -> list[Any]:
    """A body's `loc` without the job-spec union's tag (`["body", "script", "entrypoint"]` ->
    `["body", "entrypoint"]`, a sweep's `["body", "base", "trainer", "optim"]` -> `["body",
    "base", "optim"]`): clients see the JSON path of the field they sent."""
    if len(loc) > 1 and loc[0] == "body" and loc[1] in SPEC_KINDS:
        return [loc[0], *loc[2:]]
    if len(loc) > 2 and loc[:2] == ("body", "base") and loc[2] in SPEC_KINDS:  # a sweep's base
        return [*loc[:2], *loc[3:]]
    return list(loc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        # FastAPI's "error parsing the body" (e.g. JSON nested too deep): a body fault like any.
        detail = {"loc": ["body"], "msg": str(exc.detail), "type": "body_unparseable"}
        return error_response(422, f"body: {exc.detail}", details=[detail])
    headers = exc.headers
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
    return error_response(exc.status_code, str(exc.detail), headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (RFC 9110: a 405's `Allow`).

    Starlette answers 405 from the first route whose path matches, naming only that route's
    methods; FastAPI has one route per method, so the others must be gathered here.
    """
    routes = [r for r in _flat(request.app.router.routes) if isinstance(r, Route)]
    scope = {**request.scope, "method": "GET"}
    # The documented path this URL routes to (the first route whose path matches, as the
    # router decides), then every method some route of that same path template serves.
    template = next((r.path for r in routes if r.matches(scope)[0] != Match.NONE), None)
    methods: set[str] = set()
    for route in routes:
        if route.path == template:
            methods |= route.methods or set()
    return sorted(methods)


def _flat(routes: Iterable[Any]) -> Iterator[Any]:
    """The routes, with those of routers FastAPI keeps included (not flattened) inlined."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from _flat(inner.routes) if inner is not None else (route,)


async def _data_error(request: Request, exc: Exception) -> JSONResponse:
    # A value the database cannot store (out of range, NUL byte). Inputs are bounded before
    # they reach the database, so this is a last line of defence, not the usual path.
    log.warning("database rejected a value on %s %s: %s", request.method, request.url.path, exc)
    return error_response(422, "a value in the request cannot be stored")


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.error("database unavailable on %s %s: %s", request.method, request.url.path, exc)
    return error_response(503, "the database is unavailable; try again later")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal server error")


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the contract's body."""
    app.add_exception_handler(domain.DomainError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(DataError, _data_error)
    app.add_exception_handler(OperationalError, _unavailable)
    app.add_exception_handler(Exception, _unexpected)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": desc}
    for status, desc in {
        401: "Missing, unknown or revoked API key",
        404: "No such resource in the caller's project",
        422: "Invalid request; `details` name each bad field by its JSON path",
    }.items()
}
