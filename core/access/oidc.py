"""SSO: OIDC access tokens (JWT) from the configured issuer as bearer credentials.

A bearer value that is not a `ty_` key and has a JWT's shape is verified with PyJWT
(https://pyjwt.readthedocs.io): signature against the issuer's JWKS (`jwt.PyJWKClient`, which
caches the key set and refetches it, at most once per cooldown, when a token names an unknown
`kid`: key rotation), `iss`, `aud`, `exp`, `nbf`, and an algorithm from
`Settings.oidc_algorithms` (asymmetric only: never `none` or HMAC). The token's groups claim
maps to project roles through `Settings.oidc_group_roles`; when it grants roles in several
projects the `X-Torchyard-Project` header names the one the request acts in. Within a project
the highest role wins; the caller's scopes are all of that role's permissions.

Failures are 401 (`Unauthorized`) naming what is wrong, or 403 (`Forbidden`) for a project the
token grants nothing in. When the issuer's discovery document or JWKS cannot be fetched the
answer is 503 (`Unavailable`): the token may be fine, so the client should retry rather than
log in again.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import httpx
import jwt
from sqlalchemy.orm import Session

from core.access.auth import KEY_PREFIX, ROLE_PERMISSIONS, Principal, Role, get_project_by_name
from core.platform.errors import Forbidden, Unauthorized, Unavailable
from core.platform.settings import Settings

PROJECT_HEADER = "X-Torchyard-Project"
KEY_ID_PREFIX = "oidc:"
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2}
_ACTOR_MAX = 100  # jobs.owner's width


def looks_like_jwt(secret: str) -> bool:
    """True for three dot-separated base64url segments that are not a `ty_` API key."""
    return not secret.startswith(KEY_PREFIX) and _JWT.match(secret) is not None


class Verifier:
    """Verifies tokens of `settings.oidc_issuer`; one per app, so its key cache is shared.

    Thread-safe: routes resolve the caller in the thread pool."""

    def __init__(self, settings: Settings) -> None:
        if not settings.oidc_issuer or not settings.oidc_audience:
            raise ValueError("OIDC needs oidc_issuer and oidc_audience")
        self.settings = settings
        self.issuer: str = settings.oidc_issuer
        self.audience: str = settings.oidc_audience
        self._jwks: jwt.PyJWKClient | None = None
        self._lock = threading.Lock()

    def authenticate(self, *, session: Session, token: str, project: str | None) -> Principal:
        """The caller a valid token names, acting in `project` (a name; None: the only project
        its groups grant). Raises Unauthorized (401), Forbidden (403) or Unavailable (503)."""
        claims = self.claims(token)
        return grant(session=session, settings=self.settings, claims=claims, project=project)

    def claims(self, token: str) -> dict[str, Any]:
        """The verified claims of `token`. Raises Unauthorized for a token that does not verify,
        Unavailable when the issuer's keys cannot be fetched."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"malformed OIDC token: {exc}") from exc
        algorithm = header.get("alg")
        if algorithm not in self.settings.oidc_algorithms:
            raise Unauthorized(
                f"OIDC token signed with {algorithm!r}; accepted: {self.settings.oidc_algorithms}"
            )
        key = self._signing_key(token, header)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=self.settings.oidc_algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.settings.oidc_leeway_s,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise Unauthorized("OIDC token expired: sign in again") from exc
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid OIDC token: {exc}") from exc
        return claims

    def _signing_key(self, token: str, header: dict[str, Any]) -> jwt.PyJWK:
        try:
            return self._client().get_signing_key_from_jwt(token)
        except jwt.PyJWKClientConnectionError as exc:
            raise Unavailable(f"SSO: the issuer's signing keys cannot be fetched: {exc}") from exc
        except jwt.PyJWTError as exc:
            raise Unauthorized(
                f"OIDC token signed by key {header.get('kid')!r}, which is not among the "
                f"issuer's signing keys ({exc})"
            ) from exc
        except (ValueError, OSError) as exc:  # a JWKS that is not JSON, a reset connection
            raise Unavailable(f"SSO: the issuer's signing keys cannot be read: {exc}") from exc

    def _client(self) -> jwt.PyJWKClient:
        with self._lock:
            if self._jwks is None:
                self._jwks = jwt.PyJWKClient(
                    self.settings.oidc_jwks_url or self._discover_jwks_url(),
                    cache_jwk_set=True,
                    lifespan=self.settings.oidc_jwks_cache_s,
                    timeout=self.settings.oidc_http_timeout_s,
                    cooldown_duration=self.settings.oidc_jwks_cooldown_s,
                )
            return self._jwks

    def _discover_jwks_url(self) -> str:
        """`jwks_uri` of the issuer's OpenID Provider Configuration (OIDC Discovery 1.0, 4)."""
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            answer = httpx.get(url, timeout=self.settings.oidc_http_timeout_s)
            answer.raise_for_status()
            document = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            message = f"SSO: cannot read the issuer's discovery document {url}: {exc}"
            raise Unavailable(message) from exc
        if not isinstance(document, dict) or document.get("issuer") != self.issuer:
            raise Unavailable(f"SSO: {url} does not describe issuer {self.issuer!r}")
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not jwks_uri.startswith(("https://", "http://")):
            raise Unavailable(f"SSO: {url} has no usable jwks_uri")
        return jwks_uri


def roles_by_project(*, settings: Settings, claims: dict[str, Any]) -> dict[str, Role]:
    """Project name -> the highest role the token's groups grant in it."""
    groups = claims.get(settings.oidc_groups_claim)
    if isinstance(groups, str):
        groups = [groups]
    grants: dict[str, Role] = {}
    for group in groups if isinstance(groups, list) else []:
        mapped = settings.oidc_group_roles.get(group) if isinstance(group, str) else None
        if mapped is None:
            continue
        role = Role(mapped.role)
        if mapped.project not in grants or _RANK[role] > _RANK[grants[mapped.project]]:
            grants[mapped.project] = role
    return grants


def grant(
    *, session: Session, settings: Settings, claims: dict[str, Any], project: str | None
) -> Principal:
    """The principal of verified `claims` in `project` (None: the only project granted).

    Raises Unauthorized when no group maps to a project or several do and `project` is None;
    Forbidden when `project` is not granted or does not exist."""
    grants = roles_by_project(settings=settings, claims=claims)
    claim = settings.oidc_groups_claim
    if not grants:
        raise Unauthorized(
            f"the OIDC token's {claim!r} claim names no group of TORCHYARD_OIDC_GROUP_ROLES: "
            "it grants no project role"
        )
    if project is None:
        if len(grants) > 1:
            raise Unauthorized(
                f"the OIDC token grants roles in projects {sorted(grants)}: name one in the "
                f"{PROJECT_HEADER} header"
            )
        project = next(iter(grants))
    elif project not in grants:
        raise Forbidden(
            f"the OIDC token grants no role in project {project!r} ({PROJECT_HEADER}); "
            f"it grants {sorted(grants)}"
        )
    row = get_project_by_name(session=session, name=project)
    if row is None:
        raise Forbidden(f"project {project!r} of TORCHYARD_OIDC_GROUP_ROLES does not exist")
    role = grants[project]
    subject = str(claims["sub"])
    actor = claims.get(settings.oidc_actor_claim)
    return Principal(
        project_id=row.id,
        project_name=row.name,
        key_id=KEY_ID_PREFIX + subject,
        key_name=(actor if isinstance(actor, str) and actor else subject)[:_ACTOR_MAX],
        key_prefix="oidc",
        role=role,
        scopes=frozenset(permission.value for permission in ROLE_PERMISSIONS[role]),
    )
