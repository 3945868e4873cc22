"""controllers: one row per controller process, its last round and last reconcile

Revision ID: 0017_controllers
Revises: 0016_job_note
Create Date: 2026-11-27 15:30:00

`GET /readyz` and the dashboard read the latest `reconciled_at` to say when the reconcile loop
has not run for a few intervals (core.platform.control).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_controllers"
down_revision: str | None = "0016_job_note"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "controllers",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("leading", sa.Boolean(), nullable=False),
        sa.Column("reconciled_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_controllers_reconciled_at", "controllers", ["reconciled_at"])


def downgrade() -> None:
    op.drop_index("ix_controllers_reconciled_at", table_name="controllers")
    op.drop_table("controllers")
