"""Request dependencies: the settings, a database session, and who is calling."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from core.access import auth, oidc
from core.platform.errors import Forbidden, Unauthorized
from core.platform.server_paths import ServerPaths
from core.platform.settings import Settings

# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` dependency in its
# thread pool, and each such hop costs the submit path more CPU than the work it wraps.


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_server_paths(request: Request) -> ServerPaths:
    """The server's directories, to keep out of answers (api.redaction)."""
    paths: ServerPaths = request.app.state.server_paths
    return paths


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request; rolled back unless a service or the route commits.

    Making a session does no I/O, and closing one whose transaction the route committed only
    returns its connection: both stay on the event loop. A session still in a transaction
    (a read, or a failed write) is rolled back in the thread pool."""
    session: Session = request.app.state.sessionmaker()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer ty_...`")

SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
ServerPathsDep = Annotated[ServerPaths, Depends(get_server_paths)]


def get_principal(
    request: Request,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> auth.Principal:
    """The caller's project. Raises Unauthorized (401) for a missing, unknown or revoked key.

    With SSO on (`app.state.oidc`), a bearer JWT is an OIDC token instead (core.access.oidc).
    Kept on `request.state.principal` for what runs after the route (the audit log)."""
    secret = credentials.credentials if credentials is not None else None
    principal = resolve_principal(request, session, secret)
    request.state.principal = principal
    return principal


def resolve_principal(request: Request, session: Session, secret: str | None) -> auth.Principal:
    """Who `secret` is: an OIDC token when SSO is on (`app.state.oidc`) and it looks like a JWT,
    else an API key. Raises Unauthorized (401), or Unavailable (503) when the issuer is down."""
    verifier: oidc.Verifier | None = getattr(request.app.state, "oidc", None)
    if verifier is not None and secret and oidc.looks_like_jwt(secret):
        project = request.headers.get(oidc.PROJECT_HEADER)
        return verifier.authenticate(session=session, token=secret, project=project)
    return auth.authenticate(session=session, secret=secret)


# What api.permissions writes into each operation's `x-permission` (any valid key will do).
get_principal.permission = "authenticated"  # type: ignore[attr-defined]


CurrentPrincipal = Annotated[auth.Principal, Depends(get_principal)]

# The official `tinker` client sends its key as `X-API-Key` and refuses, before any request, a
# key that does not start with `tml-` or look like a JWT (docs/TINKER-WIRE.md). So under
# `/tinker` a Torchyard key is given as `tml-<key>`: the same key, row, role, scopes, audit
# trail and revocation, only spelled so the client sends it. An SSO token (a JWT) goes as it is.
TINKER_KEY_PREFIX = "tml-"
_tinker_key = APIKeyHeader(
    name="X-API-Key",
    auto_error=False,
    description="`tml-` then an API key (`tml-ty_...`), as the `tinker` client sends it.",
)


def get_tinker_principal(
    request: Request,
    session: SessionDep,
    key: Annotated[str | None, Depends(_tinker_key)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> auth.Principal:
    """The caller under `/tinker`: `X-API-Key: tml-<key>` (or `Authorization: Bearer <key>`,
    as under `/v1`). Raises Unauthorized (401) for a missing, unknown or revoked key."""
    secret = key if key is not None else (credentials.credentials if credentials else None)
    if not secret:
        raise Unauthorized(f"missing API key: send 'X-API-Key: {TINKER_KEY_PREFIX}<key>'")
    principal = resolve_principal(request, session, secret.removeprefix(TINKER_KEY_PREFIX))
    request.state.principal = principal
    return principal


get_tinker_principal.permission = "authenticated"  # type: ignore[attr-defined]
TinkerPrincipal = Annotated[auth.Principal, Depends(get_tinker_principal)]


def require(
    permission: auth.Permission,
    caller: Callable[..., auth.Principal] = get_principal,
) -> Callable[[auth.Principal], Coroutine[Any, Any, auth.Principal]]:
    """A dependency: the caller (as `caller` finds it), when its role and scopes allow
    `permission`; else 403."""

    # A default, not `Annotated[...]`: annotations are strings here, and `caller` is local.
    async def dependency(principal: auth.Principal = Depends(caller)) -> auth.Principal:
        auth.check(principal, permission)
        return principal

    dependency.__name__ = f"require_{permission.name.lower()}"
    dependency.permission = permission.value  # type: ignore[attr-defined]  # api.permissions
    return dependency


async def require_org_admin(principal: CurrentPrincipal) -> auth.Principal:
    """A dependency: the caller, when its key is an organisation admin key; else 403."""
    if not principal.org_admin:
        raise Forbidden("an organisation admin key is needed (`torchyard admin bootstrap`)")
    return principal


require_org_admin.permission = "org_admin"  # type: ignore[attr-defined]


# What each route asks for: read anything in the project; submit/control jobs; write datasets;
# administer the project (members, keys, quotas, webhooks, audit).
ReadPrincipal = Annotated[auth.Principal, Depends(require(auth.Permission.READ))]
JobsWritePrincipal = Annotated[auth.Principal, Depends(require(auth.Permission.JOBS_WRITE))]
DatasetsWritePrincipal = Annotated[auth.Principal, Depends(require(auth.Permission.DATASETS_WRITE))]
AdminPrincipal = Annotated[auth.Principal, Depends(require(auth.Permission.ADMIN))]
# Organisation admins: create and list projects.
OrgAdminPrincipal = Annotated[auth.Principal, Depends(require_org_admin)]
# The same under `/tinker` (the key as the `tinker` client sends it).
TinkerReadPrincipal = Annotated[
    auth.Principal, Depends(require(auth.Permission.READ, get_tinker_principal))
]
TinkerJobsWritePrincipal = Annotated[
    auth.Principal, Depends(require(auth.Permission.JOBS_WRITE, get_tinker_principal))
]
