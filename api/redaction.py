"""Stored rows as the API shows them: without the server's own directories
(core.platform.server_paths).

Every answer that can carry a server-side path goes through here: a file the API describes
(a dataset, checkpoint or export) gets a storage-relative `uri` and, for admin callers only, its
full location in `server_uri`; text (event messages and data, log lines, errors) shows paths
under the server's directories relative to them, for every caller alike (a job's live stream
sends the same bytes to every watcher).
"""

from __future__ import annotations

from typing import TypeVar

from api import schemas
from api.schemas.access import Key, KeyOwner
from api.schemas.lora import LoraExport
from core.access import identity
from core.access.auth import Permission, Principal, allows
from core.platform import tables
from core.platform.server_paths import ServerPaths

Located = TypeVar(
    "Located", schemas.Dataset, schemas.Checkpoint, schemas.CheckpointExport, LoraExport
)


def is_admin(principal: Principal) -> bool:
    """Whether the caller may see the server's full paths (`server_uri`)."""
    return allows(principal, Permission.ADMIN)


def located(out: Located, paths: ServerPaths, *, admin: bool) -> Located:
    """`out` with `uri` relative to the server's directories, and the full location in
    `server_uri` when `admin` (else null)."""
    return out.model_copy(update=paths.located(out.uri, admin=admin))


def dataset(row: tables.Dataset, paths: ServerPaths, *, admin: bool) -> schemas.Dataset:
    return located(schemas.Dataset.model_validate(row), paths, admin=admin)


def export(
    row: tables.CheckpointExport, paths: ServerPaths, *, admin: bool
) -> schemas.CheckpointExport:
    """An export, its exporter's `error` (a stderr tail) included."""
    out = located(schemas.CheckpointExport.model_validate(row), paths, admin=admin)
    return out.model_copy(update={"error": paths.hide(out.error)})


def checkpoint(
    row: tables.Checkpoint,
    made: tables.CheckpointExport | None,
    paths: ServerPaths,
    *,
    admin: bool,
) -> schemas.Checkpoint:
    """A checkpoint with its export `made` (None: none was asked for)."""
    out = located(schemas.Checkpoint.model_validate(row), paths, admin=admin)
    shown = export(made, paths, admin=admin) if made is not None else None
    return out.model_copy(update={"export": shown})


def event(row: tables.JobEvent, paths: ServerPaths) -> schemas.Event:
    out = schemas.Event.model_validate(row)
    return out.model_copy(update={"message": paths.hide(out.message), "data": paths.hide(out.data)})


def log_line(row: tables.LogLine, paths: ServerPaths) -> schemas.LogLine:
    out = schemas.LogLine.model_validate(row)
    return out.model_copy(update={"line": paths.hide(out.line)})


def job(row: tables.Job, paths: ServerPaths) -> schemas.Job:
    """A job; its `error` and `failure` (reason, log lines) are what may name paths."""
    out = schemas.Job.model_validate(row)
    failure = out.failure
    if failure is not None:
        failure = failure.model_copy(
            update={"reason": paths.hide(failure.reason), "log_tail": paths.hide(failure.log_tail)}
        )
    return out.model_copy(update={"error": paths.hide(out.error), "failure": failure})


def key_out(view: identity.KeyView) -> Key:
    """The API's view of a key: never its hash."""
    key = view.key
    return Key(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        scopes=key.scopes,
        role=view.role,
        owner=KeyOwner(**view.owner) if view.owner else None,
        org_admin=key.org_admin,
        created_at=key.created_at,
        expires_at=key.expires_at,
        last_used_at=key.last_used_at,
        revoked_at=key.revoked_at,
    )
