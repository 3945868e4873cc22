"""The calls of the Tinker-compatible API's training and sampling clients (`/tinker/api/v1`,
issue 47): `forward_backward` (and `forward`), `optim_step`, `save_weights`, `load_weights` and
`save_weights_for_sampler` queue a call for the training client's session job, whose program
runs them in `seq_id` order (`trainer.session`, relayed by its worker,
`workers.watchers.session_relay`); sampling sessions (`create_sampling_session`,
`samplers/{id}`) of weights saved for sampling, whose `asample` calls the session job holding
the weights runs in a lane of their own (`core.sessions.samplers`, `trainer.session_sampling`);
`retrieve_future` long-polls a call's stored answer (`core.sessions.requests`),
`create_model`'s included. Sessions and training clients themselves are
`api.routes.tinker_api.sessions`'s;
the wire is docs/TINKER-WIRE.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from api import audit
from api.deps import SessionDep, SettingsDep, TinkerJobsWritePrincipal, TinkerReadPrincipal
from api.errors import ERROR_RESPONSES, ErrorBody
from api.schemas import tinker as wire
from api.schemas import tinker_sampling as sampling
from api.schemas import tinker_weights as weights
from core.platform.errors import InvalidInput
from core.platform.settings import Settings
from core.platform.tables import (
    TERMINAL_STATES,
    Job,
    JobState,
    RequestState,
    SessionModel,
    SessionRequest,
)
from core.sessions import requests, samplers, training_clients, wakeup
from dataformat import tinker_wire

router = APIRouter(prefix=wire.PREFIX, tags=["tinker"], responses=ERROR_RESPONSES)
Quiet = Depends(audit.not_audited)  # polls, training and sampling calls: audited if refused
GONE: dict[int | str, dict[str, Any]] = {
    410: {"model": ErrorBody, "description": "The session has ended"}
}
SAMPLER_ID = Annotated[
    str, Path(max_length=40, description="A sampling session id (`sampling_session_id`).")
]
PROTOBUF = requests.PROTOBUF
# A poll of `retrieve_future` is held this long at most (the client waits 45 s), re-reading the
# call's row between naps that grow from the first to the last; no connection is held between.
# Every 5 ms for the first 20 ms, where a small call's answer lands (bench.sessions: a tiny
# `forward_backward` is answered 15-25 ms after it was stored), then sparser.
LONG_POLL_S = 30.0
POLL_NAPS_S = (0.005, 0.005, 0.005, 0.005, 0.01, 0.01, 0.01, 0.02, 0.02, 0.05, 0.1, 0.2)
# `ForwardBackwardRequest(model_id=MODEL_EXAMPLE, seq_id=1, loss_fn="cross_entropy")`, serialized
FORWARD_BACKWARD_EXAMPLE = f'\n\x1c{wire.MODEL_EXAMPLE}\x10\x01"\rcross_entropy'


async def _raw_body(request: Request) -> bytes:
    return await request.body()


ProtoBody = Annotated[bytes, Depends(_raw_body)]  # a protobuf body, as sent


def _retry_key(request: Request) -> str | None:
    retry_key = request.headers.get("x-idempotency-key")
    return retry_key[:200] if retry_key else None


def _receipt(
    session: Session, row: SessionRequest, request: Request, target: str | None = None
) -> wire.UntypedAPIFuture:
    """Commit the stored call, wake its session job's relay (`core.sessions.wakeup`) and
    answer its future; `target` names what the audit log records the call against (a model,
    a session), for the calls that are audited."""
    session.commit()
    _wake(request, row.model_id)
    if target is not None:
        audit.name_target(request, target)
    return wire.UntypedAPIFuture(request_id=row.id, model_id=row.model_id)


def _wake(request: Request, model_id: str | None) -> None:
    settings: Settings = request.app.state.settings
    wakeup.publisher(settings.broker_url).queued(model_id)


def _queue(
    session: Session,
    project_id: str,
    new: requests.NewRequest,
    request: Request,
    target: str | None = None,
) -> wire.UntypedAPIFuture:
    row = training_clients.call(
        session=session,
        project_id=project_id,
        new=new,
        request_key=_retry_key(request),
    )
    return _receipt(session, row, request, target)


@router.post(
    "/forward_backward",
    response_model=wire.UntypedAPIFuture,
    operation_id="tinker_forward_backward",
    dependencies=[Quiet],
    responses={410: {"model": ErrorBody, "description": "The session has ended"}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "A protobuf `ForwardBackwardRequest` (the `tinker` package's "
            "schema), zstd-compressed or not.",
            "content": {
                PROTOBUF: {
                    "schema": {"type": "string", "format": "binary"},
                    # the bytes of a datum-less request (the program answers it a user error)
                    "example": FORWARD_BACKWARD_EXAMPLE,
                }
            },
        }
    },
)
def forward_backward(
    principal: TinkerJobsWritePrincipal, session: SessionDep, request: Request, body: ProtoBody
) -> wire.UntypedAPIFuture:
    """Queue a forward and backward pass of a training client on the call's datums (or a
    forward only: `forward`), run by its session job in `seq_id` order; the future's answer is
    a protobuf `ForwardBackwardOutput` (per-datum `logprobs`, `loss:sum`). 422 for a body that
    is no `ForwardBackwardRequest`, 410 for an ended session, 404 for another project's model."""
    try:
        message = tinker_wire.forward_backward_request(body)
    except tinker_wire.WireError as exc:
        raise InvalidInput(
            f"body: {exc}", details=[{"loc": ["body"], "msg": str(exc), "type": "protobuf"}]
        ) from None
    new = requests.NewRequest(
        session_id="",
        kind="forward" if message.forward_only else "forward_backward",
        body=body,
        model_id=message.model_id[:80],
        seq_id=message.seq_id,
        body_type=requests.PROTOBUF,
    )
    return _queue(session, principal.project_id, new, request)


@router.post(
    "/optim_step",
    response_model=wire.UntypedAPIFuture,
    operation_id="tinker_optim_step",
    dependencies=[Quiet],
    responses={410: {"model": ErrorBody, "description": "The session has ended"}},
)
def optim_step(
    body: wire.OptimStepRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    request: Request,
) -> wire.UntypedAPIFuture:
    """Queue an AdamW step of a training client with the gradients its `forward_backward`
    calls summed since the last step, run in `seq_id` order; the future's answer is
    `{"metrics"}`. 410 for an ended session, 404 for another project's model."""
    new = requests.NewRequest(
        session_id="",
        kind="optim_step",
        body=body.model_dump_json().encode(),
        model_id=body.model_id,
        seq_id=body.seq_id,
    )
    return _queue(session, principal.project_id, new, request)


@router.post(
    "/save_weights",
    response_model=wire.UntypedAPIFuture,
    operation_id="tinker_save_weights",
    responses={410: {"model": ErrorBody, "description": "The session has ended"}},
)
def save_weights(
    body: weights.SaveWeightsRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    request: Request,
) -> wire.UntypedAPIFuture:
    """Queue a save of a training client's adapters and optimizer state (`save_state`) as a
    checkpoint of its session job, run in `seq_id` order; the future's answer is
    `{"path": "tinker://<model_id>/weights/<name>"}`. 410 for an ended session, 404 for
    another project's model."""
    name = body.path or f"seq-{body.seq_id}"
    new = requests.NewRequest(
        session_id="",
        kind="save_weights",
        body=orjson.dumps({"name": name, "overwrite": body.overwrite}),
        model_id=body.model_id,
        seq_id=body.seq_id,
    )
    return _queue(session, principal.project_id, new, request, target=body.model_id)


@router.post(
    "/load_weights",
    response_model=wire.UntypedAPIFuture,
    operation_id="tinker_load_weights",
    responses={410: {"model": ErrorBody, "description": "The session has ended"}},
)
def load_weights(
    body: weights.LoadWeightsRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    request: Request,
) -> wire.UntypedAPIFuture:
    """Queue a load of a saved state (`load_state`, `load_state_with_optimizer`) into a
    training client, run in `seq_id` order: the adapters, and the optimizer's state when
    `optimizer`. The state may be another training client's of the project. With
    `session_id` and `model_seq_id` instead (`create_training_client_from_state`), the load
    makes a new training client of the session, with the saved state's base model and LoRA
    config and a session job, and is its first call. 422 at `path` for a path not
    `tinker://<model_id>/weights/<name>`, at `base_model` for one whose weights are not the
    state's; 404 for another project's model, session or state; 410 for an ended session; a
    name never saved is answered a `user` error."""
    if body.session_id is not None and body.model_seq_id is not None:
        row = training_clients.create_from_state(
            session=session,
            settings=settings,
            project_id=principal.project_id,
            owner=principal.actor,
            new=training_clients.NewFromState(
                session_id=body.session_id,
                model_seq_id=body.model_seq_id,
                path=body.path,
                optimizer=body.optimizer,
                base_model=body.base_model,
            ),
            request_key=_retry_key(request),
        )
        return _receipt(session, row, request, target=row.session_id)
    state = training_clients.saved_state(
        session=session, settings=settings, project_id=principal.project_id, path=body.path
    )
    new = requests.NewRequest(
        session_id="",
        kind="load_weights",
        body=state.load_body(body.path, body.optimizer),
        model_id=body.model_id,
        seq_id=body.seq_id,
    )
    return _queue(session, principal.project_id, new, request)


@router.post(
    "/save_weights_for_sampler",
    response_model=wire.UntypedAPIFuture,
    operation_id="tinker_save_weights_for_sampler",
    responses=GONE,
)
def save_weights_for_sampler(
    body: sampling.SaveWeightsForSamplerRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    request: Request,
) -> wire.UntypedAPIFuture:
    """Queue a snapshot of a training client's adapters for sampling, run in `seq_id` order.
    Named (`path`), the future's answer is `{"path": "tinker://<model_id>/sampler_weights/
    <name>"}`; unnamed (`save_weights_and_get_sampling_client`), `{"sampling_session_id"}` of a
    sampling session of it. 410 for an ended session, 404 for another project's model."""
    row = samplers.save(
        session=session,
        project_id=principal.project_id,
        model_id=body.model_id,
        seq_id=body.seq_id,
        name=body.path,
        request_key=_retry_key(request),
    )
    return _receipt(session, row, request, target=body.model_id)


@router.post(
    "/create_sampling_session",
    response_model=sampling.CreateSamplingSessionResponse,
    operation_id="tinker_create_sampling_session",
    responses=GONE,
)
def create_sampling_session(
    body: sampling.CreateSamplingSessionRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    request: Request,
) -> sampling.CreateSamplingSessionResponse:
    """A sampling client of the session on weights a training client of the project saved
    (`model_path`, `tinker://<model_id>/sampler_weights/<name>`), served by that training
    client's session job. 422 at `model_path` without one (sampling a bare base model is not
    served), 410 for an ended session, 404 for another project's session or path."""
    row = samplers.create(
        session=session,
        project_id=principal.project_id,
        session_id=body.session_id,
        model_path=body.model_path,
    )
    session.commit()
    audit.name_target(request, row.id)
    return sampling.CreateSamplingSessionResponse(sampling_session_id=row.id)


@router.get(
    "/samplers/{sampler_id}",
    response_model=sampling.GetSamplerResponse,
    operation_id="tinker_samplers_get",
    dependencies=[Quiet],
)
def get_sampler(
    sampler_id: SAMPLER_ID, principal: TinkerReadPrincipal, session: SessionDep
) -> sampling.GetSamplerResponse:
    """A sampling session of the project: its base model and weights' path. 404 for another
    project's."""
    found = samplers.get(session=session, project_id=principal.project_id, sampler_id=sampler_id)
    return sampling.GetSamplerResponse(
        sampler_id=found.id, base_model=found.base_model, model_path=found.path
    )


@router.post(
    "/asample",
    response_model=sampling.SampleFuture,
    operation_id="tinker_asample",
    dependencies=[Quiet],
    responses=GONE,
)
def asample(
    body: sampling.SampleRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    request: Request,
) -> sampling.SampleFuture:
    """Queue `num_samples` completions of a prompt from a sampling session's weights, run by
    the session job holding them between its training calls (never behind them); the future's
    answer is a protobuf `SampleResponse`: per sample its tokens, stop reason and the model's
    log-probability of each (the forward pass's, temperature 1), and the prompt's when
    `prompt_logprobs`. 410 for an ended session, 404 for another project's sampling session."""
    row = samplers.sample(
        session=session,
        project_id=principal.project_id,
        sampler_id=body.sampling_session_id,
        request=body.model_dump(mode="json"),
        request_key=_retry_key(request),
    )
    session.commit()
    _wake(request, row.model_id)
    ids = [f"{row.id}:{i}" for i in range(body.num_samples)]
    return sampling.SampleFuture(request_id=row.id, sample_sequence_ids=ids)


@router.post(
    "/retrieve_future",
    operation_id="tinker_retrieve_future",
    dependencies=[Quiet],
    responses={
        200: {
            "description": "The call's answer (JSON, or protobuf for `forward_backward` and "
            "`sample`), `try_again` while it waits, or its error",
            "content": {
                "application/json": {
                    "example": {
                        "type": "try_again",
                        "request_id": "req_0123456789abcdef",
                        "queue_state": "paused_capacity",
                        "queue_state_reason": "session job queued",
                    }
                },
                "application/x-protobuf": {},
            },
        }
    },
)
async def retrieve_future(
    body: wire.RetrieveFutureRequest,
    principal: TinkerReadPrincipal,
    session: SessionDep,
    request: Request,
) -> Response:
    """A call's answer, the same bytes for every poll: held up to 30 s while it waits, then
    `try_again` with its session job's queue state (`paused_capacity` while the job waits for
    devices). A failed call answers `{"error", "category"}`. 404 for another project's."""
    project_id, request_id = principal.project_id, body.request_id
    answer = await run_in_threadpool(_poll, session, project_id, request_id)
    await run_in_threadpool(session.close)  # no connection is held while waiting
    deadline = time.monotonic() + LONG_POLL_S
    for nap in _naps():
        if answer.settled or time.monotonic() + nap > deadline:
            break
        await asyncio.sleep(nap)
        answer = await run_in_threadpool(
            _poll_fresh, request.app.state.sessionmaker, project_id, request_id
        )
    return answer.response


class _Answer:
    """What one read of a call's row says: its final answer, or `try_again`."""

    def __init__(
        self, row: SessionRequest, job_state: str | None, ended: str | None = None
    ) -> None:
        self.settled = requests.is_settled(row) or ended is not None
        if ended is not None:  # its job will never answer it
            failed = wire.RequestFailedResponse(error=ended, category="server")
            self.response = Response(failed.model_dump_json(), media_type="application/json")
        elif row.state == RequestState.DONE:
            self.response = Response(content=row.result, media_type=row.result_type)
        elif row.state == RequestState.FAILED:
            failed = wire.RequestFailedResponse(
                error=row.error or "failed", category=_category(row.error_category)
            )
            self.response = Response(failed.model_dump_json(), media_type="application/json")
        else:
            waiting = job_state in (None, JobState.QUEUED, JobState.PREEMPTING, JobState.PAUSED)
            again = wire.TryAgainResponse(
                request_id=row.id,
                queue_state="paused_capacity" if waiting else "active",
                queue_state_reason=f"session job {job_state}" if job_state else None,
            )
            self.response = Response(again.model_dump_json(), media_type="application/json")


def _category(value: str | None) -> Any:
    return value if value in ("unknown", "server", "user") else "unknown"


def _naps() -> Any:
    yield from POLL_NAPS_S
    while True:
        yield POLL_NAPS_S[-1]


def _poll(session: Session, project_id: str, request_id: str) -> _Answer:
    row = requests.get(session=session, project_id=project_id, request_id=request_id)
    job_state = None
    if not requests.is_settled(row) and row.model_id is not None:
        model = session.get(SessionModel, row.model_id)
        job = session.get(Job, model.job_id) if model is not None else None
        if job is not None and job.state in TERMINAL_STATES:
            ended = f"the session's job {job.id} has ended ({job.state}): {job.error or ''}"
            return _Answer(row, None, ended=ended.rstrip(": "))
        job_state = None if job is None else job.state
    return _Answer(row, job_state)


def _poll_fresh(factory: Callable[[], Session], project_id: str, request_id: str) -> _Answer:
    with factory() as session:
        return _poll(session, project_id, request_id)
