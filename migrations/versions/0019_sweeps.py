"""sweeps and sweep_trials; the `optuna` schema on Postgres

Revision ID: 0019_sweeps
Revises: 0018_worker_sandbox
Create Date: 2026-11-27 22:30:00

A sweep's trials are ordinary jobs (`sweep_trials.job_id`); the study itself lives in Optuna's
own tables (`optuna.storages.RDBStorage`), which Optuna creates and migrates on first use. On
Postgres they go to a schema of their own, `optuna`, created here: Optuna's tables include an
`alembic_version` of its own that would otherwise meet ours (core/sweeps/study.py).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0019_sweeps"
down_revision: str | None = "0018_worker_sandbox"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE SCHEMA IF NOT EXISTS optuna")
    op.create_table(
        "sweeps",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "project_id",
            sa.String(40),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("spec", Json, nullable=False),
        sa.Column("study_name", sa.String(100), nullable=False),
        sa.Column("owner", sa.String(100), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("best_trial", sa.Integer(), nullable=True),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_sweeps_project_id_id", "sweeps", ["project_id", "id"])
    op.create_index("ix_sweeps_state", "sweeps", ["state"])
    op.create_table(
        "sweep_trials",
        sa.Column(
            "sweep_id",
            BigId,
            sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("number", sa.Integer(), primary_key=True),
        sa.Column("optuna_trial_id", sa.Integer(), nullable=False),
        sa.Column(
            "job_id", BigId, sa.ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True
        ),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("params", Json, nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("pruned_step", sa.Integer(), nullable=True),
        sa.Column("pruned_rung", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_sweep_trials_job_id", "sweep_trials", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_sweep_trials_job_id", table_name="sweep_trials")
    op.drop_table("sweep_trials")
    op.drop_index("ix_sweeps_state", table_name="sweeps")
    op.drop_index("ix_sweeps_project_id_id", table_name="sweeps")
    op.drop_table("sweeps")
