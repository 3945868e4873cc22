"""OpenAI-compatible fine-tuning jobs (`/openai/v1/fine_tuning/jobs`): each is a normal
Torchyard job (submitted as `POST /v1/jobs` submits), shown in OpenAI's shapes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request

from api import openai_errors
from api import openai_examples as ex
from api.deps import JobsWritePrincipal, ReadPrincipal, ServerPathsDep, SessionDep, SettingsDep
from api.openapi_examples import json_example
from core.jobs import service as jobs
from core.openai import projection
from core.openai.spec import FineTuneCreate, build
from core.submission import service as submission

router = APIRouter(
    prefix="/openai/v1/fine_tuning/jobs", tags=["openai"], responses=openai_errors.RESPONSES
)

FtJobId = Annotated[str, Path(max_length=40, description="`ftjob-<Torchyard job id>`.")]
After = Annotated[
    str | None, Query(max_length=40, description="Id of the previous page's last item.")
]
Limit = Annotated[int, Query(ge=1, le=100)]


@router.post("", responses={200: json_example(ex.FINE_TUNING_JOB)})
def create_job(
    body: Annotated[
        FineTuneCreate,
        Body(
            openapi_examples={
                "LoRA SFT": {"value": ex.FINE_TUNE_CREATE},
                "Reinforcement (GRPO)": {"value": ex.FINE_TUNE_CREATE_REINFORCEMENT},
            }
        ),
    ],
    principal: JobsWritePrincipal,
    session: SessionDep,
    settings: SettingsDep,
    request: Request,
) -> dict[str, Any]:
    """Fine-tune a registered base model (LoRA; `method.type` supervised, dpo or reinforcement)
    on an uploaded file. 400 (`param` names the field) for an unknown model, a file of the
    wrong format, or a grader or hyperparameter that cannot run."""
    spec, _ = build(session=session, settings=settings, project_id=principal.project_id, body=body)
    result = submission.submit(
        session=session,
        settings=settings,
        project_id=principal.project_id,
        spec=spec,
        owner=principal.key_name,
        door=submission.OPENAI,
    )
    return projection.job_object(result.job)


@router.get("", responses={200: json_example(ex.FINE_TUNING_JOB_LIST)})
def list_jobs(
    principal: ReadPrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    request: Request,
    after: After = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    """The project's fine-tuning jobs, newest first, `limit` at a time after `after`; with
    `metadata[<key>]=<value>` (any number) only those whose metadata has every such pair."""
    metadata = {
        k[len("metadata[") : -1]: v[:500]
        for k, v in request.query_params.items()
        if k.startswith("metadata[") and k.endswith("]") and len(k) <= 110
    }
    items, more = projection.jobs_page(session, principal.project_id, after, limit, metadata)
    return {
        "object": "list",
        "data": paths.hide(projection.job_objects(session, items)),
        "has_more": more,
    }


@router.get("/{job_id}", responses={200: json_example(ex.FINE_TUNING_JOB)})
def get_job(
    job_id: FtJobId, principal: ReadPrincipal, session: SessionDep, paths: ServerPathsDep
) -> dict[str, Any]:
    """One fine-tuning job; 404 for another project's."""
    job = projection.get_job(session, job_id, principal.project_id)
    return paths.hide(projection.job_objects(session, [job])[0])


@router.post("/{job_id}/cancel", responses={200: json_example(ex.FINE_TUNING_JOB)})
def cancel_job(
    job_id: FtJobId, principal: JobsWritePrincipal, session: SessionDep, paths: ServerPathsDep
) -> dict[str, Any]:
    """Cancel (409 once it has ended); the status reads `cancelled` when it has stopped."""
    job = projection.get_job(session, job_id, principal.project_id)
    job = jobs.cancel(session=session, job_id=job.id, project_id=principal.project_id)
    session.commit()
    return paths.hide(projection.job_object(job))


@router.post("/{job_id}/pause", responses={200: json_example(ex.FINE_TUNING_JOB)})
def pause_job(
    job_id: FtJobId, principal: JobsWritePrincipal, session: SessionDep, paths: ServerPathsDep
) -> dict[str, Any]:
    """Pause: a running job checkpoints and stops, a queued one leaves the queue; 409 else."""
    job = projection.get_job(session, job_id, principal.project_id)
    job = jobs.pause(session=session, job_id=job.id, project_id=principal.project_id)
    session.commit()
    return paths.hide(projection.job_object(job))


@router.post("/{job_id}/resume", responses={200: json_example(ex.FINE_TUNING_JOB)})
def resume_job(
    job_id: FtJobId,
    principal: JobsWritePrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    request: Request,
) -> dict[str, Any]:
    """Resume a paused job from its latest checkpoint; 409 in other states."""
    job = projection.get_job(session, job_id, principal.project_id)
    job = jobs.resume(session=session, job_id=job.id, project_id=principal.project_id)
    session.commit()  # and the job's run message goes
    return paths.hide(projection.job_object(job))


@router.get("/{job_id}/events", responses={200: json_example(ex.FINE_TUNING_EVENTS)})
def list_events(
    job_id: FtJobId,
    principal: ReadPrincipal,
    session: SessionDep,
    paths: ServerPathsDep,
    after: After = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    """The job's events (state changes, checkpoints, samples), newest first."""
    job = projection.get_job(session, job_id, principal.project_id)
    data, more = projection.events_page(session, job, after, limit)
    return {"object": "list", "data": paths.hide(data), "has_more": more}


@router.get("/{job_id}/checkpoints", responses={200: json_example(ex.FINE_TUNING_CHECKPOINTS)})
def list_checkpoints(
    job_id: FtJobId,
    principal: ReadPrincipal,
    session: SessionDep,
    after: After = None,
    limit: Limit = 10,
) -> dict[str, Any]:
    """The job's complete checkpoints, newest first, with the metrics at their step."""
    job = projection.get_job(session, job_id, principal.project_id)
    items = projection.checkpoint_objects(session, job)
    if after is not None:
        ids = [c["id"] for c in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return {
        "object": "list",
        "data": items[:limit],
        "has_more": len(items) > limit,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[:limit][-1]["id"] if items else None,
    }
