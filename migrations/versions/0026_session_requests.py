"""session_models, session_requests: a session's training clients and their queued calls

Revision ID: 0026_session_requests
Revises: 0025_training_sessions
Create Date: 2026-12-01 10:00:00

A training client of a Tinker session (`create_model`, issue 47) is a row of `session_models`:
its `model_id` (`<session_id>:train:<seq>`, the client's own form), base model, LoRA rank and
the session job that serves it, made through the one door. Every call of a client is a row of
`session_requests`: the route, the body as it came (JSON or protobuf bytes), its `seq_id`
(calls of one model run in that order), its state, and once done its answer bytes or its error
with Tinker's category, kept so that a retried `retrieve_future` gets the same answer. The
client's `X-Idempotency-Key` is unique per project: a retried submission finds its request.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026_session_requests"
down_revision: str | None = "0025_training_sessions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _project() -> sa.Column:
    return sa.Column(
        "project_id", sa.String(40), sa.ForeignKey("projects.id", ondelete="CASCADE"), nullable=False
    )


def _session() -> sa.Column:
    return sa.Column(
        "session_id",
        sa.String(40),
        sa.ForeignKey("training_sessions.id", ondelete="CASCADE"),
        nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "session_models",
        sa.Column("id", sa.String(80), primary_key=True),
        _project(),
        _session(),
        sa.Column("model_seq_id", sa.Integer(), nullable=False),
        sa.Column("base_model", sa.String(200), nullable=False),
        sa.Column("lora_rank", sa.Integer(), nullable=False),
        sa.Column("job_id", BigId, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("session_id", "model_seq_id", name="uq_session_models_seq"),
    )
    op.create_index("ix_session_models_session_id", "session_models", ["session_id"])
    op.create_index("ix_session_models_job_id", "session_models", ["job_id"])
    op.create_table(
        "session_requests",
        sa.Column("id", sa.String(40), primary_key=True),
        _project(),
        _session(),
        sa.Column("model_id", sa.String(80), nullable=True),
        sa.Column("seq_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("body_type", sa.String(60), nullable=False),
        sa.Column("request_key", sa.String(200), nullable=True),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("result_type", sa.String(60), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("error_category", sa.String(20), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("project_id", "request_key", name="uq_session_requests_request_key"),
    )
    op.create_index("ix_session_requests_session_id", "session_requests", ["session_id"])
    op.create_index(
        "ix_session_requests_model_state_seq", "session_requests", ["model_id", "state", "seq_id"]
    )


def downgrade() -> None:
    op.drop_table("session_requests")
    op.drop_table("session_models")
