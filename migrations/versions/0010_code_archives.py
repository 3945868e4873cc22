"""code_archives: the uploaded code of `entrypoint` jobs

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 21:30:00

One row per archive content per project (`sha256` unique within a project): uploading the same
bytes again returns the same archive. `files` lists its regular files so a spec naming a script
that is not in the archive is refused at submission.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "code_archives",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "project_id",
            sa.String(40),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("format", sa.String(10), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("unpacked_bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("project_id", "sha256"),
    )
    op.create_index("ix_code_archives_project_id", "code_archives", ["project_id"])


def downgrade() -> None:
    op.drop_index("ix_code_archives_project_id", table_name="code_archives")
    op.drop_table("code_archives")
