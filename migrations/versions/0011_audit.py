"""audit_events: the audit log of mutating requests and auth failures

Revision ID: 0011_audit
Revises: 0010
Create Date: 2026-11-25 12:00:00

One row per audited request (api.audit), written in a transaction of its own after the answer.
`project_id` is NULL for a request with no project (a missing or unknown key).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_audit"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "project_id",
            sa.String(40),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("actor", sa.String(255), nullable=True),
        sa.Column("actor_kind", sa.String(10), nullable=False),
        sa.Column("key_id", sa.String(300), nullable=True),
        sa.Column("method", sa.String(10), nullable=False),
        sa.Column("path", sa.String(2000), nullable=False),
        sa.Column("operation", sa.String(100), nullable=True),
        sa.Column("target", sa.String(200), nullable=True),
        sa.Column("status_code", sa.SmallInteger(), nullable=False),
        sa.Column("outcome", sa.String(10), nullable=False),
        sa.Column("source", sa.String(100), nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
    )
    op.create_index("ix_audit_events_project_id_id", "audit_events", ["project_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_project_id_id", table_name="audit_events")
    op.drop_table("audit_events")
