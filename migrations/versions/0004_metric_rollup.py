"""metric rollup: per-series min/max per step block at 9 resolutions, kept by a trigger

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 01:20:00

`metric_rollups` holds, for every (job, series, level, bucket), the points holding the
minimum and the maximum value (earliest step on ties) among the steps
`[bucket << shift, (bucket + 1) << shift)`, `shift = 2 * level + 2` (level 1: 16 steps, level 9:
1,048,576). `core.jobs.reports.downsampled_series` reads a few thousand of these rows instead of
scanning a million points.

On Postgres a statement trigger keeps them exact whatever writes `metric_points` (the worker's
COPY and upserts, a bulk INSERT ... SELECT): inserted points are merged into their blocks (a
new point can only lower a minimum or raise a maximum, and merging a point twice changes
nothing), updated points (an upsert over a key already stored) have their blocks recomputed
from the level below, so a re-ingest never leaves a stale or doubled extreme. Existing points
are rolled up here. SQLite (the embedded mode) gets the table but no trigger: its
downsampling reads the points (`core.jobs.reports`).

Also on Postgres: `metric_points` (and `metric_rollups`) lose their foreign key to `jobs`. Its
check is a query per inserted row and cost more than the insert itself (about 60% of a
100,000-point COPY, bench/ingest.py); the worker writes points only for a job it has just read
in the same transaction. `ON DELETE CASCADE` is kept by a statement trigger on `jobs` that
deletes the points and rollups of deleted jobs.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Level 1's blocks from points (new: merged; updated: recomputed), then each level >= 2 from
# the touched blocks of the level below. Arrays carry the touched blocks between statements.
_FUNCTION = """
CREATE FUNCTION metric_rollups_refresh() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  jobs bigint[]; names text[]; blocks int[];
  min_steps int[]; min_values float8[]; max_steps int[]; max_values float8[];
  lvl int;
BEGIN
  IF TG_OP = 'INSERT' THEN
    SELECT array_agg(a.job_id), array_agg(a.name), array_agg(a.b),
           array_agg(a.lo[2]::int), array_agg(a.lo[1]), array_agg((-a.hi[2])::int),
           array_agg(a.hi[1])
      INTO jobs, names, blocks, min_steps, min_values, max_steps, max_values
      FROM (SELECT p.job_id, p.name::text AS name, p.step >> 4 AS b,
                   min(ARRAY[p.value, p.step::float8]) AS lo,
                   max(ARRAY[p.value, -p.step::float8]) AS hi
              FROM new_points p GROUP BY 1, 2, 3) a;
    IF jobs IS NULL THEN RETURN NULL; END IF;
    FOR lvl IN 1..9 LOOP
      IF lvl > 1 THEN  -- the new points' partial aggregates, one level up
        SELECT array_agg(a.job_id), array_agg(a.name), array_agg(a.b),
               array_agg(a.lo[2]::int), array_agg(a.lo[1]), array_agg((-a.hi[2])::int),
               array_agg(a.hi[1])
          INTO jobs, names, blocks, min_steps, min_values, max_steps, max_values
          FROM (SELECT u.job_id, u.name, u.b >> 2 AS b,
                       min(ARRAY[u.lv, u.ls::float8]) AS lo,
                       max(ARRAY[u.hv, -u.hs::float8]) AS hi
                  FROM unnest(jobs, names, blocks, min_steps, min_values, max_steps, max_values)
                       AS u(job_id, name, b, ls, lv, hs, hv)
                 GROUP BY 1, 2, 3) a;
      END IF;
      INSERT INTO metric_rollups AS r
             (job_id, name, level, bucket, min_step, min_value, max_step, max_value)
      SELECT u.job_id, u.name, lvl, u.b, u.ls, u.lv, u.hs, u.hv
        FROM unnest(jobs, names, blocks, min_steps, min_values, max_steps, max_values)
             AS u(job_id, name, b, ls, lv, hs, hv)
      ON CONFLICT (job_id, name, level, bucket) DO UPDATE SET
        min_step = CASE WHEN ARRAY[EXCLUDED.min_value, EXCLUDED.min_step::float8]
                           < ARRAY[r.min_value, r.min_step::float8]
                        THEN EXCLUDED.min_step ELSE r.min_step END,
        min_value = CASE WHEN ARRAY[EXCLUDED.min_value, EXCLUDED.min_step::float8]
                            < ARRAY[r.min_value, r.min_step::float8]
                         THEN EXCLUDED.min_value ELSE r.min_value END,
        max_step = CASE WHEN ARRAY[EXCLUDED.max_value, -EXCLUDED.max_step::float8]
                           > ARRAY[r.max_value, -r.max_step::float8]
                        THEN EXCLUDED.max_step ELSE r.max_step END,
        max_value = CASE WHEN ARRAY[EXCLUDED.max_value, -EXCLUDED.max_step::float8]
                            > ARRAY[r.max_value, -r.max_step::float8]
                         THEN EXCLUDED.max_value ELSE r.max_value END;
    END LOOP;
    RETURN NULL;
  END IF;
  -- UPDATE: values changed in place; recompute every touched block from the level below.
  SELECT array_agg(a.job_id), array_agg(a.name), array_agg(a.b) INTO jobs, names, blocks
    FROM (SELECT DISTINCT p.job_id, p.name::text AS name, p.step >> 4 AS b
            FROM new_points p) a;
  IF jobs IS NULL THEN RETURN NULL; END IF;
  INSERT INTO metric_rollups AS r
         (job_id, name, level, bucket, min_step, min_value, max_step, max_value)
  SELECT a.job_id, a.name, 1, a.b, a.lo[2]::int, a.lo[1], (-a.hi[2])::int, a.hi[1]
    FROM (SELECT t.job_id, t.name, t.b,
                 min(ARRAY[p.value, p.step::float8]) AS lo,
                 max(ARRAY[p.value, -p.step::float8]) AS hi
            FROM unnest(jobs, names, blocks) AS t(job_id, name, b)
            JOIN metric_points p ON p.job_id = t.job_id AND p.name = t.name
                 AND p.step BETWEEN t.b << 4 AND (t.b << 4) + 15
           GROUP BY 1, 2, 3) a
  ON CONFLICT (job_id, name, level, bucket) DO UPDATE SET
    min_step = EXCLUDED.min_step, min_value = EXCLUDED.min_value,
    max_step = EXCLUDED.max_step, max_value = EXCLUDED.max_value;
  FOR lvl IN 2..9 LOOP
    SELECT array_agg(a.job_id), array_agg(a.name), array_agg(a.b) INTO jobs, names, blocks
      FROM (SELECT DISTINCT u.job_id, u.name, u.b >> 2 AS b
              FROM unnest(jobs, names, blocks) AS u(job_id, name, b)) a;
    INSERT INTO metric_rollups AS r
           (job_id, name, level, bucket, min_step, min_value, max_step, max_value)
    SELECT a.job_id, a.name, lvl, a.b, a.lo[2]::int, a.lo[1], (-a.hi[2])::int, a.hi[1]
      FROM (SELECT t.job_id, t.name, t.b,
                   min(ARRAY[c.min_value, c.min_step::float8]) AS lo,
                   max(ARRAY[c.max_value, -c.max_step::float8]) AS hi
              FROM unnest(jobs, names, blocks) AS t(job_id, name, b)
              JOIN metric_rollups c ON c.job_id = t.job_id AND c.name = t.name
                   AND c.level = lvl - 1 AND c.bucket BETWEEN t.b << 2 AND (t.b << 2) + 3
             GROUP BY 1, 2, 3) a
    ON CONFLICT (job_id, name, level, bucket) DO UPDATE SET
      min_step = EXCLUDED.min_step, min_value = EXCLUDED.min_value,
      max_step = EXCLUDED.max_step, max_value = EXCLUDED.max_value;
  END LOOP;
  RETURN NULL;
END
$fn$
-- Index probes per touched block, whatever the (possibly missing) statistics say.
SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
"""

_JOBS_DELETE = """
CREATE FUNCTION jobs_delete_metrics() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  DELETE FROM metric_points WHERE job_id IN (SELECT id FROM deleted_jobs);
  DELETE FROM metric_rollups WHERE job_id IN (SELECT id FROM deleted_jobs);
  RETURN NULL;
END
$fn$
"""

_BACKFILL_LEVEL_1 = """
INSERT INTO metric_rollups
       (job_id, name, level, bucket, min_step, min_value, max_step, max_value)
SELECT a.job_id, a.name, 1, a.b, a.lo[2]::int, a.lo[1], (-a.hi[2])::int, a.hi[1]
  FROM (SELECT job_id, name, step >> 4 AS b,
               min(ARRAY[value, step::float8]) AS lo, max(ARRAY[value, -step::float8]) AS hi
          FROM metric_points GROUP BY 1, 2, 3) a
"""

_BACKFILL_LEVEL = """
INSERT INTO metric_rollups
       (job_id, name, level, bucket, min_step, min_value, max_step, max_value)
SELECT a.job_id, a.name, :level, a.b, a.lo[2]::int, a.lo[1], (-a.hi[2])::int, a.hi[1]
  FROM (SELECT job_id, name, bucket >> 2 AS b,
               min(ARRAY[min_value, min_step::float8]) AS lo,
               max(ARRAY[max_value, -max_step::float8]) AS hi
          FROM metric_rollups WHERE level = :level - 1 GROUP BY 1, 2, 3) a
"""


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("min_step", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Float(), nullable=False),
        sa.Column("max_step", sa.Integer(), nullable=False),
        sa.Column("max_value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "name", "level", "bucket"),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(_BACKFILL_LEVEL_1)
    for level in range(2, 10):
        op.execute(sa.text(_BACKFILL_LEVEL).bindparams(level=level))
    op.drop_constraint("metric_points_job_id_fkey", "metric_points", type_="foreignkey")
    op.drop_constraint("metric_rollups_job_id_fkey", "metric_rollups", type_="foreignkey")
    op.execute(_JOBS_DELETE)
    op.execute(
        "CREATE TRIGGER jobs_delete_metrics AFTER DELETE ON jobs REFERENCING OLD TABLE AS"
        " deleted_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobs_delete_metrics()"
    )
    op.execute(_FUNCTION)
    for event in ("INSERT", "UPDATE"):
        op.execute(
            f"CREATE TRIGGER metric_points_rollup_{event.lower()} AFTER {event} ON metric_points"
            " REFERENCING NEW TABLE AS new_points FOR EACH STATEMENT"
            " EXECUTE FUNCTION metric_rollups_refresh()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS metric_points_rollup_insert ON metric_points")
        op.execute("DROP TRIGGER IF EXISTS metric_points_rollup_update ON metric_points")
        op.execute("DROP FUNCTION IF EXISTS metric_rollups_refresh()")
        op.execute("DROP TRIGGER IF EXISTS jobs_delete_metrics ON jobs")
        op.execute("DROP FUNCTION IF EXISTS jobs_delete_metrics()")
        op.execute("DELETE FROM metric_points WHERE job_id NOT IN (SELECT id FROM jobs)")
        op.create_foreign_key(
            "metric_points_job_id_fkey", "metric_points", "jobs", ["job_id"], ["id"],
            ondelete="CASCADE",
        )  # fmt: skip
    op.drop_table("metric_rollups")
