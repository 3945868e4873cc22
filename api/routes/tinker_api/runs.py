"""Training runs and their checkpoints in the Tinker-compatible API (`/tinker/api/v1`, issue
47), as the official client's `RestClient` reads and changes them: `list_training_runs`,
`get_training_run`, `list_checkpoints`, `list_user_checkpoints`,
`get_weights_info_by_tinker_path`, `delete_checkpoint`, `set_checkpoint_ttl`,
`publish_checkpoint_from_tinker_path` and `unpublish_checkpoint_from_tinker_path`. A run is a
training client of the key's project, its checkpoints the states it saved by name
(`core.sessions.runs`); another project's is 404, except that a published state's weights info
and loads are every project's. Not served: the archive URLs.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request, Response

from api import audit
from api.deps import SessionDep, SettingsDep, TinkerJobsWritePrincipal, TinkerReadPrincipal
from api.errors import ERROR_RESPONSES
from api.schemas import tinker as wire
from api.schemas import tinker_runs as runs_wire
from core.platform.tables import aware
from core.sessions import runs

router = APIRouter(prefix=wire.PREFIX, tags=["tinker"], responses=ERROR_RESPONSES)
# The client's `access_scope`: every run here is the project's, so both read the same.
AccessScope = Annotated[
    Literal["owned", "accessible"], Query(description="Both: the runs of the key's project.")
]


RUN_ID = Annotated[
    str, Path(max_length=120, description="A training run: its training client's model id.")
]
Limit = Annotated[int, Query(ge=1, le=1000, description="Items in the page.")]
Offset = Annotated[int, Query(ge=0, le=10**9, description="Items skipped before it.")]


def _checkpoint(state: runs.SavedState) -> runs_wire.RunCheckpoint:
    return runs_wire.RunCheckpoint(
        checkpoint_id=state.checkpoint_id,
        checkpoint_type="training",
        time=aware(state.created_at),
        tinker_path=state.tinker_path,
        size_bytes=state.size_bytes,
        expires_at=None if state.expires_at is None else aware(state.expires_at),
        public=state.public,
    )


def _run(run: runs.Run) -> runs_wire.TrainingRun:
    row = run.row
    last = _checkpoint(run.checkpoints[-1]) if run.checkpoints else None
    return runs_wire.TrainingRun(
        training_run_id=row.id,
        base_model=row.base_model,
        model_owner=row.project_id if run.owner is None else run.owner,
        is_lora=True,
        lora_rank=row.lora_rank,
        last_request_time=aware(run.last_request_at),
        last_checkpoint=last,
        user_metadata=run.user_metadata or None,
    )


@router.get(
    "/training_runs", response_model=runs_wire.TrainingRunsResponse, operation_id="tinker_runs_list"
)
def list_training_runs(
    principal: TinkerReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    limit: Limit = 20,
    offset: Offset = 0,
    access_scope: AccessScope = "owned",
    project_id: Annotated[
        str | None, Query(max_length=100, description="Ignored: the key names its project.")
    ] = None,
) -> runs_wire.TrainingRunsResponse:
    """The project's training runs, newest first (`RestClient.list_training_runs`)."""
    del access_scope, project_id
    found, total = runs.page(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        limit=limit,
        offset=offset,
    )
    return runs_wire.TrainingRunsResponse(
        training_runs=[_run(r) for r in found],
        cursor=runs_wire.PageCursor(offset=offset, limit=limit, total_count=total),
    )


@router.get(
    "/training_runs/{training_run_id}",
    response_model=runs_wire.TrainingRun,
    operation_id="tinker_runs_get",
)
def get_training_run(
    training_run_id: RUN_ID,
    principal: TinkerReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    access_scope: AccessScope = "owned",
) -> runs_wire.TrainingRun:
    """One training run of the project (`RestClient.get_training_run`). 404 for another
    project's."""
    del access_scope
    run = runs.get(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        model_id=training_run_id,
    )
    return _run(run)


@router.get(
    "/training_runs/{training_run_id}/checkpoints",
    response_model=runs_wire.CheckpointsListResponse,
    operation_id="tinker_runs_checkpoints",
)
def list_checkpoints(
    training_run_id: RUN_ID,
    principal: TinkerReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> runs_wire.CheckpointsListResponse:
    """A training run's named states, oldest first (`RestClient.list_checkpoints`). 404 for
    another project's run."""
    run = runs.get(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        model_id=training_run_id,
    )
    return runs_wire.CheckpointsListResponse(checkpoints=[_checkpoint(c) for c in run.checkpoints])


@router.get(
    "/checkpoints",
    response_model=runs_wire.CheckpointsListResponse,
    operation_id="tinker_checkpoints_list",
)
def list_user_checkpoints(
    principal: TinkerReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    limit: Limit = 100,
    offset: Offset = 0,
) -> runs_wire.CheckpointsListResponse:
    """Every named state of the project's training runs, newest first
    (`RestClient.list_user_checkpoints`)."""
    states = runs.all_states(session=session, settings=settings, project_id=principal.project_id)
    return runs_wire.CheckpointsListResponse(
        checkpoints=[_checkpoint(c) for c in states[offset : offset + limit]],
        cursor=runs_wire.PageCursor(offset=offset, limit=limit, total_count=len(states)),
    )


@router.post(
    "/weights_info",
    response_model=runs_wire.WeightsInfoResponse,
    operation_id="tinker_weights_info",
)
def get_weights_info(
    body: runs_wire.WeightsInfoRequest,
    principal: TinkerReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> runs_wire.WeightsInfoResponse:
    """The base model and LoRA shape of saved weights (`RestClient.get_weights_info_by_tinker_
    path`): the project's, or a state another project published. 422 at `tinker_path` for a
    path of another form; 404 for another project's unpublished state or a state never saved."""
    info = runs.weights_info(
        session=session, settings=settings, project_id=principal.project_id, path=body.tinker_path
    )
    return runs_wire.WeightsInfoResponse(is_lora=True, **asdict(info))


STATE_NAME = Annotated[
    str, Path(max_length=100, description="The state's name (`tinker://<run>/weights/<name>`).")
]


@router.delete(
    "/training_runs/{training_run_id}/checkpoints/weights/{name}",
    status_code=204,
    response_class=Response,
    operation_id="tinker_checkpoint_delete",
)
def delete_checkpoint(
    training_run_id: RUN_ID,
    name: STATE_NAME,
    request: Request,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """Delete a saved state (`RestClient.delete_checkpoint`, `..._from_tinker_path`): it is no
    longer listed or loadable; its bytes stay with the session job's checkpoints. 404 for
    another project's run, a name it never saved, or a state already deleted or expired."""
    runs.delete_state(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        model_id=training_run_id,
        name=name,
    )
    return _changed(request, session, training_run_id, name)


@router.put(
    "/training_runs/{training_run_id}/checkpoints/weights/{name}/ttl",
    status_code=204,
    response_class=Response,
    operation_id="tinker_checkpoint_ttl",
)
def set_checkpoint_ttl(
    training_run_id: RUN_ID,
    name: STATE_NAME,
    body: runs_wire.SetTtlRequest,
    request: Request,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """Set or remove a saved state's expiry (`RestClient.set_checkpoint_ttl_from_tinker_path`):
    past it, the state is neither listed nor loadable. 422 at `ttl_seconds` outside an hour to
    ten years; 404 as `delete_checkpoint`."""
    runs.set_state_ttl(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        model_id=training_run_id,
        name=name,
        ttl_seconds=body.ttl_seconds,
    )
    return _changed(request, session, training_run_id, name)


@router.post(
    "/training_runs/{training_run_id}/checkpoints/weights/{name}/publish",
    status_code=204,
    response_class=Response,
    operation_id="tinker_checkpoint_publish",
)
def publish_checkpoint(
    training_run_id: RUN_ID,
    name: STATE_NAME,
    request: Request,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """Publish a saved state (`RestClient.publish_checkpoint_from_tinker_path`): every project's
    key may then read its weights info and load it into a training client of its own
    (`load_state`, `create_training_client_from_state`); listing, deleting, its expiry and
    unpublishing stay the owner's. A published state stays so (204: the client retries a 409
    for five minutes, where Tinker documents one). 404 as `delete_checkpoint`."""
    return _publish(training_run_id, name, request, principal, session, settings, public=True)


@router.delete(
    "/training_runs/{training_run_id}/checkpoints/weights/{name}/publish",
    status_code=204,
    response_class=Response,
    operation_id="tinker_checkpoint_unpublish",
)
def unpublish_checkpoint(
    training_run_id: RUN_ID,
    name: STATE_NAME,
    request: Request,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """Make a published state the project's alone again
    (`RestClient.unpublish_checkpoint_from_tinker_path`): other projects' later reads and loads
    are 404 (a training client that loaded it keeps its weights). A private state stays so
    (204). 404 as `delete_checkpoint`."""
    return _publish(training_run_id, name, request, principal, session, settings, public=False)


def _publish(
    training_run_id: str,
    name: str,
    request: Request,
    principal: TinkerJobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    *,
    public: bool,
) -> Response:
    runs.publish_state(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        model_id=training_run_id,
        name=name,
        public=public,
    )
    return _changed(request, session, training_run_id, name)


def _changed(request: Request, session: SessionDep, training_run_id: str, name: str) -> Response:
    """Commit a change to a saved state, name the state in the audit record, answer 204."""
    session.commit()
    audit.name_target(request, f"{training_run_id}/weights/{name}")
    return Response(status_code=204)
