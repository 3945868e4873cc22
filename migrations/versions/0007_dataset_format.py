"""dataset format and stats: records checked at registration, counted for the dataset page

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 15:00:00

Existing datasets are raw text (`text`, no stats). Added columns with a server default, so
SQLite applies it without a batch rebuild.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column(
        "datasets",
        sa.Column("format", sa.String(length=20), nullable=False, server_default="text"),
    )
    op.add_column("datasets", sa.Column("stats", JsonType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("stats")
        batch.drop_column("format")
