"""Projects, API keys, roles and scopes. A key is `ty_<random>`; only its sha256 is stored.

Who may do what (DESIGN.md, Governance): a caller has a role in its project (`viewer` reads,
`member` also submits and controls jobs and datasets, `admin` also manages members, keys,
quotas and webhooks) and, when it is an API key, the key's scopes narrow that role. A request
is allowed when the role permits the permission AND the scopes include it (`allows`).
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import Conflict, Forbidden, Unauthorized
from core.models import ApiKey, Project, utcnow

KEY_PREFIX = "ty_"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Role(enum.StrEnum):
    VIEWER = "viewer"
    MEMBER = "member"
    ADMIN = "admin"


class Permission(enum.StrEnum):
    """What a route needs; each value is also the API-key scope that grants it."""

    READ = "jobs:read"  # read anything in the project (jobs, datasets, usage, ...)
    JOBS_WRITE = "jobs:write"  # submit and control jobs, code archives, exports
    DATASETS_WRITE = "datasets:write"  # register, upload and delete datasets
    ADMIN = "admin"  # members, keys, service accounts, quotas, webhooks, audit


ALL_SCOPES: frozenset[str] = frozenset(p.value for p in Permission)

# The permissions each role holds (a key's scopes can only narrow them).
ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.VIEWER: frozenset({Permission.READ}),
    Role.MEMBER: frozenset({Permission.READ, Permission.JOBS_WRITE, Permission.DATASETS_WRITE}),
    Role.ADMIN: frozenset(Permission),
}


@dataclass(frozen=True)
class Principal:
    """Who is calling: a project, the caller's role in it and, for an API key, its scopes.

    `actor` names the caller in audit rows and job owners (a key's name, an OIDC subject).
    Keys made before roles existed are project admins with every scope."""

    project_id: str
    project_name: str
    key_id: str
    key_name: str
    key_prefix: str
    role: Role = Role.ADMIN
    scopes: frozenset[str] = field(default=ALL_SCOPES)

    @property
    def actor(self) -> str:
        return self.key_name


def allows(principal: Principal, permission: Permission) -> bool:
    """True when the caller's role holds `permission` and its scopes include it."""
    return permission in ROLE_PERMISSIONS[principal.role] and permission.value in principal.scopes


def check(principal: Principal, permission: Permission) -> None:
    """Raises Forbidden (403) naming the missing permission unless `allows`."""
    if not allows(principal, permission):
        raise Forbidden(
            f"{permission.value!r} is needed: the caller's role is {principal.role.value!r}"
            f" with scopes {sorted(principal.scopes)}"
        )


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
