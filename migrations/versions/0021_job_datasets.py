"""job_datasets: which jobs named which datasets

Revision ID: 0021_job_datasets
Revises: 0020_evaluations
Create Date: 2026-11-28 09:30:00

One row per dataset a job's spec names (`field`: its place in the spec, e.g. `data.dataset`),
written with the job at submission, so a dataset's page lists the jobs that used it (issue 28,
item 2). Existing jobs get theirs from their stored specs: every `dataset` / `eval_dataset`
string that is the id of a dataset of the job's project (submission pins names to ids).
"""

import json
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0021_job_datasets"
down_revision: str | None = "0020_evaluations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# Frozen here (a migration does not import the code it migrates for): the same walk as
# core.jobs.service.dataset_fields at the time of writing.
_KEYS = ("dataset", "eval_dataset")


def _fields(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key in _KEYS and isinstance(value, str):
                yield where, value
            else:
                yield from _fields(value, where)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _fields(value, f"{path}.{index}")


def upgrade() -> None:
    op.create_table(
        "job_datasets",
        sa.Column(
            "job_id", BigId, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column(
            "dataset_id",
            sa.String(40),
            sa.ForeignKey("datasets.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("field", sa.String(200), primary_key=True),
    )
    op.create_index("ix_job_datasets_dataset_id", "job_datasets", ["dataset_id"])
    bind = op.get_bind()
    owned = {
        (project, dataset)
        for dataset, project in bind.execute(sa.text("SELECT id, project_id FROM datasets"))
    }
    if not owned:
        return
    rows = []
    for job_id, project_id, spec in bind.execute(sa.text("SELECT id, project_id, spec FROM jobs")):
        loaded = json.loads(spec) if isinstance(spec, str) else spec
        for field, value in _fields(loaded):
            if (project_id, value) in owned and len(field) <= 200:
                rows.append({"job_id": job_id, "dataset_id": value, "field": field})
    if rows:
        table = sa.table(
            "job_datasets", sa.column("job_id"), sa.column("dataset_id"), sa.column("field")
        )
        op.bulk_insert(table, rows)


def downgrade() -> None:
    op.drop_index("ix_job_datasets_dataset_id", table_name="job_datasets")
    op.drop_table("job_datasets")
