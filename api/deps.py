"""Request dependencies: the settings, a database session, and who is calling."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from core import auth
from core.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; rolled back unless a service or the route commits."""
    with request.app.state.sessionmaker() as session:
        yield session


_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer ty_...`")

SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


def get_principal(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> auth.Principal:
    """The caller's project. Raises Unauthorized (401) for a missing, unknown or revoked key."""
    secret = credentials.credentials if credentials is not None else None
    return auth.authenticate(session=session, secret=secret)


CurrentPrincipal = Annotated[auth.Principal, Depends(get_principal)]
