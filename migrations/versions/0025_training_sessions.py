"""training_sessions: the sessions of the Tinker-compatible API

Revision ID: 0025_training_sessions
Revises: 0024_pruned_jobs
Create Date: 2026-11-30 10:00:00

One row per `ServiceClient` of the official `tinker` client (issue 47): its project, the
client's tags, user metadata, display name and SDK version, its state (`active` while it
heartbeats, `ended` once idle past `session_idle_timeout_s`) and the times that decide it. A
client that retries its `create_session` sends the same `X-Idempotency-Key` (`request_key`):
unique per project, so the retry finds the session its first try made.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0025_training_sessions"
down_revision: str | None = "0024_pruned_jobs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "training_sessions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "project_id",
            sa.String(40),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("tags", Json, nullable=False),
        sa.Column("user_metadata", Json, nullable=False),
        sa.Column("display_name", sa.String(200), nullable=True),
        sa.Column("sdk_version", sa.String(40), nullable=False),
        sa.Column("request_key", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_reason", sa.Text(), nullable=True),
        sa.UniqueConstraint("project_id", "request_key", name="uq_training_sessions_request_key"),
    )
    op.create_index(
        "ix_training_sessions_project_id_created_at",
        "training_sessions",
        ["project_id", "created_at"],
    )
    op.create_index(
        "ix_training_sessions_state_last_heartbeat_at",
        "training_sessions",
        ["state", "last_heartbeat_at"],
    )


def downgrade() -> None:
    op.drop_table("training_sessions")
