"""The control plane's own liveness: when the reconcile loop last ran, and who runs it.

The reconcile loop (`workers.reconcile`, run by `workers.controller`) is what requeues a lost
worker's job, ends hung attempts, preempts and times gangs out. When no controller runs, none
of that happens and nothing else says so. Each controller round records itself in the
`controllers` table (`record_round`); `GET /readyz` and the dashboard read `reconciler_health`
and say when the last reconcile is older than `STALE_AFTER_S`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from core.platform.tables import Controller

#: Seconds between two reconcile rounds of the leading controller.
RECONCILE_INTERVAL_S = 2.0
#: The reconciler counts as stale after this many seconds without a finished reconcile: five
#: rounds, so one slow round (a loaded host, a long requeue) is not reported.
STALE_AFTER_S = 5 * RECONCILE_INTERVAL_S
#: A controller row not written for this long belongs to a process that is gone: the leader
#: deletes it.
FORGET_AFTER = timedelta(hours=1)

ReconcilerState = Literal["ok", "stale", "absent"]


@dataclass(frozen=True)
class ReconcilerHealth:
    """What `reconciler_health` found. `state`: `ok` (a reconcile finished within
    `STALE_AFTER_S`), `stale` (the last one is older), `absent` (none ever recorded).
    `seconds_since` is the age of the last reconcile in seconds (None when absent); `leader` the
    controller that ran it (`host:pid`); `detail` one sentence for people."""

    state: ReconcilerState
    reconciled_at: datetime | None
    seconds_since: float | None
    leader: str | None
    detail: str


def record_round(
    session: Session,
    *,
    name: str,
    host: str,
    pid: int,
    started_at: datetime,
    leading: bool,
    reconciled: bool,
    now: datetime,
) -> None:
    """Write this controller's round (`seen_at` = `now`, `leading`; `reconciled_at` = `now`
    when it finished a reconcile) and, when leading, forget rows unseen for `FORGET_AFTER`.
    Commits. Raises `SQLAlchemyError` when the database fails."""
    row = session.get(Controller, name)
    if row is None:
        row = Controller(name=name, host=host, pid=pid, started_at=started_at)
        session.add(row)
    row.seen_at = now
    row.leading = leading
    if reconciled:
        row.reconciled_at = now
    if leading:
        session.execute(delete(Controller).where(Controller.seen_at < now - FORGET_AFTER))
    session.commit()


def reconciler_health(session: Session, now: datetime) -> ReconcilerHealth:
    """The latest reconcile of any controller, judged against `now`. Raises `SQLAlchemyError`
    when the database fails."""
    last = session.execute(
        select(Controller.name, Controller.reconciled_at)
        .where(Controller.reconciled_at.is_not(None))
        .order_by(Controller.reconciled_at.desc())
        .limit(1)
    ).first()
    if last is None or last.reconciled_at is None:
        return ReconcilerHealth(
            state="absent",
            reconciled_at=None,
            seconds_since=None,
            leader=None,
            detail="no controller has ever reconciled: lost workers' jobs are not requeued and "
            "hung attempts are not ended; start one with `torchyard controller`",
        )
    name, at = last.name, last.reconciled_at
    at = at if at.tzinfo is not None else at.replace(tzinfo=now.tzinfo)  # SQLite drops the zone
    age = max((now - at).total_seconds(), 0.0)
    if age <= STALE_AFTER_S:
        return ReconcilerHealth("ok", at, age, name, f"reconciled {age:.0f} s ago by {name}")
    return ReconcilerHealth(
        state="stale",
        reconciled_at=at,
        seconds_since=age,
        leader=name,
        detail=f"no reconcile for {age:.0f} s (last by {name}): lost workers' jobs are not "
        "requeued and hung attempts are not ended; is a `torchyard controller` running?",
    )
