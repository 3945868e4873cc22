"""Each operation documents the permission it needs, from its own dependencies.

A route states what it needs by its principal's type (`api.deps.ReadPrincipal`, ...); the
dependency carries a `permission` attribute. `document` copies it into the operation as the
`x-permission` extension and a sentence of its description, so the OpenAPI contract names it
and tests can check every route against it (tests/integration/api/access/test_access.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from core.access.auth import ROLE_PERMISSIONS, Permission

AUTHENTICATED = "authenticated"
ORG_ADMIN = "org_admin"


def _found(dependant: Dependant) -> list[str]:
    """The `permission` marks of `dependant`'s dependencies, outermost first."""
    marks: list[str] = []
    for dep in dependant.dependencies:
        mark = getattr(dep.call, "permission", None)
        if isinstance(mark, str):
            marks.append(mark)
        marks.extend(_found(dep))
    return marks


def route_permission(route: APIRoute) -> str | None:
    """What `route` needs: a scope (`jobs:read`, ...), `org_admin`, `authenticated` (any valid
    key), or None for a public route."""
    marks = _found(route.dependant)
    specific = [mark for mark in marks if mark != AUTHENTICATED]
    return specific[0] if specific else (marks[0] if marks else None)


def sentence(permission: str) -> str:
    """How the description states `permission`."""
    if permission == AUTHENTICATED:
        return "Permission: any valid key."
    if permission == ORG_ADMIN:
        return "Permission: an organisation admin key."
    roles = [r.value for r, held in ROLE_PERMISSIONS.items() if Permission(permission) in held]
    return (
        f"Permission: `{permission}` (roles: {', '.join(roles)}; a key needs this scope);"
        " otherwise 403 `forbidden`."
    )


def document(router: APIRouter) -> None:
    """Write each documented route's permission into its operation (`x-permission`)."""
    for route in router.routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        extra: dict[str, Any] = dict(route.openapi_extra or {})
        permission = extra.get("x-permission") or route_permission(route)
        if permission is None:
            continue  # a public route
        extra["x-permission"] = permission
        route.openapi_extra = extra
        if "Permission:" not in (route.description or ""):  # once, whatever create_app runs
            route.description = f"{route.description.rstrip()}\n\n{sentence(permission)}".lstrip()
        if permission != AUTHENTICATED:
            route.responses = {**route.responses, 403: _forbidden(route, permission)}


def _forbidden(route: APIRoute, permission: str) -> dict[str, Any]:
    """The route's 403 response: the permission it lacks (and any 403 it documented)."""
    lacking = f"The caller lacks `{permission}`"
    earlier = route.responses.get(403, {}).get("description", "")
    if earlier.startswith(lacking):
        return route.responses[403]
    response: dict[str, Any] = dict(route.responses.get(403, {}))
    response["description"] = f"{lacking}" + (f"; or {earlier}" if earlier else "")
    if route.path.startswith("/v1/") and "model" not in response:
        response["content"] = {"application/json": {"schema": {"$ref": _ERROR_BODY}}}
    return response


_ERROR_BODY = "#/components/schemas/ErrorBody"
