"""Projects and API keys. A key is `ty_<random>`; only its sha256 is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import Conflict, Unauthorized
from core.models import ApiKey, Project, utcnow

KEY_PREFIX = "ty_"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: the project an API key belongs to."""

    project_id: str
    project_name: str
    key_id: str
    key_name: str
    key_prefix: str


def create_project(*, session: Session, name: str) -> Project:
    if session.execute(select(Project).where(Project.name == name)).scalar_one_or_none():
        raise Conflict(f"project {name!r} exists")
    project = Project(id=new_id("prj"), name=name, created_at=utcnow())
    session.add(project)
    session.flush()
    return project


def get_project_by_name(*, session: Session, name: str) -> Project | None:
    return session.execute(select(Project).where(Project.name == name)).scalar_one_or_none()


def create_api_key(*, session: Session, project_id: str, name: str = "default") -> str:
    """Create a key for the project and return its secret (shown once, never stored)."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiKey(
            id=new_id("key"),
            project_id=project_id,
            name=name,
            prefix=secret[:10],
            key_hash=hash_key(secret),
            created_at=utcnow(),
        )
    )
    session.flush()
    return secret


def authenticate(*, session: Session, secret: str | None) -> Principal:
    """The principal for `secret`. Raises Unauthorized for a missing, unknown or revoked key."""
    if not secret:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    row = session.execute(
        select(ApiKey, Project)
        .join(Project, Project.id == ApiKey.project_id)
        .where(ApiKey.key_hash == hash_key(secret))
    ).one_or_none()
    if row is None or row[0].revoked_at is not None:
        raise Unauthorized("invalid or revoked API key")
    key, project = row
    return Principal(
        project_id=project.id,
        project_name=project.name,
        key_id=key.id,
        key_name=key.name,
        key_prefix=key.prefix,
    )
