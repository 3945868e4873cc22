"""attempt facts: restart counters, the failure of the latest attempt, device slots

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 18:00:00

`restarts_used` / `restarts_by_class` replace recounting `restarting` events (core.attempts.lifecycle_policy);
`failure` is the latest failed attempt's class, reason, rank and log tail; `slots` is the
devices a node of the job needs (`resources.procs_per_node`), so a worker's claim can ask for
jobs that fit its free devices in SQL; `job_nodes.devices` are the device indices a node was
given (CUDA_VISIBLE_DEVICES on GPUs, CPU slots otherwise) and `job_nodes.failure` how that node
failed. Existing jobs get `slots` from their spec.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("restarts_used", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "jobs", sa.Column("restarts_by_class", JsonType, nullable=False, server_default="{}")
    )
    op.add_column("jobs", sa.Column("failure", JsonType, nullable=True))
    op.add_column("jobs", sa.Column("slots", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("job_nodes", sa.Column("devices", JsonType, nullable=True))
    op.add_column("job_nodes", sa.Column("failure", JsonType, nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "UPDATE jobs SET slots = (spec->'resources'->>'procs_per_node')::int "
            "WHERE spec->'resources' ? 'procs_per_node'"
        )
    else:
        op.execute(
            "UPDATE jobs SET slots = json_extract(spec, '$.resources.procs_per_node') "
            "WHERE json_extract(spec, '$.resources.procs_per_node') IS NOT NULL"
        )


def downgrade() -> None:
    with op.batch_alter_table("job_nodes") as batch:
        batch.drop_column("failure")
        batch.drop_column("devices")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("slots")
        batch.drop_column("failure")
        batch.drop_column("restarts_by_class")
        batch.drop_column("restarts_used")
