"""The audit log: one row per mutating request and per refused (401/403) request.

`api.audit` writes the rows (`record`, one INSERT in a transaction of its own, after the answer);
`GET /v1/audit` reads them (`list_page`), newest first, a project's own only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, insert, select, text
from sqlalchemy.orm import Session

from core.platform.tables import AuditEvent, utcnow


class Outcome(enum.StrEnum):
    OK = "ok"  # answered below 400
    DENIED = "denied"  # 401 or 403
    FAILED = "failed"  # any other error


class ActorKind(enum.StrEnum):
    KEY = "key"
    OIDC = "oidc"
    ANONYMOUS = "anonymous"  # no valid credentials


def outcome_of(status_code: int) -> Outcome:
    if status_code < 400:
        return Outcome.OK
    return Outcome.DENIED if status_code in (401, 403) else Outcome.FAILED


# Column widths (core.platform.tables.AuditEvent): longer values are cut, never refused.
_WIDTHS = {"actor": 255, "key_id": 300, "path": 2000, "operation": 100, "target": 200}
_WIDTHS |= {"source": 100, "request_id": 128}


@dataclass(frozen=True)
class Event:
    """What one audited request did (see AuditEvent for the fields)."""

    project_id: str | None
    actor: str | None
    actor_kind: ActorKind
    key_id: str | None
    method: str
    path: str
    operation: str | None
    target: str | None
    status_code: int
    source: str | None
    request_id: str | None

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {**self.__dict__, "at": utcnow()}
        row["actor_kind"] = self.actor_kind.value
        row["outcome"] = outcome_of(self.status_code).value
        for name, width in _WIDTHS.items():
            if isinstance(row[name], str):  # Postgres text refuses NUL (a path's `%00`)
                row[name] = row[name][:width].replace("\x00", "\N{REPLACEMENT CHARACTER}")
        return row


def record(*, engine: Engine, event: Event) -> None:
    """Insert `event` in a transaction of its own. Raises SQLAlchemyError when it cannot.

    On Postgres the commit does not wait for the WAL flush (`synchronous_commit = off`, for
    this transaction only): it costs no fsync, and a database crash can lose at most the last
    fraction of a second of audit rows, never corrupt them (PostgreSQL docs, "Asynchronous
    Commit"). The row is written after the answer anyway (api.audit), so it was never
    acknowledged to anyone."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SET LOCAL synchronous_commit = off"))
        connection.execute(insert(AuditEvent), [event.row()])


def list_page(
    *,
    session: Session,
    project_id: str,
    actor: str | None = None,
    operation: str | None = None,
    outcome: Outcome | None = None,
    target: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 50,
    before_id: int | None = None,
) -> tuple[list[AuditEvent], int | None]:
    """One page of the project's events, newest first, with every filter applied (exact
    matches; `since` inclusive, `until` exclusive). `before_id`: the cursor of the previous
    page. Returns (events, the cursor of the next page or None at the end)."""
    query = select(AuditEvent).where(AuditEvent.project_id == project_id)
    filters = {
        AuditEvent.actor: actor,
        AuditEvent.operation: operation,
        AuditEvent.outcome: outcome.value if outcome is not None else None,
        AuditEvent.target: target,
    }
    for column, value in filters.items():
        if value is not None:
            query = query.where(column == value)
    if since is not None:
        query = query.where(AuditEvent.at >= since)
    if until is not None:
        query = query.where(AuditEvent.at < until)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    rows = list(session.execute(query.order_by(AuditEvent.id.desc()).limit(limit + 1)).scalars())
    if len(rows) <= limit:
        return rows, None
    return rows[:limit], rows[limit - 1].id
