"""The Alembic migrations build exactly the schema the tables (ORM rows) declare: a table change
without its migration (or the reverse) fails here, on Postgres and on SQLite (the embedded
default), instead of at a deployment's first query."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine

from core.platform.db import make_engine, upgrade
from core.platform.tables import Base

# Migration 0004 drops these foreign keys on Postgres on purpose (their per-row check cost more
# than the insert itself; a trigger on `jobs` keeps ON DELETE CASCADE); the models
# keep them for SQLite.
POSTGRES_WITHOUT_FK = {"metric_points", "metric_rollups"}


def _drift(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))


def _deliberate(diff: tuple[object, ...]) -> bool:
    kind, item = diff[0], diff[1]
    table = getattr(getattr(item, "parent", None), "name", None)
    return kind == "add_fk" and table in POSTGRES_WITHOUT_FK


def test_migrated_postgres_matches_the_models(engine: Engine) -> None:
    drift = _drift(engine)
    assert [d for d in drift if not _deliberate(d)] == []
    assert len(drift) == len(POSTGRES_WITHOUT_FK)  # the exception above is still needed


def test_migrated_sqlite_matches_the_models(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'torchyard.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        assert _drift(engine) == []
    finally:
        engine.dispose()
