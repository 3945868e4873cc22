"""A job's live stream (server-sent events): state changes, events, metric lines, log lines."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from starlette.concurrency import run_in_threadpool

from api import openapi_examples
from api.deps import _bearer, resolve_principal
from api.errors import ERROR_RESPONSES
from api.streams import StreamHub, watch
from api.validation import JobId
from core.access import auth
from core.jobs import service as jobs

router = APIRouter(prefix="/v1/jobs", tags=["job data"], responses=ERROR_RESPONSES)


def _authorize(request: Request, secret: str | None, job_id: int) -> None:
    # A session of its own, closed before the stream starts: a watcher holds no DB connection.
    with request.app.state.sessionmaker() as session:
        principal = resolve_principal(request, session, secret)
        request.state.principal = principal  # for the audit log of a refused stream
        auth.check(principal, auth.Permission.READ)
        jobs.get_or_raise(session=session, job_id=job_id, project_id=principal.project_id)


@router.get(
    "/{job_id}/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {"example": openapi_examples.JOB_STREAM}}}},
    # It authenticates inside (a watcher holds no DB connection), so it names its permission.
    openapi_extra={"x-permission": auth.Permission.READ.value},
)
async def job_stream(
    job_id: JobId,
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    last_event_id: Annotated[str | None, Header(max_length=200)] = None,
) -> StreamingResponse:
    """Server-sent events of the job until it is terminal: `job` (state changes), `event`,
    `metric` ({step, time, values}), `log`, then `end`. Resume with `Last-Event-ID`."""
    secret = credentials.credentials if credentials is not None else None
    await run_in_threadpool(_authorize, request, secret, job_id)
    hub: StreamHub = request.app.state.streams
    return StreamingResponse(
        watch(hub, job_id, last_event_id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
