"""The audit log's writer: an ASGI middleware that records every mutating request (POST, PUT,
PATCH, DELETE) and every 401/403 answer on any method (core.access.audit).

Pure ASGI (not `BaseHTTPMiddleware`): responses pass through unbuffered; only the small JSON
body of a `201 Created` is kept (up to 64 KiB) to name the created resource. The row is written
after the answer has been sent, in a transaction of its own in the thread pool (one INSERT), so
it adds no latency before the client's last byte; a row that cannot be written is logged and
never turns the answer into an error. The price: a process that dies between the answer and
the INSERT loses that row.

Who called is what `api.deps.get_principal` left in `request.state.principal` (the ASGI
scope's `state`); no principal means the request had no valid credentials (`anonymous`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
from fastapi import Request
from fastapi.routing import APIRoute
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.openapi_ids import operation_id
from core.access import audit
from core.access.auth import Principal
from core.access.oidc import KEY_ID_PREFIX
from core.platform.logs import request_id_var

log = logging.getLogger("torchyard.audit")

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CREATED_BODY_MAX = 64 * 1024
_QUIET = "audit_quiet"
_TARGET = "audit_target"


def not_audited(request: Request) -> None:
    """A route dependency: this POST only reads or keeps something alive (the Tinker client's
    config fetches and its heartbeat every 10 s), so it is audited only when refused (401,
    403), not on every call."""
    setattr(request.state, _QUIET, True)


def name_target(request: Request, target: str) -> None:
    """Name what the request acted on in its audit row, where no path parameter and no `id`
    of a 201 body does (a created Tinker session: `session_id` of a 200)."""
    setattr(request.state, _TARGET, target)


class AuditLog:
    """ASGI middleware writing one `audit_events` row per audited request."""

    def __init__(self, app: ASGIApp, *, engine: Engine, trusted_proxies: int = 0) -> None:
        self.app = app
        self.engine = engine
        self.trusted_proxies = trusted_proxies
        self._operations: dict[int, str] = {}  # id(route) -> its operationId

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        mutating = scope["method"] in MUTATING
        status = 500  # what the server error handler answers when the app raises
        created: list[bytes] | None = None

        async def send_and_watch(message: Message) -> None:
            nonlocal status, created
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if mutating and status == 201 and _is_json(message):
                    created = []
            elif message["type"] == "http.response.body" and created is not None:
                created.append(message.get("body", b""))
                if sum(map(len, created)) > _CREATED_BODY_MAX:
                    created = None
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            quiet = bool((scope.get("state") or {}).get(_QUIET))
            if (mutating and not quiet) or status in (401, 403):
                event = self._event(scope, status, b"".join(created or ()))
                with anyio.CancelScope(shield=True):  # a client that hung up is still audited
                    await run_in_threadpool(self._write, event)

    def _event(self, scope: Scope, status: int, created_body: bytes) -> audit.Event:
        state = scope.get("state") or {}
        principal = state.get("principal")
        if not isinstance(principal, Principal):
            principal = None
        route = scope.get("route")
        params = scope.get("path_params") or {}
        target = state.get(_TARGET) or next((str(value) for value in params.values()), None)
        if target is None and created_body:
            target = _created_id(created_body)
        if principal is None:
            kind = audit.ActorKind.ANONYMOUS
        elif principal.key_id.startswith(KEY_ID_PREFIX):
            kind = audit.ActorKind.OIDC
        else:
            kind = audit.ActorKind.KEY
        return audit.Event(
            project_id=principal.project_id if principal else None,
            actor=principal.actor if principal else None,
            actor_kind=kind,
            key_id=principal.key_id if principal else None,
            method=scope["method"],
            path=scope.get("path", ""),
            operation=self._operation(route),
            target=target,
            status_code=status,
            source=self._source(scope),
            request_id=request_id_var.get(),
        )

    def _operation(self, route: object) -> str | None:
        """The route's operationId as the OpenAPI schema states it (api.openapi_ids): the
        matched route is the router's own, whose `unique_id` is FastAPI's default."""
        if not isinstance(route, APIRoute):
            return None
        key = id(route)
        if key not in self._operations:
            self._operations[key] = route.operation_id or operation_id(route)
        return self._operations[key]

    def _source(self, scope: Scope) -> str | None:
        client = scope.get("client")
        peer = str(client[0]) if client else None
        if self.trusted_proxies <= 0:
            return peer
        forwarded = [
            part.strip()
            for key, value in scope.get("headers", [])
            if key == b"x-forwarded-for"
            for part in value.decode("latin-1").split(",")
            if part.strip()
        ]
        if not forwarded:
            return peer
        return forwarded[-min(self.trusted_proxies, len(forwarded))]

    def _write(self, event: audit.Event) -> None:
        try:
            audit.record(engine=self.engine, event=event)
        except Exception:  # the answer is sent; an audit outage must not fail requests
            log.exception(
                "audit: cannot record %s %s -> %d", event.method, event.path, event.status_code
            )


def _is_json(message: Message) -> bool:
    return any(
        key == b"content-type" and value.startswith(b"application/json")
        for key, value in message.get("headers", [])
    )


def _created_id(body: bytes) -> str | None:
    """The `id` of a created resource's JSON body, if it has one."""
    try:
        document: Any = json.loads(body)
    except ValueError:
        return None
    value = document.get("id") if isinstance(document, dict) else None
    return str(value) if isinstance(value, str | int) else None
