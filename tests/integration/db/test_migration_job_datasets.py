"""0021_job_datasets gives jobs submitted before it the rows submission writes now: a
dataset's page lists the jobs that used it, old ones included."""

from __future__ import annotations

from alembic import command
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from core.access import auth
from core.datasets import service as datasets
from core.jobs import service as jobs
from core.platform.db import alembic_config, make_engine
from core.platform.tables import JobDataset
from jobspec.job import parse_job_spec


def test_jobs_submitted_before_0021_get_their_dataset_rows(empty_database: str) -> None:
    config = alembic_config(empty_database)
    command.upgrade(config, "head")
    engine = make_engine(empty_database)
    try:
        with Session(engine) as session:
            project = auth.create_project(session=session, name="old")
            other = auth.create_project(session=session, name="other")

            def dataset(project_id: str, name: str) -> str:
                made = datasets.create(
                    session=session,
                    project_id=project_id,
                    name=name,
                    uri=f"/data/{name}.jsonl",
                    size_bytes=1,
                    sha256="0" * 64,
                    num_files=1,
                    format="prompt_completion",
                )
                return made.id

            train, held, theirs = (
                dataset(project.id, "t"),
                dataset(project.id, "h"),
                dataset(other.id, "x"),
            )
            specs = [
                {"name": "a", "data": {"dataset": train, "eval_dataset": held}},
                {"name": "b", "data": {"dataset": train}, "eval_after": [
                    {"kind": "generate", "dataset": held}]},
                {"name": "c", "data": {"dataset": theirs}},  # another project's: no row
            ]  # fmt: skip
            for spec in specs:
                jobs.create(session=session, project_id=project.id, spec=parse_job_spec(spec))
            written = {tuple(r) for r in session.execute(select(JobDataset.__table__))}
            assert len(written) == 4
            session.execute(delete(JobDataset))
            session.commit()
        command.downgrade(config, "0020_evaluations")
        command.upgrade(config, "head")
        with Session(engine) as session:
            assert {tuple(r) for r in session.execute(select(JobDataset.__table__))} == written
    finally:
        engine.dispose()
