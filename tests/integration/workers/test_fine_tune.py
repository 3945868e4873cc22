"""A fine-tune end to end through a real worker: job B with `model.init_from: {job: A}` and QAT
starts from A's pinned checkpoint (`--init-from`), and its QAT metrics reach the database."""

from __future__ import annotations

import math

import pytest
from celery import Celery
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from core.jobs import init_from
from core.jobs import service as jobs
from core.platform.tables import Checkpoint
from tests.conftest import ProjectKey
from tests.integration.workers.helpers import (
    TERMINAL,
    Worker,
    job_events,
    launches,
    metric_series,
    run_to_success,
    send,
    tiny_spec,
    wait_state,
)


def test_a_qat_fine_tune_starts_from_the_pinned_checkpoint_of_an_earlier_job(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    base = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": 10},
        eval={"interval_steps": 10},
    )
    source_id = run_to_success(engine, celery_client, project, base, worker, 120).id

    fine_tune = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        model={"init_from": {"job": source_id}},
        train={"max_steps": 2},
        eval={"interval_steps": 2},
        checkpoint={"interval_steps": 2},
        qat={"group_size": 32},
    )
    with Session(engine, expire_on_commit=False) as session:  # as POST /v1/jobs does
        pinned = init_from.pin(session=session, project_id=project.project_id, spec=fine_tune)
        job_id = jobs.create(session=session, project_id=project.project_id, spec=pinned).job.id
        checkpoint = session.scalars(
            select(Checkpoint).where(Checkpoint.job_id == source_id, Checkpoint.step == 10)
        ).one()
    assert pinned.model.init_from is not None
    assert pinned.model.init_from.checkpoint == checkpoint.id
    send(celery_client, job_id, worker.queue)
    job = wait_state(engine, job_id, TERMINAL, 120, worker)
    assert job.state == "succeeded", job.error

    (launch,) = launches(job_events(engine, job_id))
    argv = launch.data["argv"]
    assert argv[argv.index("--init-from") + 1] == checkpoint.uri
    # Step 0 evaluates the source's weights (here fake-quantized): near the source's final
    # eval loss, far below a random init's ln(256) nats.
    (start,) = metric_series(engine, job_id, "eval_loss")[:1]
    source_eval = metric_series(engine, source_id, "eval_loss")[-1].value
    assert start.step == 0
    assert start.value == pytest.approx(source_eval, rel=0.05)
    assert start.value < math.log(256) - 0.5
    fake = metric_series(engine, job_id, "eval_loss_qat_fake")
    converted = metric_series(engine, job_id, "eval_loss_qat_converted")
    assert [p.step for p in fake] == [p.step for p in converted] == [2]
    assert converted[0].value == pytest.approx(fake[0].value, rel=1e-4)
