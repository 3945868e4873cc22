"""usage: CPU-seconds per node of an attempt

Revision ID: 0013_usage
Revises: 0012_webhooks
Create Date: 2026-11-25 11:45:00

`job_nodes.cpu_seconds`: user + system CPU time of the node's torchrun process tree, written by
its worker while the node runs and at its end (`workers.watchers.usage_watch`); usage reports
(`GET /v1/usage`) add it up per project, pool, job and day.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_usage"
down_revision: str | None = "0012_webhooks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "job_nodes", sa.Column("cpu_seconds", sa.Float(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    op.drop_column("job_nodes", "cpu_seconds")
