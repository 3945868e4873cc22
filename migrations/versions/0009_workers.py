"""workers: one row per worker process, written by its heartbeat thread

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 19:00:00

A worker process writes its row every `worker_heartbeat_interval_s` (`workers.liveness`),
apart from the supervise loop of any job, so the reconciler notices a lost worker within
`worker_timeout_s` (10 s) instead of the jobs' own heartbeat timeout (60 s), and a restarted
one by its later `started_at` (the incarnation).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("pool", sa.String(200), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("slots_total", sa.Integer(), nullable=False, server_default="1"),
        sa.Column("slots_free", sa.Integer(), nullable=True),
        sa.Column("stopping", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_table("workers")
