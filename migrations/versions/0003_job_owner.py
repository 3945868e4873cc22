"""job owner and list indexes: the name of the API key that submitted each job (the dashboard's
owner column), and indexes for the jobs list sorted by name or state (keyset pages)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 01:10:00

Batch mode so SQLite can apply it too. Jobs submitted before have no owner (NULL).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(length=100), nullable=True))
        batch.create_index("ix_jobs_project_id_name_id", ["project_id", "name", "id"])
        batch.create_index("ix_jobs_project_id_state_id", ["project_id", "state", "id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_project_id_state_id")
        batch.drop_index("ix_jobs_project_id_name_id")
        batch.drop_column("owner")
