"""identity: project members, service accounts, and owned, scoped, expiring API keys

Revision ID: 0015_identity
Revises: 0014_quotas
Create Date: 2026-11-25 11:45:00

Keys made before this migration keep working unchanged: no owner, role `admin`, every scope.
A key with an owner takes its owner's current role (`api_keys.role` is then NULL), so a role
change or a disabled service account applies on the next request.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015_identity"
down_revision: str | None = "0014_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
ALL_SCOPES_JSON = '["jobs:read", "jobs:write", "datasets:write", "admin"]'


def _project_fk() -> sa.Column[str]:
    return sa.Column(
        "project_id",
        sa.String(40),
        sa.ForeignKey("projects.id", ondelete="CASCADE"),
        nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "project_members",
        sa.Column("id", sa.String(40), primary_key=True),
        _project_fk(),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("project_id", "subject"),
    )
    op.create_index("ix_project_members_project_id", "project_members", ["project_id"])
    op.create_table(
        "service_accounts",
        sa.Column("id", sa.String(40), primary_key=True),
        _project_fk(),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("project_id", "name"),
    )
    op.create_index("ix_service_accounts_project_id", "service_accounts", ["project_id"])
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("member_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("service_account_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("scopes", JSON, nullable=False, server_default=ALL_SCOPES_JSON))
        batch.add_column(sa.Column("role", sa.String(20), nullable=True))
        batch.add_column(
            sa.Column("org_admin", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))
        batch.create_foreign_key(
            "fk_api_keys_member_id",
            "project_members",
            ["member_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_foreign_key(
            "fk_api_keys_service_account_id",
            "service_accounts",
            ["service_account_id"],
            ["id"],
            ondelete="SET NULL",
        )
    op.execute("UPDATE api_keys SET role = 'admin'")


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_constraint("fk_api_keys_service_account_id", type_="foreignkey")
        batch.drop_constraint("fk_api_keys_member_id", type_="foreignkey")
        for column in (
            "last_used_at",
            "expires_at",
            "org_admin",
            "role",
            "scopes",
            "service_account_id",
            "member_id",
        ):
            batch.drop_column(column)
    op.drop_index("ix_service_accounts_project_id", table_name="service_accounts")
    op.drop_table("service_accounts")
    op.drop_index("ix_project_members_project_id", table_name="project_members")
    op.drop_table("project_members")
