"""jobs: a sweep trial stopped by its pruner ends `pruned`, not `cancelled`

Revision ID: 0024_pruned_jobs
Revises: 0023_dataset_files
Create Date: 2026-11-29 15:00:00

`pruned` is a terminal job state (issue 45, item 4): the trial's job was stopped by its sweep's
pruner, which is neither a failure nor a user's cancel, and offers no retry. Jobs that ended
`cancelled` before this release after the pruner stopped them (their trial has a
`pruned_step`) become `pruned`, with the reason in `error`; downgrade turns them back.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024_pruned_jobs"
down_revision: str | None = "0023_dataset_files"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PRUNED_TRIALS = "SELECT job_id FROM sweep_trials WHERE pruned_step IS NOT NULL"


def upgrade() -> None:
    op.execute(
        "UPDATE jobs SET state = 'pruned', error = ("
        "SELECT 'pruned by sweep ' || t.sweep_id || ' at step ' || t.pruned_step"
        " || COALESCE(', rung ' || t.pruned_rung, '')"
        " FROM sweep_trials t WHERE t.job_id = jobs.id)"
        f" WHERE state = 'cancelled' AND id IN ({_PRUNED_TRIALS})"
    )


def downgrade() -> None:
    op.execute(
        f"UPDATE jobs SET state = 'cancelled' WHERE state = 'pruned' AND id IN ({_PRUNED_TRIALS})"
    )
