"""Errors under `/openai/` in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

The app's handlers (api.errors) answer as usual; for a request under the prefix their body is
rewritten, and an invalid request is 400 (`invalid_request_error`) as OpenAI answers it, not
the 422 of `/v1`: clients written against OpenAI catch `openai.BadRequestError`, which a 422
never raises. Every other status is the same in both views.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

PREFIX = "/openai/"

# Torchyard's status -> OpenAI's, where they differ.
OPENAI_STATUS = {422: 400}

TYPE_OF_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}

Handler = Callable[[Request, Exception], Awaitable[Response]]


def openai_body(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """Torchyard's error body as OpenAI's: `param` is the first detail's field path (without
    `body`/`query`/`path`), `code` Torchyard's error code."""
    error = body.get("error", {})
    details = error.get("details") or []
    param = None
    if details:
        loc = [str(p) for p in details[0].get("loc", [])]
        if loc and loc[0] in ("body", "query", "path", "header"):
            loc = loc[1:]
        param = ".".join(loc) or None
    kind = TYPE_OF_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {
        "error": {
            "message": error.get("message", ""),
            "type": kind,
            "param": param,
            "code": error.get("code"),
        }
    }


def _wrap(handler: Handler) -> Handler:
    async def handle(request: Request, exc: Exception) -> Response:
        response = await handler(request, exc)
        if not request.url.path.startswith(PREFIX) or not isinstance(response, JSONResponse):
            return response
        body = json.loads(bytes(response.body))
        kept = {"www-authenticate", "allow", "retry-after"}
        headers = {k: v for k, v in response.headers.items() if k.lower() in kept}
        status = OPENAI_STATUS.get(response.status_code, response.status_code)
        return JSONResponse(openai_body(status, body), status_code=status, headers=headers or None)

    return handle


def install(app: FastAPI) -> None:
    """Wrap every exception handler installed so far (call after `api.errors.install`) and
    the OpenAPI document's builder (after `api.openapi_examples.install`)."""
    for key, handler in list(app.exception_handlers.items()):
        app.exception_handlers[key] = _wrap(handler)  # type: ignore[arg-type]
    build = app.openapi

    def openapi() -> dict[str, Any]:
        return documented(build())

    app.openapi = openapi  # type: ignore[method-assign]


def documented(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with no 422 under `/openai/`: FastAPI adds its own 422 to every operation
    with parameters or a body, unless the operation states one; these answer 400 instead
    (`RESPONSES`). Changes `document` in place (it is built once and cached) and returns it."""
    for path, item in document.get("paths", {}).items():
        if path.startswith(PREFIX):
            for operation in item.values():
                operation.get("responses", {}).pop("422", None)
    return document


class OpenAIErrorInfo(BaseModel):
    """The error in OpenAI's shape."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    message: str
    """What went wrong, in one line."""
    type: str
    """OpenAI's kind of error: `authentication_error`, `permission_error`,
    `invalid_request_error`, `rate_limit_error` or `server_error`."""
    param: str | None
    """The first bad field's path (`after`, `method.dpo.hyperparameters.beta`), else null."""
    code: str | None
    """Torchyard's error code, such as `not_found` or `validation_error`."""


class OpenAIErrorBody(BaseModel):
    """The body of every non-2xx answer under `/openai/v1`."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    error: OpenAIErrorInfo
    """What went wrong."""


RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": OpenAIErrorBody, "description": desc}
    for status, desc in {
        400: "Invalid request (`invalid_request_error`); `param` names the first bad field",
        401: "Missing, unknown or revoked API key",
        404: "No such file, model or job in the caller's project",
        409: "The resource is in a state that forbids the request",
    }.items()
}
"""The errors every operation under `/openai/v1` may answer, documented on its routers."""
