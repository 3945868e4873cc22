"""Bodies of the access routes: projects, members, service accounts and API keys (tag `access`).

A key's secret appears only in the answer that creates it (`KeyCreated.secret`); no body ever
carries a key's hash.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from api import openapi_examples
from api.schemas import PRINTABLE
from api.validation import JsonInt
from core.access.auth import Role
from core.platform.storable import unstorable

Scope = Literal["jobs:read", "jobs:write", "datasets:write", "admin"]
RoleName = Annotated[
    Role, Field(description="`viewer` reads; `member` also writes jobs and datasets; `admin` all.")
]


def _storable(value: str) -> str:
    if unstorable(value):
        raise ValueError("contains NUL or invalid unicode")
    return value


Name = Annotated[
    str, Field(min_length=1, max_length=100, pattern=PRINTABLE), AfterValidator(_storable)
]
# Ids are letters, digits, `_` and `-` (`mem_...`, `sa_...`, `key_...`).
ID_PATTERN = r"^[A-Za-z0-9_-]+$"
OwnerId = Annotated[str, Field(max_length=40, pattern=ID_PATTERN)]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


_PROJECT_EXAMPLE = {
    "id": "prj_8a1d3f5c7e9b2d40",
    "name": "nlp",
    "created_at": "2026-11-02T09:00:00Z",
}
_MEMBER_EXAMPLE = {
    "id": "mem_3c55a9302a30cc55",
    "subject": "ada@example.com",
    "role": "member",
    "created_at": "2026-11-02T09:12:40Z",
}
_SERVICE_ACCOUNT_EXAMPLE = {
    "id": "sa_0123456789abcdef",
    "name": "ci",
    "role": "member",
    "created_at": "2026-11-03T14:00:00Z",
    "disabled_at": None,
}
_SECRET_EXAMPLE = "ty_K9pNX8lq2Vb7cR4mT1wYzA6dE3fH5jL0nP8sU2xW9kQ"
# The key `KeyCreate`'s example makes, as listed (`_KEY_EXAMPLE` further down asks for it).
_KEY_OUT_EXAMPLE = {
    "id": "key_a9302a30cc5536b0",
    "name": "ci",
    "prefix": _SECRET_EXAMPLE[:10],
    "scopes": ["jobs:write"],
    "role": "member",
    "owner": {"kind": "service_account", "id": "sa_0123456789abcdef", "name": "ci"},
    "org_admin": False,
    "created_at": "2026-11-20T08:00:00Z",
    "expires_at": "2027-02-18T08:00:00Z",
    "last_used_at": "2026-11-25T11:40:59Z",
    "revoked_at": None,
}


class Project(_Out):
    model_config = openapi_examples.config(_PROJECT_EXAMPLE)

    id: str = Field(description="The project's id (`prj_...`).")
    name: str = Field(description="The project's unique name.")
    created_at: datetime = Field(description="When it was created (UTC).")


class ProjectList(BaseModel):
    model_config = openapi_examples.config({"items": [_PROJECT_EXAMPLE]})

    items: list[Project] = Field(description="Every project of the organisation, oldest first.")


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "nlp"}]})

    name: Name = Field(description="A unique project name.")


class Member(_Out):
    model_config = openapi_examples.config(_MEMBER_EXAMPLE)

    id: str = Field(description="The member's id (`mem_...`).")
    subject: str = Field(description="Who: an email or an OIDC subject.")
    role: Role = Field(description="`viewer`, `member` or `admin`.")
    created_at: datetime = Field(description="When they were added (UTC).")


class MemberList(BaseModel):
    model_config = openapi_examples.config({"items": [_MEMBER_EXAMPLE]})

    items: list[Member] = Field(description="The project's members, oldest first.")


class MemberCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"subject": "ada@example.com", "role": "member"}]},
    )

    subject: Annotated[str, AfterValidator(_storable)] = Field(
        min_length=1, max_length=200, pattern=PRINTABLE, description="An email or OIDC subject."
    )
    role: RoleName


class MemberUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"role": "viewer"}]})

    role: RoleName


class ServiceAccount(_Out):
    model_config = openapi_examples.config(_SERVICE_ACCOUNT_EXAMPLE)

    id: str = Field(description="The service account's id (`sa_...`).")
    name: str = Field(description="Its name, unique in the project.")
    role: Role = Field(description="`viewer`, `member` or `admin`.")
    created_at: datetime = Field(description="When it was created (UTC).")
    disabled_at: datetime | None = Field(description="When it was disabled; its keys then 401.")


class ServiceAccountList(BaseModel):
    model_config = openapi_examples.config({"items": [_SERVICE_ACCOUNT_EXAMPLE]})

    items: list[ServiceAccount] = Field(description="The project's service accounts.")


class ServiceAccountCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "ci", "role": "member"}]}
    )

    name: Name = Field(description="A name unique in the project, such as `ci`.")
    role: RoleName


class KeyOwner(BaseModel):
    kind: Literal["member", "service_account"] = Field(description="What owns the key.")
    id: str = Field(description="The owner's id.")
    name: str = Field(description="The member's subject or the service account's name.")


class Key(BaseModel):
    """An API key without its secret or hash."""

    model_config = openapi_examples.config(_KEY_OUT_EXAMPLE)

    id: str = Field(description="The key's id (`key_...`).")
    name: str = Field(description="The key's name.")
    prefix: str = Field(description="The secret's first characters, to tell keys apart.")
    scopes: list[Scope] = Field(description="What the key may do, within its role.")
    role: Role | None = Field(description="Its effective role now: its owner's, or its own.")
    owner: KeyOwner | None = Field(description="Its owner; null for an owner-less key.")
    org_admin: bool = Field(description="True for an organisation admin key.")
    created_at: datetime = Field(description="When it was created (UTC).")
    expires_at: datetime | None = Field(description="When it stops working; null: never.")
    last_used_at: datetime | None = Field(
        description="When it last authenticated (UTC; written at most once a minute)."
    )
    revoked_at: datetime | None = Field(description="When it was revoked; null if active.")


class KeyList(BaseModel):
    model_config = openapi_examples.config({"items": [_KEY_OUT_EXAMPLE]})

    items: list[Key] = Field(description="The project's keys, oldest first, revoked too.")


# KeyCreate's optional fields may be left out but not sent as null, and these pairs exclude
# each other; its JSON Schema states both, so a request valid by the schema is accepted.
_OPTIONAL = ("scopes", "member_id", "service_account_id", "role", "expires_in", "expires_at")
_EXCLUSIVE = (
    ("member_id", "service_account_id"),
    ("role", "member_id"),
    ("role", "service_account_id"),
    ("expires_in", "expires_at"),
)
_KEY_EXAMPLE = {
    "name": "ci",
    "scopes": ["jobs:write"],
    "service_account_id": "sa_0123456789abcdef",
    "expires_in": 7776000,
}


def _key_create_schema(schema: dict[str, Any]) -> None:
    for name in _OPTIONAL:
        prop = schema["properties"][name]
        kinds = [k for k in prop.pop("anyOf", []) if k.get("type") != "null"]
        if kinds:
            prop.update(kinds[0])
        prop.pop("default", None)
    schema["allOf"] = [{"not": {"required": list(pair)}} for pair in _EXCLUSIVE]
    schema["examples"] = [_KEY_EXAMPLE]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_key_create_schema)

    name: Name = Field(description="A name for the key.")
    scopes: list[Scope] | None = Field(
        default=None,
        max_length=4,
        description="Scopes within the owner's role (default: all it holds); more is 403.",
    )
    member_id: OwnerId | None = Field(default=None, description="Owner: a member (or 404).")
    service_account_id: OwnerId | None = Field(
        default=None, description="Owner: an enabled service account (or 404)."
    )
    role: Role | None = Field(
        default=None, description="Only for an owner-less key: its role (default `member`)."
    )
    expires_in: Annotated[int, Field(ge=60, le=10 * 365 * 86400), JsonInt] | None = Field(
        default=None, description="Seconds until it expires."
    )
    expires_at: datetime | None = Field(
        default=None,
        description="When it expires (UTC; a past time makes a key that is already expired).",
    )

    @field_validator(*_OPTIONAL, mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("leave the field out instead of sending null")
        return value

    @model_validator(mode="before")
    @classmethod
    def _exclusive(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for first, second in _EXCLUSIVE:
                if first in data and second in data:
                    raise ValueError(f"give {first} or {second}, not both")
        return data

    def expiry(self) -> datetime | None:
        """The absolute expiry this request asks for (UTC), or None."""
        if self.expires_in is not None:
            return datetime.now(UTC) + timedelta(seconds=self.expires_in)
        if self.expires_at is not None and self.expires_at.tzinfo is None:
            return self.expires_at.replace(tzinfo=UTC)
        return self.expires_at


class KeyCreated(Key):
    model_config = openapi_examples.config(
        {**_KEY_OUT_EXAMPLE, "last_used_at": None, "secret": _SECRET_EXAMPLE}
    )

    secret: str = Field(description="The key itself (`ty_...`): shown only in this answer.")


class ProjectCreated(BaseModel):
    model_config = openapi_examples.config(
        {
            "project": _PROJECT_EXAMPLE,
            "key": {
                **_KEY_OUT_EXAMPLE,
                "name": "admin",
                "scopes": ["jobs:read", "jobs:write", "datasets:write", "admin"],
                "role": "admin",
                "owner": None,
                "created_at": _PROJECT_EXAMPLE["created_at"],
                "expires_at": None,
                "last_used_at": None,
                "secret": _SECRET_EXAMPLE,
            },
        }
    )

    project: Project = Field(description="The new project.")
    key: KeyCreated = Field(description="Its first admin key, with its secret (shown once).")
