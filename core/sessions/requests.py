"""The calls of a session's clients, queued and answered (issue 47, `session_requests`).

Every call the Tinker client makes to a training client (`create_model`, `forward_backward`,
`optim_step`, ...) is stored as it came, with its `seq_id`, and answered once: its answer is
kept under its request id, so a `retrieve_future` the client retries gets the same bytes and
nothing runs twice. A submission retried with the same `X-Idempotency-Key` finds its first
request. Calls of one model run in `seq_id` order (docs/TINKER-WIRE.md, "Ids and ordering").
Every function takes the caller's `project_id`: another project's request is NotFound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import orjson
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from core.access.auth import new_id
from core.platform.errors import NotFound
from core.platform.tables import RequestState, SessionRequest, utcnow

ID_PREFIX = "req"
JSON = "application/json"
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class NewRequest:
    """A client's call: `kind` (the route), `body` (its bytes as sent, of `body_type`), the
    training client it is for (`model_id`, None for `create_model`) and its `seq_id`."""

    session_id: str
    kind: str
    body: bytes
    model_id: str | None = None
    seq_id: int | None = None
    body_type: str = JSON


def add(
    *,
    session: Session,
    project_id: str,
    new: NewRequest,
    request_key: str | None = None,
    answer: object | None = None,
) -> tuple[SessionRequest, bool]:
    """(the request, True) stored for `new` in the caller's transaction, queued, or already
    answered with `answer` (a JSON value) when the API answers it itself; (the first request,
    False) when `request_key` made one before. Flushed, not committed."""
    if request_key is not None:
        earlier = _by_key(session, project_id, request_key)
        if earlier is not None:
            return earlier, False
    row = SessionRequest(
        id=new_id(ID_PREFIX),
        project_id=project_id,
        session_id=new.session_id,
        model_id=new.model_id,
        seq_id=new.seq_id,
        kind=new.kind,
        body=new.body,
        body_type=new.body_type,
        request_key=request_key,
        state=RequestState.QUEUED,
        created_at=utcnow(),
    )
    if answer is not None:
        _answer(row, orjson.dumps(answer), JSON)
    try:
        with session.begin_nested():
            session.add(row)
            session.flush()
    except IntegrityError:  # the same retry, stored by another request first
        earlier = _by_key(session, project_id, request_key) if request_key else None
        if earlier is None:
            raise
        return earlier, False
    return row, True


def _answer(
    row: SessionRequest, result: bytes, result_type: str, now: datetime | None = None
) -> None:
    row.state, row.result, row.result_type = RequestState.DONE, result, result_type
    row.done_at = now or utcnow()


def find(*, session: Session, project_id: str, request_key: str | None) -> SessionRequest | None:
    """The project's request that the client's `X-Idempotency-Key` `request_key` made, if any."""
    return None if request_key is None else _by_key(session, project_id, request_key)


def _by_key(session: Session, project_id: str, key: str) -> SessionRequest | None:
    query = select(SessionRequest).where(
        SessionRequest.project_id == project_id, SessionRequest.request_key == key
    )
    return session.scalars(query).one_or_none()


def get(*, session: Session, project_id: str, request_id: str) -> SessionRequest:
    """The project's request `request_id`. Raises NotFound (another project's too)."""
    row = session.get(SessionRequest, request_id)
    if row is None or row.project_id != project_id:
        raise NotFound(f"request {request_id[:100]!r} not found")
    return row


def is_settled(row: SessionRequest) -> bool:
    """Whether `row` has its final answer (done or failed)."""
    return row.state in (RequestState.DONE, RequestState.FAILED)


def fail_open(*, session: Session, session_ids: list[str], reason: str) -> int:
    """Fail every unanswered request of the sessions `session_ids` (they ended) with `reason`,
    category `user` (the client ended the session, or let it idle out). Returns how many. No
    commit."""
    rows = session.scalars(
        select(SessionRequest).where(
            SessionRequest.session_id.in_(session_ids),
            SessionRequest.state.in_((RequestState.QUEUED, RequestState.RUNNING)),
        )
    ).all()
    now = utcnow()
    for row in rows:
        row.state, row.error, row.error_category = RequestState.FAILED, reason, "user"
        row.done_at = now
    return len(rows)


# The worker's side (`workers.watchers.session_relay`): a session job's queued calls are handed
# to its program, and its answers stored, each at most once.


def queued(*, session: Session, model_id: str) -> list[SessionRequest]:
    """The training client's calls not yet handed to its program, in `seq_id` order."""
    query = (
        select(SessionRequest)
        .where(SessionRequest.model_id == model_id, SessionRequest.state == RequestState.QUEUED)
        .order_by(SessionRequest.seq_id, SessionRequest.created_at)
    )
    return list(session.scalars(query))


def hand_over(*, session: Session, request_ids: list[str]) -> int:
    """Mark the queued calls `request_ids` running (handed to the program); how many were
    still queued. No commit."""
    if not request_ids:
        return 0
    done = session.execute(
        update(SessionRequest)
        .where(SessionRequest.id.in_(request_ids), SessionRequest.state == RequestState.QUEUED)
        .values(state=RequestState.RUNNING)
        .execution_options(synchronize_session=False)
    )
    return int(done.rowcount)  # type: ignore[attr-defined]


def settle(
    *,
    session: Session,
    request_id: str,
    result: bytes = b"",
    result_type: str = JSON,
    error: str | None = None,
    category: str = "server",
) -> bool:
    """Store the program's answer to the running call `request_id`: its `result` of
    `result_type`, or its `error` of `category` (`user`, `server`). Whether it was stored: an
    answer to a call already settled (the session ended first; a second answer) is dropped, so
    a call has one answer. No commit."""
    values: dict[str, object] = {"done_at": utcnow()}
    if error is None:
        values |= {"state": RequestState.DONE, "result": result, "result_type": result_type}
    else:
        values |= {"state": RequestState.FAILED, "error": error, "error_category": category}
    done = session.execute(
        update(SessionRequest)
        .where(SessionRequest.id == request_id, SessionRequest.state == RequestState.RUNNING)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return int(done.rowcount) == 1  # type: ignore[attr-defined]


def fail_running(*, session: Session, model_id: str, reason: str) -> int:
    """Fail the calls of `model_id` that its program had and never answered (it exited), with
    `reason`, category `server`: they are not run again. Returns how many. No commit."""
    done = session.execute(
        update(SessionRequest)
        .where(SessionRequest.model_id == model_id, SessionRequest.state == RequestState.RUNNING)
        .values(state=RequestState.FAILED, error=reason, error_category="server", done_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return int(done.rowcount)  # type: ignore[attr-defined]


def next_seq(*, session: Session, model_id: str) -> int:
    """The `seq_id` a new program of `model_id` runs first: one past the last settled or
    running call; for a new training client 1, or 0 when it was made by a load
    (create-via-load's load is its seq 0, `core.sessions.training_clients.create_from_state`)."""
    last = session.scalar(
        select(func.max(SessionRequest.seq_id)).where(
            SessionRequest.model_id == model_id, SessionRequest.state != RequestState.QUEUED
        )
    )
    if last is not None:
        return int(last) + 1
    first = session.scalar(
        select(func.min(SessionRequest.seq_id)).where(SessionRequest.model_id == model_id)
    )
    return 0 if first == 0 else 1
