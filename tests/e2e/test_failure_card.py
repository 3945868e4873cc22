"""A failed job's page starts with why it failed (issue 15: "failure class, reason, the failing
rank and its last log lines, and what the retry policy did — not a timeline to dig through"),
in a real Chromium at 1366x768, light and dark; a restarted job shows its last failure as a
warning line. Each test makes its own jobs (`core.jobs.service.create`) in its own project and
writes the failure into the row as the lifecycle does (`tests.integration.failures`): no training
runs. Waits are Playwright's, no sleeps."""

from __future__ import annotations

import dataclasses

import pytest
from playwright.sync_api import expect
from sqlalchemy import Engine, update

from core.platform.db import session_scope
from core.platform.tables import Job, JobState, LogLine
from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, Dash
from tests.integration.failures import INFRA, OOM, RETRIES, USER_ERROR, fail_job
from tests.integration.workers.helpers import create_job, tiny_spec, unique_queue

# Where the card sits: the element right after the page's title bar, and its box.
LAYOUT = """() => {
  const h1 = document.querySelector('#view > h1');
  const card = document.getElementById('failure');
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.top, r.bottom]; };
  // The card's background as [r, g, b] (a canvas resolves color-mix() and color() forms).
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.fillStyle = getComputedStyle(card).backgroundColor;
  ctx.fillRect(0, 0, 1, 1);
  return {
    after_title: h1.nextElementSibling.firstElementChild === card,
    card: box(card),
    summary: box(document.getElementById('job-summary')),
    background: [...ctx.getImageData(0, 0, 1, 1).data.slice(0, 3)],
    dark: matchMedia('(prefers-color-scheme: dark)').matches,
  };
}"""

LIMIT_ERROR = "max_runtime_s exceeded (60 s)\ncheckpointed at step 120"
HINT = "`/data/labels.jsonl` is not visible to the job: declare it in `entrypoint.inputs`"


def _job(engine: Engine, owner: ProjectKey, dataset_id: str, name: str) -> int:
    """Two nodes of two processes (ranks 0-3), on a pool no worker serves."""
    spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name=name,
                     retries=RETRIES, resources={"nodes": 2, "procs_per_node": 2})  # fmt: skip
    return create_job(engine, owner, spec)


@pytest.fixture
def failed_job(engine: Engine, owner: ProjectKey, dataset_id: str) -> int:
    """Failed of OOM on rank 3 after two infra restarts (attempt 3)."""
    job_id = _job(engine, owner, dataset_id, "oom-run")
    fail_job(engine, job_id, OOM, restarts_by_class={"infra": 2})
    return job_id


@pytest.fixture
def laptop(laptop_scheme: Dash) -> Dash:
    """The dashboard at 1366x768, light and dark (`laptop_scheme`)."""
    return laptop_scheme


def test_a_failed_jobs_page_starts_with_class_reason_where_budget_and_log_tail(
    laptop: Dash, failed_job: int
) -> None:
    page = laptop.page
    laptop.open(f"/jobs/{failed_job}")
    card = page.locator("#failure")
    expect(card).to_be_visible()
    expect(card.locator(".fclass")).to_have_text("oom")
    expect(card.locator(".reason")).to_have_text(OOM.reason)
    for field, value in (("rank", "3"), ("node", "1"), ("host", "host-b"), ("exit code", "1")):
        expect(card.locator(f"dd[data-field='{field}']")).to_have_text(value)
    expect(card.locator(".retry-summary")).to_have_text(
        "restarted 2 times (hang 0/2, infra 2/3, at most 3 in all); oom is not restarted (budget 0)"
    )
    expect(card).to_contain_text("Last log lines of rank 3")
    expect(card.locator("pre.log-tail")).to_have_text("\n".join(OOM.log_tail))
    expect(page.locator("#log-rank")).to_have_value("3")  # the logs open on the failing rank

    layout = page.evaluate(LAYOUT)
    assert layout["after_title"], "the failure card is the first thing under the title"
    assert layout["card"][1] <= layout["summary"][0], layout
    assert layout["card"][1] <= LAPTOP["height"], "the whole card shows without scrolling"
    assert laptop.fits_width()
    # The card's own background: reddish, and dark in dark mode (not a light box there).
    red, green, blue = layout["background"]
    assert red > green and red > blue, layout
    assert (red + green + blue < 200) == layout["dark"], layout
    # The error text (which repeats the log tail) is not listed again in the summary.
    expect(page.locator("#job-summary dd[data-field='error']")).to_have_count(0)
    laptop.shot("job-failed-dark" if layout["dark"] else "job-failed")
    # "all its logs": the page's log view, filtered to the failing rank, even after another.
    page.select_option("#log-rank", "")
    card.locator("#failing-rank-logs").click()
    expect(page.locator("#log-rank")).to_have_value("3")
    expect(page.locator("#logs")).to_contain_text("No log lines yet.")  # this job never ran


def test_a_restarted_job_shows_its_last_failure_as_a_warning_line(
    laptop: Dash, engine: Engine, owner: ProjectKey, dataset_id: str
) -> None:
    job_id = _job(engine, owner, dataset_id, "infra-run")
    fail_job(engine, job_id, INFRA, state=JobState.RUNNING, restarts_by_class={"infra": 1})
    laptop.open(f"/jobs/{job_id}")
    line = laptop.page.locator("#failure.failure-warning")
    expect(line).to_be_visible()
    expect(line.locator(".fclass")).to_have_text("infra")
    expect(line).to_contain_text(f"{INFRA.reason} (rank 1 on host-a)")
    expect(line).to_contain_text("restarted once (hang 0/2, infra 1/3, at most 3 in all)")
    expect(laptop.page.locator("pre.log-tail")).to_have_count(0)
    assert laptop.fits_width()


def test_the_jobs_list_shows_the_failure_class_beside_the_state(
    laptop: Dash, failed_job: int, engine: Engine, owner: ProjectKey, dataset_id: str
) -> None:
    healthy = _job(engine, owner, dataset_id, "fine-run")
    laptop.open("/jobs")
    row = laptop.page.locator(f"#jobs-body tr[data-job-id='{failed_job}']")
    expect(row.locator(".state")).to_have_text("failed")
    expect(row.locator(".fclass")).to_have_text("oom")
    expect(row.locator(".fclass")).to_have_attribute("title", OOM.reason)
    ok = laptop.page.locator(f"#jobs-body tr[data-job-id='{healthy}']")
    expect(ok.locator(".state")).to_have_text("queued")
    expect(ok.locator(".fclass")).to_have_count(0)
    assert laptop.fits_width()


def test_a_failed_job_without_a_recorded_failure_starts_with_its_error(
    laptop: Dash, engine: Engine, owner: ProjectKey, dataset_id: str
) -> None:
    """A runtime limit (or a job from before failures were classed) has only `error`."""
    job_id = _job(engine, owner, dataset_id, "limit-run")
    with session_scope(engine) as session:
        session.execute(
            update(Job).where(Job.id == job_id).values(state="failed", error=LIMIT_ERROR)
        )
    laptop.open(f"/jobs/{job_id}")
    card = laptop.page.locator("#failure")
    expect(card.locator(".reason")).to_have_text("max_runtime_s exceeded (60 s)")
    expect(card.locator(".fclass")).to_have_count(0)
    expect(card.locator("pre.log-tail")).to_have_text("checkpointed at step 120")
    assert laptop.page.evaluate(LAYOUT)["after_title"]


def test_a_user_error_leads_with_clone_renders_code_and_opens_on_the_failing_ranks_logs(
    laptop: Dash, engine: Engine, owner: ProjectKey, dataset_id: str
) -> None:
    """Issue 28, item 9: Retry was offered first for a user error that fails the same way;
    backticks showed literally; the logs opened on all ranks, whose end is torchrun's own report,
    with a doubled prefix (`[rank 1] [rank1]: ...`)."""
    job_id = _job(engine, owner, dataset_id, "user-error-run")
    fail_job(engine, job_id, dataclasses.replace(USER_ERROR, hints=(HINT,)))
    lines = [
        (1, "[rank1]: Traceback (most recent call last):"),
        (1, "[rank1]: KeyError: 'labels'"),
        (0, "[rank0]: step 3 | loss 2.1"),
        (-1, "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: train.py FAILED"),
    ]
    with session_scope(engine) as session:
        session.add_all(
            LogLine(job_id=job_id, attempt=1, rank=rank, stream="stderr", offset=i, line=line)
            for i, (rank, line) in enumerate(lines)
        )
    page = laptop.page
    laptop.open(f"/jobs/{job_id}")
    card = page.locator("#failure")
    expect(card.locator(".fclass")).to_have_text("user_error")
    reason = card.locator(".reason")
    expect(reason).to_have_text(
        "KeyError: 'labels' (the spec's data.format reads no labels column)"
    )
    expect(reason.locator("code")).to_have_text(["data.format", "labels"])
    # What the platform noticed at launch (`Failure.hints`), a line of its own, code rendered.
    hint = card.locator("#failure-hints li")
    expect(hint).to_have_text(HINT.replace("`", ""))
    expect(hint.locator("code")).to_have_text(["/data/labels.jsonl", "entrypoint.inputs"])
    expect(card.locator("#retry-advice")).to_contain_text("fails the same way when retried")
    expect(page.locator("#retry-job")).to_have_class("subtle")
    expect(page.locator(f"a[href='#/submit?from={job_id}'] button")).to_have_class("primary")

    # It never reported a figure: no row of dashes (issue 28, item 5).
    expect(page.locator("#summary-card")).to_be_hidden()
    expect(page.locator("#log-rank")).to_have_value("1")
    logs = page.locator("#logs > div")
    expect(logs).to_have_text(
        ["[rank 1] Traceback (most recent call last):", "[rank 1] KeyError: 'labels'"]
    )
    page.select_option("#log-rank", "")  # the user's choice holds while the page refreshes
    expect(logs).to_have_count(len(lines))
    expect(logs.nth(2)).to_have_text("[rank 0] step 3 | loss 2.1")
    expect(page.locator("#log-rank")).to_have_value("")
    assert laptop.fits_width()
