"""webhooks: subscriptions, the outbox, deliveries, the delivery log, fired alerts

Revision ID: 0012_webhooks
Revises: 0011_audit
Create Date: 2026-11-25 11:45:00

Events are written to `webhook_events` (the outbox) with one `webhook_deliveries` row per
matching subscription in the transaction of the change they report; `core.webhooks.subscriptions.deliver_due`
sends them and logs each try in `webhook_attempts`. `alert_states` remembers which alert fired
for which job, so an alert fires once per condition.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012_webhooks"
down_revision: str | None = "0011_audit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column(
            "project_id",
            sa.String(40),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event_types", JSON, nullable=False),
        sa.Column("secrets", JSON, nullable=False),
        sa.Column("alert_rules", JSON, nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("disabled_at", TS, nullable=True),
    )
    op.create_index("ix_webhook_subscriptions_project_id", "webhook_subscriptions", ["project_id"])
    op.create_table(
        "webhook_events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(40), nullable=False, unique=True),
        sa.Column(
            "project_id",
            sa.String(40),
            sa.ForeignKey("projects.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_webhook_events_project_id_id", "webhook_events", ["project_id", "id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "subscription_id",
            sa.String(40),
            sa.ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "event_id",
            BigId,
            sa.ForeignKey("webhook_events.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", TS, nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_response_ms", sa.Float(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("delivered_at", TS, nullable=True),
        sa.UniqueConstraint("subscription_id", "event_id"),
    )
    op.create_index(
        "ix_webhook_deliveries_subscription_id", "webhook_deliveries", ["subscription_id"]
    )
    op.create_index(
        "ix_webhook_deliveries_status_next", "webhook_deliveries", ["status", "next_attempt_at"]
    )
    op.create_table(
        "webhook_attempts",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "delivery_id",
            BigId,
            sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response_ms", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("at", TS, nullable=False),
    )
    op.create_index("ix_webhook_attempts_delivery_id_id", "webhook_attempts", ["delivery_id", "id"])
    op.create_table(
        "alert_states",
        sa.Column(
            "subscription_id",
            sa.String(40),
            sa.ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "job_id",
            BigId,
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("kind", sa.String(40), primary_key=True),
        sa.Column("fired_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("alert_states")
    op.drop_index("ix_webhook_attempts_delivery_id_id", table_name="webhook_attempts")
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_deliveries_status_next", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_subscription_id", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhook_events_project_id_id", table_name="webhook_events")
    op.drop_table("webhook_events")
    op.drop_index("ix_webhook_subscriptions_project_id", table_name="webhook_subscriptions")
    op.drop_table("webhook_subscriptions")
