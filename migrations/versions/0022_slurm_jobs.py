"""slurm_jobs: the placements of jobs on Slurm pools

Revision ID: 0022_slurm_jobs
Revises: 0021_job_datasets
Create Date: 2026-11-28 16:00:00

One row per `sbatch` of a job on a Slurm pool (`workers.slurm`, issue 27): the Slurm job id,
Slurm's state, reason and start estimate, and whether its node agents claimed the job.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_slurm_jobs"
down_revision: str | None = "0021_job_datasets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "slurm_jobs",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", BigId, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("pool", sa.String(200), nullable=False),
        sa.Column("slurm_job_id", sa.Integer(), nullable=True),
        sa.Column("state", sa.String(40), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("claimed", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_slurm_jobs_job_id", "slurm_jobs", ["job_id"])
    op.create_index("ix_slurm_jobs_slurm_job_id", "slurm_jobs", ["slurm_job_id"])


def downgrade() -> None:
    op.drop_table("slurm_jobs")
