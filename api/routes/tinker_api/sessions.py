"""The Tinker-compatible API (`/tinker/api/v1`, issue 47): what the official `tinker` client
(0.38.0, unchanged) calls to connect, read the server's capabilities, create a session and
keep it alive, and the session reads of its `RestClient`. Its `base_url` is `<api>/tinker`.

Paths and bodies are the client's (docs/TINKER-WIRE.md; `api/schemas/tinker.py`); errors keep
Torchyard's one body, which the client only shows (it acts on the status: 401 refused key, 404
not this project's, 410 an ended session, whose heartbeat loop then stops). The key goes in
`X-API-Key` as `tml-<key>` (`api.deps.get_tinker_principal`).

Training clients: `create_model` makes one, a session job through the one door
(`core.sessions.training_clients`), answered at once with its model id; `get_info` reads it;
their calls (`forward_backward`, `optim_step`) and `retrieve_future` are
`api.routes.tinker_api.calls`'; sampling (`save_weights_for_sampler`, `create_sampling_session`,
`asample`) are `api.routes.tinker_api.calls`' too; training runs and their checkpoints
`api.routes.tinker_api.runs`'. Not served: the client's `telemetry` (a 404 it
logs and drops).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from api import audit
from api.deps import (
    SessionDep,
    SettingsDep,
    TinkerJobsWritePrincipal,
    TinkerPrincipal,
    TinkerReadPrincipal,
)
from api.errors import ERROR_RESPONSES, ErrorBody
from api.schemas import tinker as wire
from core.platform.errors import InvalidInput
from core.platform.tables import SessionState, aware
from core.sessions import listing, training_clients
from core.sessions import service as sessions

PREFIX = wire.PREFIX
router = APIRouter(prefix=PREFIX, tags=["tinker"], responses=ERROR_RESPONSES)
Quiet = Depends(audit.not_audited)  # keep-alives and config reads: audited only when refused

# What a session can do today: train (forward_backward, optim_step) and sample its weights.
TRAINABLE, SAMPLEABLE = True, True
NOT_YET = (
    "Torchyard trains Tinker training clients (forward_backward, forward, optim_step, "
    "save_state, load_state, create_training_client_from_state), samples weights they saved "
    "(save_weights_for_sampler, save_weights_and_get_sampling_client), lists training runs "
    "and checkpoints, deletes them and sets their expiry; sampling a bare base model and "
    "publishing checkpoints are not served yet."
)
SESSION_ID = Annotated[str, Path(max_length=40, description="A session id (`ses_...`).")]
# The client's `access_scope`: every session here is the project's, so both read the same.
AccessScope = Annotated[
    Literal["owned", "accessible"], Query(description="Both: the sessions of the key's project.")
]


@router.get("/healthz", response_model=wire.HealthResponse, operation_id="tinker_healthz")
def healthz() -> wire.HealthResponse:
    """The API is up (no key needed; touches nothing else)."""
    return wire.HealthResponse()


@router.post(
    "/client/config",
    response_model=wire.ClientConfigResponse,
    operation_id="tinker_client_config",
    dependencies=[Quiet],
)
def client_config(
    body: wire.ClientConfigRequest, principal: TinkerPrincipal
) -> wire.ClientConfigResponse:
    """The client's feature flags, fetched once at start: its key as it is (no JWT
    exchange), httpx's own transport, uncompressed protobuf bodies."""
    del body, principal  # the same flags for every client and key
    return wire.ClientConfigResponse()


@router.post(
    "/client/dynamic_config",
    response_model=wire.ClientDynamicConfigResponse,
    operation_id="tinker_client_dynamic_config",
    dependencies=[Quiet],
)
def client_dynamic_config(
    body: wire.ClientConfigRequest, principal: TinkerPrincipal
) -> wire.ClientDynamicConfigResponse:
    """The flags a live client fetches again every `refresh_interval_sec`: no cancellation
    requests."""
    del body, principal
    return wire.ClientDynamicConfigResponse()


@router.get(
    "/get_server_capabilities",
    response_model=wire.GetServerCapabilitiesResponse,
    operation_id="tinker_get_server_capabilities",
)
def get_server_capabilities(
    principal: TinkerReadPrincipal, settings: SettingsDep
) -> wire.GetServerCapabilitiesResponse:
    """The registered base models (`TORCHYARD_BASE_MODELS`) by name, each with the longest
    datum its sessions take (its `seq_len`); `trainable` and `sampleable` say whether this
    server can run them in a session yet."""
    del principal  # the deployment's models, the same for every project
    return wire.GetServerCapabilitiesResponse(
        supported_models=[
            wire.SupportedModel(
                model_name=name,
                max_context_length=entry.seq_len,
                trainable=TRAINABLE,
                sampleable=SAMPLEABLE,
            )
            for name, entry in settings.base_models.items()
        ]
    )


@router.post(
    "/create_session",
    response_model=wire.CreateSessionResponse,
    operation_id="tinker_create_session",
)
def create_session(
    body: wire.CreateSessionRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    request: Request,
) -> wire.CreateSessionResponse:
    """A new session of the key's project, with the client's tags, metadata and version; a
    retry with the same `X-Idempotency-Key` answers the session its first try made. 422 at
    `project_id` when it names another project."""
    if body.project_id not in (None, principal.project_id, principal.project_name):
        msg = f"a key acts in its own project ({principal.project_id}) only"
        raise InvalidInput(
            f"project_id: {msg}",
            details=[{"loc": ["body", "project_id"], "msg": msg, "type": "value_error"}],
        )
    retry_key = request.headers.get("x-idempotency-key")
    row = sessions.create(
        session=session,
        project_id=principal.project_id,
        owner=principal.actor,
        new=sessions.NewSession(
            tags=body.tags,
            user_metadata=body.user_metadata or {},
            sdk_version=body.sdk_version,
            display_name=body.display_name,
        ),
        request_key=retry_key[:200] if retry_key else None,
    )
    session.commit()
    audit.name_target(request, row.id)
    return wire.CreateSessionResponse(session_id=row.id, warning_message=NOT_YET)


@router.post(
    "/session_heartbeat",
    response_model=wire.SessionHeartbeatResponse,
    operation_id="tinker_session_heartbeat",
    dependencies=[Quiet],
    responses={410: {"model": ErrorBody, "description": "The session has ended (idle)"}},
)
def session_heartbeat(
    body: wire.SessionHeartbeatRequest, principal: TinkerJobsWritePrincipal, session: SessionDep
) -> wire.SessionHeartbeatResponse:
    """Keep a session alive (the client sends one every 10 s). 410 when it has ended: the
    client stops its heartbeats."""
    sessions.heartbeat(session=session, project_id=principal.project_id, session_id=body.session_id)
    session.commit()
    return wire.SessionHeartbeatResponse()


@router.post(
    "/sessions/{session_id}/finish",
    status_code=204,
    operation_id="tinker_sessions_finish",
    response_class=Response,
)
def finish_session(
    session_id: SESSION_ID,
    body: wire.FinishSessionRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
) -> Response:
    """End a session because its client closed it (`ServiceClient.close`, or the end of its
    `with` block). An ended session stays as it ended (the first reason wins)."""
    reason = f"client finished: {body.reason.type}" + (f": {body.detail}" if body.detail else "")
    sessions.finish(
        session=session, project_id=principal.project_id, session_id=session_id, reason=reason
    )
    session.commit()
    return Response(status_code=204)


@router.get(
    "/sessions", response_model=wire.ListSessionsResponse, operation_id="tinker_sessions_list"
)
def list_sessions(
    principal: TinkerReadPrincipal,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many ids.")] = 20,
    offset: Annotated[int, Query(ge=0, le=10**9, description="Skip this many first.")] = 0,
    access_scope: AccessScope = "owned",
) -> wire.ListSessionsResponse:
    """The project's session ids, newest first (`RestClient.list_sessions`)."""
    del access_scope
    ids = sessions.list_ids(
        session=session, project_id=principal.project_id, limit=limit, offset=offset
    )
    return wire.ListSessionsResponse(sessions=ids)


@router.get(
    "/sessions/{session_id}",
    response_model=wire.GetSessionResponse,
    operation_id="tinker_sessions_get",
)
def get_session(
    session_id: SESSION_ID,
    principal: TinkerReadPrincipal,
    session: SessionDep,
    access_scope: AccessScope = "owned",
) -> wire.GetSessionResponse:
    """One session of the project (`RestClient.get_session`): what the client reads, and its
    state, tags, version and heartbeat times. 404 for another project's."""
    del access_scope
    row = sessions.get(session=session, project_id=principal.project_id, session_id=session_id)
    training_run_ids, sampler_ids = listing.client_ids(session=session, session_id=row.id)
    return wire.GetSessionResponse(
        training_run_ids=training_run_ids,
        sampler_ids=sampler_ids,
        user_metadata={str(k): str(v) for k, v in row.user_metadata.items()},
        display_name=row.display_name,
        session_id=row.id,
        state="ended" if row.state == SessionState.ENDED else "active",
        tags=list(row.tags),
        sdk_version=row.sdk_version,
        owner=row.owner,
        created_at=aware(row.created_at),
        last_heartbeat_at=aware(row.last_heartbeat_at),
        ended_at=None if row.ended_at is None else aware(row.ended_at),
        ended_reason=row.ended_reason,
    )


@router.post(
    "/create_model",
    response_model=wire.UntypedAPIFuture,
    operation_id="tinker_create_model",
    responses={410: {"model": ErrorBody, "description": "The session has ended"}},
)
def create_model(
    body: wire.CreateModelRequest,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    request: Request,
) -> wire.UntypedAPIFuture:
    """A training client of the session (`create_lora_training_client`): a LoRA of a registered
    base model, served by a session job of the project (it shows in `/v1/jobs`). Answered at
    once: its future holds the model id. 422 at `base_model` for a model not registered, 410
    for an ended session, 404 for another project's."""
    lora = body.lora_config or wire.LoraConfig(rank=32)
    retry_key = request.headers.get("x-idempotency-key")
    row = training_clients.create(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        owner=principal.actor,
        new=training_clients.NewModel(
            session_id=body.session_id,
            model_seq_id=body.model_seq_id,
            base_model=body.base_model,
            rank=lora.rank,
            seed=lora.seed,
            train_mlp=lora.train_mlp,
            train_attn=lora.train_attn,
            train_unembed=lora.train_unembed,
        ),
        body=body.model_dump_json().encode(),
        request_key=retry_key[:200] if retry_key else None,
    )
    session.commit()
    audit.name_target(request, row.session_id)
    return wire.UntypedAPIFuture(
        request_id=row.id, model_id=training_clients.model_id(body.session_id, body.model_seq_id)
    )


@router.post(
    "/get_info",
    response_model=wire.GetInfoResponse,
    operation_id="tinker_get_info",
    dependencies=[Quiet],
)
def get_info(
    body: wire.GetInfoRequest,
    principal: TinkerReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> wire.GetInfoResponse:
    """A training client of the project: its base model and LoRA rank. 404 for another
    project's."""
    row = training_clients.get(
        session=session, project_id=principal.project_id, model_id=body.model_id
    )
    return wire.GetInfoResponse.model_validate(
        training_clients.info(row, settings.base_models.get(row.base_model))
    )
