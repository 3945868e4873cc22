"""The API on the embedded default: a SQLite file and the filesystem broker, no servers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.main import create_app
from core.platform.db import make_engine, upgrade
from core.platform.settings import Settings
from core.platform.tables import ApiKey
from tests.conftest import make_project


@pytest.mark.embedded
def test_submit_and_follow_a_job_on_sqlite_with_the_filesystem_broker(
    tmp_path: Path, corpus_dir: Path
) -> None:
    settings = Settings(env="dev", home=tmp_path, data_roots=[str(corpus_dir)])
    assert settings.database_url.startswith("sqlite") and settings.broker_url == "filesystem://"
    upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    project = make_project(engine)
    engine.dispose()
    with TestClient(create_app(settings), raise_server_exceptions=True) as client:
        ds = client.post(
            "/v1/datasets", json={"name": "c", "uri": str(corpus_dir)}, headers=project.headers
        )
        assert ds.status_code == 201, ds.text
        job = client.post(
            "/v1/jobs",
            json={"name": "e", "data": {"dataset": ds.json()["id"]}},
            headers=project.headers,
        )
        assert job.status_code == 201, job.text
        created = datetime.fromisoformat(job.json()["created_at"])
        assert created.utcoffset() is not None  # UTC with its offset, even from SQLite
        messages = list((tmp_path / "broker" / "queue").glob("*.default.msg"))
        assert len(messages) == 1
        page = client.get("/v1/jobs", headers=project.headers).json()
        assert [j["id"] for j in page["items"]] == [job.json()["id"]]
        events = client.get(f"/v1/jobs/{job.json()['id']}/events", headers=project.headers)
        assert events.json()["items"][0]["state_to"] == "queued"


@pytest.mark.embedded
def test_a_key_used_again_after_a_while_still_authenticates_on_sqlite(tmp_path: Path) -> None:
    """`last_used_at` comes back naive from SQLite; refreshing it must not compare it with an
    aware time in Python (the quickstart's follow got a 500 after a 1.5 min job)."""
    settings = Settings(env="dev", home=tmp_path)
    upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    project = make_project(engine)
    with TestClient(create_app(settings), raise_server_exceptions=True) as client:
        assert client.get("/v1/me", headers=project.headers).status_code == 200
        with engine.begin() as conn:  # as if that use was long ago
            conn.execute(update(ApiKey).values(last_used_at=datetime(2026, 1, 1)))
        assert client.get("/v1/me", headers=project.headers).status_code == 200
        with engine.connect() as conn:
            used = conn.execute(select(ApiKey.last_used_at)).scalar_one()
    engine.dispose()
    assert used is not None and used.replace(tzinfo=None) > datetime(2026, 1, 2)
