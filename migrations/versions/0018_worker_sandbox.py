"""workers.isolation.sandbox: how a worker contains its jobs' ranks, as it said at startup

Revision ID: 0018_worker_sandbox
Revises: 0017_controllers
Create Date: 2026-11-27 19:20:00

`bwrap`, or `none: <why>` (the setting, or what the host lacks); `GET /v1/workers` shows it
(workers/isolation/sandbox.py).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_worker_sandbox"
down_revision: str | None = "0017_controllers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("sandbox", sa.String(500), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "sandbox")
