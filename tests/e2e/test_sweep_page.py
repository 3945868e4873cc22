"""The sweep pages in a real Chromium at 1366x768, light and dark: the sweeps list, and one
sweep with its best trial (job, checkpoint, Export, Compare top k), every trial's metric on one
chart with the pruned one faded, the parallel-coordinates view and the trials table. The trials'
jobs are ended by hand (as a worker records them); the sweep that trains is
tests/integration/workers/test_sweeps.py."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from core.jobs import service as jobs
from core.jobs import upserts
from core.jobs.upserts import Metric
from core.platform.db import session_factory, session_scope
from core.platform.settings import Settings
from core.platform.tables import Checkpoint, JobState, SweepTrial
from core.sweeps import drive
from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, new_dash

# Each trial's eval_loss at steps 10 and 20, by trial number: 1 is best, 2 is pruned at 10.
CURVES = {0: [5.0, 4.0], 1: [4.5, 3.0], 2: [6.0]}


def _job_ran(engine: Engine, job_id: int, values: list[float], end: JobState) -> None:
    with session_scope(engine) as s:
        assert jobs.claim(session=s, job_id=job_id, worker="w") is not None
        jobs.transition(session=s, job_id=job_id, to=JobState.RUNNING)
        points = [Metric("eval_loss", 10 * i, v, 0.0) for i, v in enumerate(values, 1)]
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)
        s.add(Checkpoint(job_id=job_id, attempt=1, step=10 * len(values), uri="/nowhere"))
        if end == JobState.PRUNED:  # as the pruner and then the worker end it
            jobs.transition(session=s, job_id=job_id, to=JobState.CANCELLING)
            assert jobs.end_stop(session=s, job_id=job_id).state == JobState.PRUNED
        else:
            jobs.transition(session=s, job_id=job_id, to=end)


@pytest.fixture
def sweep(api: httpx.Client, dataset_id: str, engine: Engine, settings: Settings) -> dict[str, Any]:
    """A sweep of 4 trials: 0 and 1 succeeded, 2 pruned at step 10 (rung 0), 3 running."""
    spec = {
        "name": "dash-lr",
        "base": {
            "name": "tiny",
            "data": {"dataset": dataset_id},
            "train": {"max_steps": 20},
            "eval": {"interval_steps": 10},
            "resources": {"pool": "dash-sweep-unserved"},
        },
        "space": {
            "optim.lr": {"log_uniform": [1e-5, 1e-2]},
            "optim.schedule": {"choice": ["cosine", "linear"]},
        },
        "searcher": "random",
        "max_trials": 4,
        "max_concurrent_trials": 4,
    }
    answer = api.post("/v1/sweeps", json=spec)
    assert answer.status_code == 201, answer.text
    made = answer.json()
    round_ = {
        "session_factory": session_factory(engine),
        "settings": settings,
        "dispatch": lambda job_id, pool: None,
    }
    drive.advance_all(**round_)
    trials = api.get(f"/v1/sweeps/{made['id']}/trials").json()["items"]
    for number, values in CURVES.items():
        job_id = trials[number]["job_id"]
        if number == 2:
            with session_scope(engine) as s:
                row = s.get(SweepTrial, (made["id"], number))
                assert row is not None
                row.pruned_step, row.pruned_rung = 10, 0
            _job_ran(engine, job_id, values, JobState.PRUNED)
        else:
            _job_ran(engine, job_id, values, JobState.SUCCEEDED)
    drive.advance_all(**round_)
    return dict(api.get(f"/v1/sweeps/{made['id']}").json())


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_sweep_page_shows_the_best_trial_every_curve_and_the_trials_on_a_laptop(
    browser: Browser, live_api: str, owner: ProjectKey, sweep: dict[str, Any], scheme: str
) -> None:
    assert sweep["best"]["number"] == 1
    with new_dash(browser, live_api, owner.api_key, color_scheme=scheme, viewport=LAPTOP) as dash:
        page = dash.page
        dash.open("/jobs")
        page.click("#nav a[data-nav='sweeps']")
        row = page.locator(f"#sweeps-table tr[data-sweep='{sweep['id']}']")
        expect(row).to_contain_text("3/4 ended")
        expect(row).to_contain_text("3")  # the best eval_loss
        row.locator("a").click()
        page.wait_for_selector("main[data-loaded]")
        expect(page.locator("#sweep-best h2")).to_have_text("Best trial: #1")
        expect(page.locator("#sweep-best-value")).to_have_text("3")
        best_job = sweep["best"]["job_id"]
        expect(page.locator("#sweep-best-job")).to_have_attribute("href", f"#/jobs/{best_job}")
        expect(page.locator("#sweep-best")).to_contain_text("(step 20)")
        top = page.locator("#sweep-compare").get_attribute("href") or ""
        first = page.evaluate(
            "[...document.querySelectorAll('#sweep-trials tbody tr')].map(r => r.dataset.state)"
        )
        assert first == ["succeeded", "succeeded", "pruned", "running"]
        expect(page.locator("#sweep-trials tr[data-trial='2']")).to_contain_text("step 10 (rung 0)")
        assert top.startswith(f"#/compare?ids={best_job},") and "metrics=eval_loss" in top
        # The chart draws after the table (its series come in a request of their own).
        page.wait_for_function("document.getElementById('sweep-metric-chart')?.data?.length > 0")
        curves = page.evaluate(
            "document.getElementById('sweep-metric-chart').data"
            ".map(t => [t.meta.trial, t.opacity, t.y])"
        )
        by_trial = {trial: (opacity, ys) for trial, opacity, ys in curves}
        assert by_trial[2][0] < by_trial[0][0] <= by_trial[1][0]  # pruned faded, best strongest
        assert {t: ys for t, (_, ys) in by_trial.items() if ys} == CURVES
        lines = page.evaluate(
            "document.getElementById('sweep-parallel').data.map(t => [t.meta.trial, t.x, t.y])"
        )
        assert sorted(trial for trial, _, _ in lines) == [0, 1, 2]
        for _, axes, ys in lines:
            assert axes == ["optim.lr", "optim.schedule", "eval_loss"]
            assert all(0 <= y <= 1 for y in ys)
        assert dash.fits_width()
        dash.shot(f"sweep-{scheme}", full_page=True)
        expect(page.locator("#sweep-export")).to_be_enabled()  # (the rows are made up: no files)
        # the best checkpoint opens its job's page on that checkpoint's row
        checkpoint = page.locator(f"#checkpoint-{sweep['best']['checkpoint_id']}")
        page.locator("#sweep-best-checkpoint").click()
        expect(checkpoint).to_have_class(re.compile(r"\bchosen\b"))
        expect(checkpoint).to_be_in_viewport()
        expect(checkpoint).to_contain_text("20")
        expect(page.locator("#checkpoints tr.chosen")).to_have_count(1)
        page.go_back()
        page.wait_for_selector("#sweep-compare")
        page.locator("#sweep-compare").click()
        page.wait_for_selector("main[data-loaded]")
        expect(page.locator("#compare-ids")).to_have_value(top.split("ids=")[1].split("&")[0])


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_pruned_trial_says_pruned_with_its_sweep_everywhere_and_offers_no_retry(
    browser: Browser,
    live_api: str,
    owner: ProjectKey,
    api: httpx.Client,
    sweep: dict[str, Any],
    scheme: str,
) -> None:
    """Issue 45, item 4: a pruned trial's job read as an orange `cancelled` with a Retry button,
    its reason only far down in the events. Its state is `pruned` on the jobs list (with why on
    hover) and on its page, which says where its sweep's pruner stopped it, links the sweep,
    and offers no Retry (the API refuses one)."""
    trial = api.get(f"/v1/sweeps/{sweep['id']}/trials").json()["items"][2]
    job = api.get(f"/v1/jobs/{trial['job_id']}").json()
    assert (trial["state"], job["state"]) == ("pruned", "pruned")
    assert job["error"] == f"pruned by sweep {sweep['id']} at step 10, rung 0"
    retry = api.post(f"/v1/jobs/{job['id']}/retry")
    assert retry.status_code == 409, retry.text
    with new_dash(browser, live_api, owner.api_key, color_scheme=scheme, viewport=LAPTOP) as dash:
        page = dash.page
        dash.open("/jobs")
        state = page.locator(f"#jobs-body tr[data-job-id='{job['id']}'] .state")
        expect(state).to_have_text("pruned")
        expect(state).to_have_attribute("title", job["error"])
        dash.open(f"/jobs/{job['id']}")
        page.wait_for_selector("main[data-loaded]")
        expect(page.locator("#job-state")).to_have_text("pruned")
        expect(page.locator("#job-summary dd[data-field='pruned']")).to_have_text(
            f"sweep {sweep['id']} · trial 2 · at step 10, rung 0"
        )
        expect(page.locator("#pruned-by")).to_have_attribute("href", f"#/sweeps/{sweep['id']}")
        expect(page.locator("#retry-job")).to_be_hidden()
        expect(page.locator("#failure")).to_have_count(0)
        page.locator("#pruned-by").click()
        expect(page.locator("#sweep-trials tr[data-trial='2']")).to_contain_text("step 10 (rung 0)")


def test_a_lora_sweeps_best_trial_offers_no_export_and_says_why(
    browser: Browser,
    live_api: str,
    owner: ProjectKey,
    api: httpx.Client,
    dataset_id: str,
    engine: Engine,
    settings: Settings,
) -> None:
    """Issue 45: the Export button of a LoRA trial answered 409 (its checkpoints hold the
    adapters only); the page says why and what the run wrote instead, as the job page does."""
    base = {
        "name": "src",
        "data": {"dataset": dataset_id},
        "train": {"max_steps": 20},
        "eval": {"interval_steps": 10},
        "resources": {"pool": "dash-sweep-unserved"},
    }
    source = api.post("/v1/jobs", json=base)
    assert source.status_code == 201, source.text
    with session_scope(engine) as s:  # the weights the trials adapt
        s.add(Checkpoint(job_id=source.json()["id"], attempt=1, step=20, uri="/nowhere"))
    spec = {
        "name": "dash-lora",
        "base": {**base, "model": {"init_from": {"job": source.json()["id"]}}},
        "space": {"lora.r": {"choice": [4, 8]}},
        "searcher": "grid",
        "max_trials": 2,
        "max_concurrent_trials": 2,
    }
    answer = api.post("/v1/sweeps", json=spec)
    assert answer.status_code == 201, answer.text
    sweep_id = answer.json()["id"]
    round_ = {
        "session_factory": session_factory(engine),
        "settings": settings,
        "dispatch": lambda job_id, pool: None,
    }
    drive.advance_all(**round_)
    trials = api.get(f"/v1/sweeps/{sweep_id}/trials").json()["items"]
    _job_ran(engine, trials[0]["job_id"], [3.0, 2.0], JobState.SUCCEEDED)
    drive.advance_all(**round_)
    with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
        dash.open(f"/sweeps/{sweep_id}")
        page = dash.page
        page.wait_for_selector("main[data-loaded]")
        expect(page.locator("#sweep-best h2")).to_have_text("Best trial: #0")
        expect(page.locator("#sweep-export")).to_have_count(0)
        expect(page.locator("#sweep-export-refused")).to_contain_text("LoRA/QLoRA")
        expect(page.locator("#sweep-export-refused")).to_contain_text("adapter and merged model")
