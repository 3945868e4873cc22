"""state_marks.published_at: a training client's named state loadable by other projects

Revision ID: 0028_state_published
Revises: 0027_state_marks
Create Date: 2026-11-30 23:50:00

The Tinker client's `publish_checkpoint_from_tinker_path` (issue 47) makes a saved state
readable by every project of this server (its weights info and its loads); the owner's
`unpublish_checkpoint_from_tinker_path` takes that back. When it was published is a column of
the state's mark, beside its deletion and expiry.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028_state_published"
down_revision: str | None = "0027_state_marks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("state_marks") as batch:
        batch.add_column(sa.Column("published_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("state_marks") as batch:
        batch.drop_column("published_at")
