"""Projects, API keys, roles and scopes. A key is `ty_<random>`; only its sha256 is stored.

Who may do what (docs/CONTRACTS.md section 6): a caller has a role in its project (`viewer` reads,
`member` also submits and controls jobs and datasets, `admin` also manages members, keys,
quotas and webhooks) and, when it is an API key, the key's scopes narrow that role. A request
is allowed when the role permits the permission AND the scopes include it (`allows`).
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from core.platform.errors import Conflict, Forbidden, Unauthorized
from core.platform.tables import ApiKey, Project, ProjectMember, ServiceAccount, aware, utcnow

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
ALL_SCOPES_ORDERED: tuple[str, ...] = tuple(p.value for p in Permission)

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
    org_admin: bool = False  # an organisation admin key: may create and list projects
    member_id: str | None = None  # the key's owner, when a member
    service_account_id: str | None = None  # ... or when a service account

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


def create_api_key(
    *,
    session: Session,
    project_id: str,
    name: str = "default",
    org_admin: bool = False,
) -> str:
    """Create an owner-less admin key with every scope and return its secret (shown once, only
    its sha256 is stored). `org_admin` keys may also create projects. For owned, scoped or
    expiring keys see `core.access.identity.create_key`."""
    secret, key = new_key_row(project_id=project_id, name=name)
    key.org_admin = org_admin
    session.add(key)
    session.flush()
    return secret


def replace_org_admin_key(*, session: Session, project_id: str, name: str) -> str:
    """A new organisation admin key `name` of the project (its secret, as `create_api_key`),
    the project's earlier unrevoked organisation admin keys of that name revoked in the same
    transaction: a rerun of `torchyard quickstart` leaves one such key, not one per run, and
    never none (the new key exists before the old ones go). No commit."""
    secret = create_api_key(session=session, project_id=project_id, name=name, org_admin=True)
    session.execute(
        update(ApiKey)
        .where(
            ApiKey.project_id == project_id,
            ApiKey.name == name,
            ApiKey.org_admin.is_(True),
            ApiKey.revoked_at.is_(None),
            ApiKey.key_hash != hash_key(secret),
        )
        .values(revoked_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return secret


def new_key_row(*, project_id: str, name: str) -> tuple[str, ApiKey]:
    """A fresh secret and its (unsaved) key row: owner-less, role admin, every scope."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=new_id("key"),
        project_id=project_id,
        name=name,
        prefix=secret[:10],
        key_hash=hash_key(secret),
        scopes=list(ALL_SCOPES_ORDERED),
        role=Role.ADMIN.value,
        created_at=utcnow(),
    )
    return secret, key


# last_used_at is written at most this often per key, so the hot path stays read-only.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def authenticate(*, session: Session, secret: str | None) -> Principal:
    """The principal for `secret`: its project, its owner's current role (or the key's own
    role when owner-less) and its scopes. Raises Unauthorized for a missing, unknown, revoked or
    expired key, a disabled service account, or a key whose owner was removed.

    Writes `last_used_at` (and commits) at most once per LAST_USED_RESOLUTION (60 s) per key."""
    if not secret:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    row = session.execute(
        select(ApiKey, Project, ProjectMember.role, ServiceAccount.role, ServiceAccount.disabled_at)
        .join(Project, Project.id == ApiKey.project_id)
        .outerjoin(ProjectMember, ProjectMember.id == ApiKey.member_id)
        .outerjoin(ServiceAccount, ServiceAccount.id == ApiKey.service_account_id)
        .where(ApiKey.key_hash == hash_key(secret))
    ).one_or_none()
    if row is None or row[0].revoked_at is not None:
        raise Unauthorized("invalid or revoked API key")
    key, project, member_role, account_role, disabled_at = row
    now = utcnow()
    expires_at = None if key.expires_at is None else aware(key.expires_at)
    if expires_at is not None and expires_at <= now:
        raise Unauthorized("expired API key")
    if disabled_at is not None:
        raise Unauthorized("the key's service account is disabled")
    # An owned key has no role of its own: when its owner is removed it has none at all.
    role = member_role or account_role or key.role
    if role is None:
        raise Unauthorized("the key's owner was removed")
    principal = Principal(
        project_id=project.id,
        project_name=project.name,
        key_id=key.id,
        key_name=key.name,
        key_prefix=key.prefix,
        role=Role(role),
        scopes=frozenset(key.scopes) & ALL_SCOPES,
        org_admin=key.org_admin,
        member_id=key.member_id,
        service_account_id=key.service_account_id,
    )
    last_used = None if key.last_used_at is None else aware(key.last_used_at)
    if last_used is None or now - last_used >= LAST_USED_RESOLUTION:
        _touch(session=session, key_id=key.id, now=now)
    return principal


def _touch(*, session: Session, key_id: str, now: datetime) -> None:
    """Set last_used_at unless another request did within the resolution; commits."""
    session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id)
        .where(or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < now - LAST_USED_RESOLUTION))
        .values(last_used_at=now)
        # No in-Python re-evaluation of the loaded key: SQLite hands back naive datetimes,
        # which cannot be compared with `now` (and nothing here reads the row after).
        .execution_options(synchronize_session=False)
    )
    session.commit()
