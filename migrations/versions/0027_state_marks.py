"""state_marks: a training client's named states deleted or given an expiry

Revision ID: 0027_state_marks
Revises: 0026_session_requests
Create Date: 2026-11-30 21:00:00

The Tinker client's `delete_checkpoint` and `set_checkpoint_ttl` (issue 47) decide about a state
after the session program saved it (its name in the job's `tinker_names.json`, which only the
program writes): a row per (training client, name) holds when it was deleted and when it
expires. Reads leave out a deleted or expired state; the bytes stay with the job's checkpoints.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027_state_marks"
down_revision: str | None = "0026_session_requests"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "state_marks",
        sa.Column(
            "model_id",
            sa.String(80),
            sa.ForeignKey("session_models.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("state_marks")
