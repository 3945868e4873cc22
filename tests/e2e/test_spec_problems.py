"""A job whose stored spec no longer reads as written (an older release's field, edited by
hand) opens in the dashboard with a "needs attention" notice naming each problem, instead of
an error page."""

from __future__ import annotations

import json

import httpx
from playwright.sync_api import expect
from sqlalchemy import Engine, text

from tests.e2e.conftest import Dash
from tests.integration.workers.helpers import tiny_spec, unique_queue


def test_a_job_with_an_unreadable_stored_spec_shows_what_needs_attention(
    dash: Dash, api: httpx.Client, dataset_id: str, engine: Engine
) -> None:
    spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name="old-run")
    job_id = api.post("/v1/jobs", json=spec.model_dump(mode="json")).json()["id"]
    stored = {**spec.model_dump(mode="json"), "warm_start": {"job": 1}}
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET spec = CAST(:spec AS jsonb) WHERE id = :id"),
            {"spec": json.dumps(stored), "id": job_id},
        )

    dash.open(f"/jobs/{job_id}")
    notice = dash.page.locator("#spec-problems")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("Needs attention")
    expect(notice.locator("li")).to_have_text(["warm_start: not a field of this release; ignored"])
    expect(dash.page.locator("#job-summary")).to_contain_text("queued")
