"""datasets: a directory's file filter and the files left out as not text

Revision ID: 0023_dataset_files
Revises: 0022_slurm_jobs
Create Date: 2026-11-29 12:00:00

A `text` directory is registered with `include` / `exclude` (glob / fnmatch patterns, as a
job's `data.include` / `exclude`) that are part of the dataset: a job on it reads only those
files. `left_out` lists the selected files that are not UTF-8 text (binary, NUL bytes, not
UTF-8), with their bytes: `{"files", "bytes", "of_files", "of_bytes", "examples"}` (issue 45,
item 1). Null for datasets registered before (their filter is a job's own) and for files.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0023_dataset_files"
down_revision: str | None = "0022_slurm_jobs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("include", Json, nullable=True))
        batch.add_column(sa.Column("exclude", Json, nullable=True))
        batch.add_column(sa.Column("left_out", Json, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("left_out")
        batch.drop_column("exclude")
        batch.drop_column("include")
