"""The API on the embedded default: a SQLite file and the filesystem broker, no servers."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from core.db import make_engine, upgrade
from core.settings import Settings
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
