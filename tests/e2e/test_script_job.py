"""A script job (`entrypoint`, issue 13) in a real Chromium at 1366x768: its page has a "Code"
card (archive, command as a shell line, env, requirements), charts of the metrics it chose to
report, its logs and checkpoints, and no trainer-only fields; the jobs list marks it `script`;
compare and clone take it. Its code archive is a row written into the test database and its
run's traces go through the core services a worker uses (`tests.integration.script_jobs`): no
worker serves its pool. Every page fails its test on a console error (`new_dash`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, Dash, new_dash
from tests.integration.script_jobs import (
    COMMAND_LINE,
    insert_archive,
    run_script_job,
    script_spec,
)
from tests.integration.workers.helpers import tiny_spec, unique_queue
from torchyard.units import format_bytes

POINTS = "id => document.getElementById(id)?.data?.[0]?.x?.length ?? 0"
STEPS = 30


@pytest.fixture
def laptop(browser: Browser, live_api: str, owner: ProjectKey) -> Iterator[Dash]:
    with new_dash(browser, live_api, owner.api_key, "light", LAPTOP) as dash:
        yield dash


@pytest.fixture
def code_id(engine: Engine, owner: ProjectKey) -> str:
    return insert_archive(engine, owner.project_id)


def _submit(api: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    answer = api.post("/v1/jobs", json=spec)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


@pytest.fixture
def running_script(api: httpx.Client, engine: Engine, code_id: str) -> dict[str, Any]:
    """A script job that has reported `loss` and `accuracy` for STEPS steps, still running."""
    job = _submit(api, script_spec(code_id, unique_queue("nowhere")))
    assert "model" not in job["spec"] and job["spec"]["entrypoint"]["code"] == code_id
    run_script_job(engine, job["id"], steps=STEPS)
    return job


def test_a_script_jobs_page_shows_its_code_its_own_metrics_logs_and_checkpoints(
    laptop_scheme: Dash, running_script: dict[str, Any], code_id: str, api: httpx.Client
) -> None:
    laptop = laptop_scheme
    page = laptop.page
    laptop.open(f"/jobs/{running_script['id']}")
    card = page.locator("#code-card")
    expect(card).to_be_visible()
    expect(page.locator("#job-kind [data-kind='script']")).to_have_text("script")
    expect(card.locator("#code-archive")).to_have_text(code_id)
    expect(card.locator("#code-command")).to_have_text(COMMAND_LINE)
    expect(card.locator("dd[data-field='env'] li")).to_have_text(
        ["GREETING='hi there'", "WANDB_MODE=offline"]
    )
    expect(card.locator("dd[data-field='requirements'] li")).to_have_text(["numpy>=1.26"])
    expect(card.locator("dd[data-field='checkpoints kept']")).to_have_text("the last 2")
    info = card.locator("#code-archive-info")  # GET /v1/code/{id}
    size = format_bytes(api.get(f"/v1/code/{code_id}").json()["size_bytes"])  # as the CLI says
    expect(info).to_have_text(f"mnist-code · tar.gz · {size} · 2 files")
    card.locator("#code-files summary").click()
    expect(card.locator("#code-files li")).to_have_text(["train.py", "util/data.py"])

    summary = page.locator("#job-summary")
    expect(summary.locator("dd[data-field='kind']")).to_have_text("script")
    expect(summary.locator("dd[data-field='progress']")).to_have_text(f"step {STEPS}")
    expect(summary.locator("dd[data-field='strategy']")).to_have_count(0)
    expect(summary.locator("dd[data-field='dataset']")).to_have_count(0)
    # The summary card: the script's own loss; no trainer hyperparameters to list.
    expect(page.locator("#run-stats dd[data-stat='final_loss']")).not_to_have_text("\u2013")
    expect(page.locator("#hparams-box")).to_be_hidden()

    for chart in ("chart-loss", "chart-accuracy"):  # free-form names each get a chart
        page.wait_for_function(f"({POINTS})('{chart}') === {STEPS}")
    expect(page.locator("#logs")).to_contain_text("hello from train.py")
    checkpoint = page.locator(f"#checkpoints tr[data-step='{STEPS}']")
    expect(checkpoint).to_be_visible()
    expect(checkpoint.locator("button.export-checkpoint")).to_have_count(0)  # the API says 409
    expect(page.locator("#events")).to_contain_text("the script says hi")
    assert laptop.fits_width(), "the job page must not scroll sideways at 1366 px"
    scheme = "dark" if page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches") else ""
    laptop.shot(f"script-job{'-' + scheme if scheme else ''}", full_page=True)


def test_the_jobs_list_marks_script_jobs_and_compare_takes_them(
    laptop: Dash, api: httpx.Client, running_script: dict[str, Any], dataset_id: str
) -> None:
    trainer_spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name="trainer")
    trainer = _submit(api, trainer_spec.model_dump(mode="json"))
    page = laptop.page
    laptop.open("/jobs")
    script_row = page.locator(f"tr[data-job-id='{running_script['id']}']")
    expect(script_row.locator(".kind-script")).to_have_text("script")
    expect(script_row).to_contain_text(f"step {STEPS}")
    trainer_row = page.locator(f"tr[data-job-id='{trainer['id']}']")
    expect(trainer_row).to_be_visible()
    expect(trainer_row.locator(".kind-script")).to_have_count(0)
    assert laptop.fits_width()

    laptop.open(f"/compare?ids={running_script['id']},{trainer['id']}&metric=accuracy")
    page.wait_for_selector("main[data-loaded]")
    expect(page.locator("#compare-metrics input[value='accuracy']")).to_be_checked()
    expect(page.locator("#compare-diff thead th")).to_have_count(3)  # field, then each run
    page.wait_for_function(f"({POINTS})('compare-chart-accuracy') === {STEPS}")
    # It reports no tokens_per_second x step_time_s: by tokens seen, the page says so.
    page.select_option("#compare-x", "tokens")
    expect(page.locator("#compare-note")).to_contain_text(
        f"No tokens seen for #{running_script['id']}"
    )


def test_clone_of_a_script_job_opens_its_spec_and_the_api_would_accept_it(
    laptop: Dash, api: httpx.Client, running_script: dict[str, Any]
) -> None:
    laptop.open(f"/submit?from={running_script['id']}")
    laptop.page.wait_for_selector("main[data-loaded]")
    clone = yaml.safe_load(laptop.page.input_value("#spec-editor"))
    original = api.get(f"/v1/jobs/{running_script['id']}").json()["spec"]
    assert clone == {**original, "name": "mnist-script-copy"}
    expect(laptop.page.locator("#spec-errors")).to_contain_text("would accept")


def test_a_script_job_submitted_from_the_editors_script_template_opens_with_its_code_card(
    laptop: Dash, code_id: str
) -> None:
    page = laptop.page
    laptop.console.expect_status(422)  # the template's placeholder archive id, until replaced
    laptop.open("/submit?template=script")
    page.wait_for_selector("main[data-loaded]")
    expect(page.locator("#spec-template")).to_have_value("script")
    spec = yaml.safe_load(page.input_value("#spec-editor"))
    assert set(spec) == {"name", "entrypoint", "resources"}
    assert spec["entrypoint"]["command"] == ["python", "train.py"]
    laptop.shot("script-submit")
    spec["entrypoint"]["code"] = code_id
    spec["resources"]["pool"] = unique_queue("nowhere")  # no worker takes it
    page.fill("#spec-editor", yaml.safe_dump(spec, sort_keys=False))
    expect(page.locator("#spec-errors")).to_contain_text("would accept")
    page.click("#submit-job")
    page.wait_for_url(re.compile(r"#/jobs/\d+$"))
    expect(page.locator("#code-archive")).to_have_text(code_id)
    expect(page.locator("#code-command")).to_have_text("python train.py")
    expect(page.locator("#job-state")).to_have_text("queued")
