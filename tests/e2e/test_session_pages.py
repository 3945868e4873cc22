"""Training sessions in the dashboard (issue 47) in headless Chromium at 1366x768, light and
dark: the Sessions list (state, training clients linked to their jobs, steps, calls), one
session (what its client sent, its calls, its training clients with their jobs' states and
steps), and the session job's page, which says it serves that session and links back, with the
loss per optimizer step charted like any job's. The sessions are made through the service (as
the Tinker routes make them; the official client's own tests are tests/integration/api/tinker
and tests/integration/cli/test_cli_sessions.py) and the session job's steps are recorded as a
worker's ingest records them."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from core.jobs import service as jobs
from core.jobs import upserts
from core.jobs.upserts import Metric
from core.platform.db import session_scope
from core.platform.settings import BaseModelEntry, Settings
from core.platform.tables import JobState
from core.sessions import service, training_clients
from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, new_dash

LOSSES = [2.5, 2.1, 1.8]  # one per optim_step


@pytest.fixture
def sessions(engine: Engine, settings: Settings, owner: ProjectKey) -> tuple[str, str, int]:
    """(a session with one training client whose job has taken 3 steps, its model id and job
    id); a second session, ended, with none."""
    registry = {"tiny-llama": BaseModelEntry(path="/models/tiny-llama", pool="dash-sessions")}
    with_models = settings.model_copy(update={"base_models": registry})
    with session_scope(engine) as s:
        ended = service.create(
            session=s,
            project_id=owner.project_id,
            owner="key:ci",
            new=service.NewSession(tags=[], user_metadata={}, sdk_version="0.38.0"),
        )
        service.finish(
            session=s, project_id=owner.project_id, session_id=ended.id, reason="success"
        )
        live = service.create(
            session=s,
            project_id=owner.project_id,
            owner="key:ci",
            new=service.NewSession(
                tags=["rl"],
                user_metadata={"experiment": "sums-rl"},
                sdk_version="0.38.0",
                display_name="sums-rl",
            ),
        )
        new = training_clients.NewModel(
            session_id=live.id, model_seq_id=0, base_model="tiny-llama", rank=8
        )
        training_clients.create(
            session=s,
            settings=with_models,
            project_id=owner.project_id,
            owner="key:ci",
            new=new,
            body=b"{}",
        )
        model_id = training_clients.model_id(live.id, 0)
        job_id = training_clients.get(
            session=s, project_id=owner.project_id, model_id=model_id
        ).job_id
        live_id = live.id
    with session_scope(engine) as s:  # the session job runs and takes three optimizer steps
        assert jobs.claim(session=s, job_id=job_id, worker="w") is not None
        jobs.transition(session=s, job_id=job_id, to=JobState.RUNNING)
        points = [Metric("loss", step, v, 0.0) for step, v in enumerate(LOSSES, 1)]
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)
    return live_id, model_id, job_id


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_sessions_show_their_clients_jobs_and_steps_and_the_job_links_back(
    browser: Browser,
    live_api: str,
    owner: ProjectKey,
    sessions: tuple[str, str, int],
    scheme: str,
) -> None:
    live_id, model_id, job_id = sessions
    with new_dash(browser, live_api, owner.api_key, color_scheme=scheme, viewport=LAPTOP) as dash:
        page = dash.page
        dash.open("/jobs")
        page.click("#nav a[data-nav='sessions']")
        page.wait_for_selector("main[data-loaded]")
        states = page.eval_on_selector_all(
            "#sessions-table tbody tr", "(rows) => rows.map((r) => r.dataset.session)"
        )
        assert states[0] == live_id and len(states) == 2  # newest first
        row = page.locator(f"#sessions-table tr[data-session='{live_id}']")
        expect(row.locator(".state")).to_have_text("active")
        expect(row).to_contain_text("sums-rl")
        expect(row.locator(f"a[href='#/jobs/{job_id}']")).to_have_count(1)
        expect(row).to_contain_text("1 done")  # create_model, answered by the API
        assert row.locator("td.num").inner_text() == str(len(LOSSES))
        expect(page.locator("#sessions-table .state-ended")).to_have_count(1)
        assert dash.fits_width()
        dash.shot(f"sessions-{scheme}")

        row.locator(f"a[href='#/sessions/{live_id}']").click()
        page.wait_for_selector("#session-models")
        expect(page.locator("h1")).to_have_text("Session sums-rl")
        expect(page.locator("#session-summary dd[data-meta='experiment']")).to_have_text("sums-rl")
        client = page.locator(f"#session-models tr[data-model='{model_id}']")
        expect(client.locator(".state")).to_have_text("running")
        expect(client).to_contain_text("tiny-llama")
        assert client.locator("td.num").all_inner_texts() == ["8", str(len(LOSSES))]
        assert dash.fits_width()
        dash.shot(f"session-{scheme}")

        client.locator(f"a[href='#/jobs/{job_id}']").click()
        page.wait_for_selector("main[data-loaded]")
        expect(page.locator("#job-session")).to_have_text(live_id)
        page.wait_for_function("document.getElementById('chart-loss')?.data?.length > 0")
        ys = page.evaluate("document.getElementById('chart-loss').data[0].y")
        assert ys == LOSSES
        page.locator("#job-session").click()
        expect(page.locator("#session-state .state")).to_have_text("active")
