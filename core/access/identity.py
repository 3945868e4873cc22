"""Members, service accounts, API keys and projects: the services behind `/v1/members`,
`/v1/service-accounts`, `/v1/keys` and `/v1/projects` (issue 14, Identity and access).

Every function takes the caller's `project_id` and finds rows only inside it, so another
project's ids raise NotFound exactly like unknown ids. A key never holds more than its owner's
role: its scopes must be permissions of that role (InvalidInput, 422 at `scopes`).

The organisation keeps an administrator: no revocation, demotion, removal or disabling may take
away its last active organisation admin credential (Conflict, 409; `_keeping_an_org_admin`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.access.auth import (
    ROLE_PERMISSIONS,
    Permission,
    Principal,
    Role,
    create_project,
    new_id,
    new_key_row,
)
from core.platform.errors import Conflict, Forbidden, InvalidInput, NotFound
from core.platform.tables import ApiKey, Project, ProjectMember, ServiceAccount, utcnow


def _invalid(field: str, msg: str) -> InvalidInput:
    return InvalidInput(
        f"{field}: {msg}", details=[{"loc": ["body", field], "msg": msg, "type": "value_error"}]
    )


def _escalation(msg: str) -> Forbidden:
    return Forbidden(
        f"scopes: {msg}", details=[{"loc": ["body", "scopes"], "msg": msg, "type": "forbidden"}]
    )


def _flush_unique(session: Session, what: str) -> None:
    """Flush; a unique-constraint clash becomes Conflict (409) naming `what`."""
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError:
        raise Conflict(f"{what} exists") from None


LAST_ORG_ADMIN = (
    "the last active organisation admin credential cannot be removed; create another admin first"
)


def active_org_admins(session: Session) -> int:
    """How many active organisation admin credentials the organisation has: API keys with
    `org_admin` that authenticate (not revoked, not expired, their owner present and enabled)
    and hold the admin role (their owner's, or their own when owner-less), so they may both
    create projects and administer their own. OIDC callers are not counted: a token's grant
    lives in the identity provider and the settings, not in the database, and none is an
    organisation admin."""
    role = func.coalesce(ProjectMember.role, ServiceAccount.role, ApiKey.role)
    query = (
        select(func.count(ApiKey.id))
        .outerjoin(ProjectMember, ProjectMember.id == ApiKey.member_id)
        .outerjoin(ServiceAccount, ServiceAccount.id == ApiKey.service_account_id)
        .where(
            ApiKey.org_admin.is_(True),
            ApiKey.revoked_at.is_(None),
            or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > utcnow()),
            ServiceAccount.disabled_at.is_(None),
            role == Role.ADMIN.value,
        )
    )
    return int(session.scalar(query) or 0)


@contextmanager
def _keeping_an_org_admin(session: Session) -> Iterator[None]:
    """Run the block's changes unless they leave the organisation without an active
    organisation admin credential (it had one): then they are undone (a savepoint) and
    Conflict (409) is raised.

    Every organisation admin key row is locked first (`SELECT ... FOR UPDATE`, in id order)
    and held to the end of the transaction, so such changes run one at a time: a second one
    waits for the first to commit and then counts what it left (READ COMMITTED: each statement
    reads the latest commit; the session's loaded rows are expired so they are re-read too).
    Two concurrent revocations of the last two admin keys cannot both pass."""
    session.flush()
    lock = select(ApiKey.id).where(ApiKey.org_admin.is_(True)).order_by(ApiKey.id)
    session.execute(lock.with_for_update()).all()
    session.expire_all()
    had_one = active_org_admins(session) > 0
    with session.begin_nested():
        yield
        session.flush()
        if had_one and active_org_admins(session) == 0:
            raise Conflict(LAST_ORG_ADMIN)


# --- members ----------------------------------------------------------------------------------


def list_members(*, session: Session, project_id: str) -> list[ProjectMember]:
    """The project's members, oldest first."""
    query = select(ProjectMember).where(ProjectMember.project_id == project_id)
    return list(session.scalars(query.order_by(ProjectMember.created_at, ProjectMember.id)))


def get_member(*, session: Session, project_id: str, member_id: str) -> ProjectMember:
    """Raises NotFound unless `member_id` is a member of the project."""
    member = session.get(ProjectMember, member_id)
    if member is None or member.project_id != project_id:
        raise NotFound(f"member {member_id} not found")
    return member


def add_member(*, session: Session, project_id: str, subject: str, role: Role) -> ProjectMember:
    """Add `subject` (an email or OIDC subject) with `role`. Raises Conflict if present."""
    member = ProjectMember(
        id=new_id("mem"), project_id=project_id, subject=subject, role=role.value
    )
    session.add(member)
    _flush_unique(session, f"member {subject!r}")
    return member


def set_member_role(
    *, session: Session, project_id: str, member_id: str, role: Role
) -> ProjectMember:
    """Change a member's role; their keys hold the new role from the next request on. Scopes a
    key holds beyond the new role stay stored but grant nothing (`auth.allows`). Raises
    Conflict when that demotes the owner of the last organisation admin credential."""
    with _keeping_an_org_admin(session):
        member = get_member(session=session, project_id=project_id, member_id=member_id)
        member.role = role.value
    return member


def remove_member(*, session: Session, project_id: str, member_id: str) -> ProjectMember:
    """Remove a member and revoke their keys (401 from the next request on). Raises Conflict
    when one of them is the last organisation admin credential."""
    with _keeping_an_org_admin(session):
        member = get_member(session=session, project_id=project_id, member_id=member_id)
        _revoke_where(session, ApiKey.member_id == member.id)
        session.delete(member)
    return member


# --- service accounts -------------------------------------------------------------------------


def list_service_accounts(*, session: Session, project_id: str) -> list[ServiceAccount]:
    """The project's service accounts (disabled ones too), oldest first."""
    query = select(ServiceAccount).where(ServiceAccount.project_id == project_id)
    return list(session.scalars(query.order_by(ServiceAccount.created_at, ServiceAccount.id)))


def get_service_account(*, session: Session, project_id: str, account_id: str) -> ServiceAccount:
    """Raises NotFound unless `account_id` is a service account of the project."""
    account = session.get(ServiceAccount, account_id)
    if account is None or account.project_id != project_id:
        raise NotFound(f"service account {account_id} not found")
    return account


def create_service_account(
    *, session: Session, project_id: str, name: str, role: Role
) -> ServiceAccount:
    """A new service account. Raises Conflict when the project has one of that name."""
    account = ServiceAccount(id=new_id("sa"), project_id=project_id, name=name, role=role.value)
    session.add(account)
    _flush_unique(session, f"service account {name!r}")
    return account


def disable_service_account(
    *, session: Session, project_id: str, account_id: str
) -> ServiceAccount:
    """Disable a service account: its keys answer 401 from the next request on. Idempotent.
    Raises Conflict when one of them is the last organisation admin credential."""
    with _keeping_an_org_admin(session):
        account = get_service_account(session=session, project_id=project_id, account_id=account_id)
        if account.disabled_at is None:
            account.disabled_at = utcnow()
    return account


# --- keys -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyView:
    """A key as the API shows it: never its hash. `role` is its effective role now (its
    owner's, or its own when owner-less); `owner` is `{"kind", "id", "name"}` or None."""

    key: ApiKey
    role: str | None
    owner: dict[str, Any] | None


def _view(session: Session, key: ApiKey) -> KeyView:
    if key.member_id is not None:
        member = session.get(ProjectMember, key.member_id)
        assert member is not None  # the foreign key holds it
        owner = {"kind": "member", "id": member.id, "name": member.subject}
        return KeyView(key=key, role=member.role, owner=owner)
    if key.service_account_id is not None:
        account = session.get(ServiceAccount, key.service_account_id)
        assert account is not None
        owner = {"kind": "service_account", "id": account.id, "name": account.name}
        return KeyView(key=key, role=account.role, owner=owner)
    return KeyView(key=key, role=key.role, owner=None)


def list_keys(*, session: Session, project_id: str) -> list[KeyView]:
    """The project's keys (revoked and expired ones too), oldest first."""
    query = select(ApiKey).where(ApiKey.project_id == project_id)
    keys = session.scalars(query.order_by(ApiKey.created_at, ApiKey.id))
    return [_view(session, key) for key in keys]


def get_key(*, session: Session, project_id: str, key_id: str) -> KeyView:
    """Raises NotFound unless `key_id` is a key of the project."""
    key = session.get(ApiKey, key_id)
    if key is None or key.project_id != project_id:
        raise NotFound(f"key {key_id} not found")
    return _view(session, key)


@dataclass(frozen=True)
class KeyRequest:
    """What `create_key` makes: at most one owner; `role` only for an owner-less key;
    `scopes` None means every permission of the owner's role."""

    name: str
    scopes: list[str] | None = None
    expires_at: datetime | None = None
    member_id: str | None = None
    service_account_id: str | None = None
    role: Role | None = None


def _owner_role(session: Session, project_id: str, request: KeyRequest) -> Role:
    """The role the key's owner holds; raises NotFound for an unknown (or another project's)
    owner and InvalidInput for two owners, a role beside an owner or a disabled account."""
    if request.member_id is not None and request.service_account_id is not None:
        raise _invalid("service_account_id", "a key has one owner: give member_id or this")
    if request.role is not None and (request.member_id or request.service_account_id):
        raise _invalid("role", "an owned key takes its owner's role; leave role out")
    if request.member_id is not None:
        member = get_member(session=session, project_id=project_id, member_id=request.member_id)
        return Role(member.role)
    if request.service_account_id is not None:
        account = get_service_account(
            session=session, project_id=project_id, account_id=request.service_account_id
        )
        if account.disabled_at is not None:
            raise Conflict(f"service account {account.id} is disabled")
        return Role(account.role)
    return request.role or Role.MEMBER


def create_key(*, session: Session, caller: Principal, request: KeyRequest) -> tuple[str, KeyView]:
    """Create a key in the caller's project; returns (secret, view). The secret is shown once;
    only its sha256 is stored. Raises NotFound for an unknown owner, Conflict for a disabled
    service account, Forbidden (403, at `scopes`) for scopes beyond the owner's role or the
    calling key's own scopes: nobody mints a key that can do more than its owner or caller."""
    role = _owner_role(session, caller.project_id, request)
    allowed = {p.value for p in ROLE_PERMISSIONS[role]}
    scopes = request.scopes if request.scopes is not None else sorted(allowed)
    beyond = sorted(set(scopes) - allowed)
    if beyond:
        raise _escalation(f"{beyond} exceed the owner's role {role.value!r}")
    beyond_caller = sorted(set(scopes) - caller.scopes)
    if beyond_caller:
        raise _escalation(f"{beyond_caller} exceed the calling key's own scopes")
    secret, key = new_key_row(project_id=caller.project_id, name=request.name)
    key.scopes = [p.value for p in Permission if p.value in scopes]
    key.expires_at = request.expires_at
    key.member_id = request.member_id
    key.service_account_id = request.service_account_id
    key.role = None if (request.member_id or request.service_account_id) else role.value
    session.add(key)
    session.flush()
    return secret, _view(session, key)


def revoke_key(*, session: Session, project_id: str, key_id: str) -> KeyView:
    """Revoke a key: 401 from the next request on. Idempotent (keeps the first revoked_at).
    Raises Conflict when it is the last organisation admin credential (the caller's own
    included)."""
    with _keeping_an_org_admin(session):
        view = get_key(session=session, project_id=project_id, key_id=key_id)
        if view.key.revoked_at is None:
            view.key.revoked_at = utcnow()
    return view


def _revoke_where(session: Session, condition: Any) -> None:
    session.execute(
        update(ApiKey)
        .where(condition, ApiKey.revoked_at.is_(None))
        .values(revoked_at=utcnow())
        .execution_options(synchronize_session=False)
    )


# --- projects (organisation admins) -----------------------------------------------------------


def list_projects(*, session: Session) -> list[Project]:
    """Every project of the organisation, oldest first."""
    return list(session.scalars(select(Project).order_by(Project.created_at, Project.id)))


def create_project_with_admin(*, session: Session, name: str) -> tuple[Project, str, KeyView]:
    """A new project and its first admin key (owner-less, every scope); returns (project,
    secret, key). Raises Conflict when the name is taken."""
    project = create_project(session=session, name=name)
    secret, key = new_key_row(project_id=project.id, name="admin")
    session.add(key)
    session.flush()
    return project, secret, _view(session, key)
