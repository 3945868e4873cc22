"""0024_pruned_jobs: a sweep trial's job that its pruner stopped before `pruned` existed ended
`cancelled`; after the migration it reads `pruned` with where it was stopped, as a new one
does, and a user's cancel stays a cancel."""

from __future__ import annotations

from alembic import command
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from core.access import auth
from core.jobs import service as jobs
from core.platform.db import alembic_config, make_engine
from core.platform.tables import Job, JobState, Sweep, SweepTrial
from jobspec.job import parse_job_spec


def test_jobs_pruned_before_0024_become_pruned_and_back(empty_database: str) -> None:
    config = alembic_config(empty_database)
    command.upgrade(config, "head")
    engine = make_engine(empty_database)
    try:
        with Session(engine) as session:
            project = auth.create_project(session=session, name="old")
            sweep = Sweep(project_id=project.id, name="s", spec={}, study_name="s")
            session.add(sweep)
            ids = [
                jobs.create(
                    session=session,
                    project_id=project.id,
                    spec=parse_job_spec({"name": n, "data": {"uri": "/x"}}),
                ).job.id
                for n in ("pruned-asha", "pruned-median", "cancelled-trial", "cancelled")
            ]
            session.flush()
            for number, (job_id, step, rung) in enumerate(
                [(ids[0], 20, 1), (ids[1], 40, None), (ids[2], None, None)]
            ):
                session.add(
                    SweepTrial(
                        sweep_id=sweep.id,
                        number=number,
                        optuna_trial_id=number,
                        job_id=job_id,
                        pruned_step=step,
                        pruned_rung=rung,
                    )
                )
            # as a release before 0024 left them
            session.execute(update(Job).values(state=JobState.CANCELLED))
            session.commit()
            sweep_id = sweep.id
        command.downgrade(config, "0023_dataset_files")
        command.upgrade(config, "head")

        def rows() -> list[tuple[str, str | None]]:
            with Session(engine) as session:
                query = select(Job.state, Job.error).where(Job.id.in_(ids)).order_by(Job.id)
                return [(state, error) for state, error in session.execute(query)]

        assert rows() == [
            ("pruned", f"pruned by sweep {sweep_id} at step 20, rung 1"),
            ("pruned", f"pruned by sweep {sweep_id} at step 40"),
            ("cancelled", None),
            ("cancelled", None),
        ]
        assert [e for _, e in rows()[:2]] == [
            jobs.pruned_reason(sweep_id, 20, 1),
            jobs.pruned_reason(sweep_id, 40, None),
        ]  # the words the controller writes for a new one
        command.downgrade(config, "0023_dataset_files")
        assert [s for s, _ in rows()] == ["cancelled"] * 4
    finally:
        engine.dispose()
