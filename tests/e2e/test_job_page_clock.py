"""A job's page read from Berlin on a 1366x768 laptop (issue 45, items 6 and 7): one clock on the
page, UTC and named, with the same digits as the CLI and the trainer's own log stamps (the
Events card said "07:47:57 MEZ" above a log line's "06:47:56,934"); and a checkpoint's uri and
its Copy button inside the Checkpoints card (the table overflowed it by 280 px, the uri cut to
"jc" and Copy at x=1558), light and dark.

Each test makes its own parked job (`core.jobs.service.create`) and writes its event, log line
and checkpoints into the database as ingest does: no training runs. Waits are Playwright's."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from core.jobs import upserts
from core.platform.db import session_scope
from core.platform.settings import Settings
from core.platform.tables import JobEvent
from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, Dash, new_dash
from tests.integration.workers.helpers import create_job, tiny_spec, unique_queue
from torchyard.units import format_when
from trainer.logs import formatter

AT = datetime(2026, 11, 25, 6, 47, 57, 120_000, tzinfo=UTC)  # 07:47:57 in Berlin
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})? UTC")


def _job(engine: Engine, owner: ProjectKey, dataset_id: str) -> int:
    spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name="clock")
    return create_job(engine, owner, spec)


def _trainer_line(at: datetime, message: str) -> str:
    """What rank 0 of the trainer prints at `at`, in its own format (trainer/logs.py)."""
    record = logging.makeLogRecord(
        {"name": "trainer", "levelno": logging.INFO, "levelname": "INFO", "msg": message}
    )
    record.created, record.msecs = at.timestamp(), at.microsecond / 1000
    return formatter(0).format(record)


@pytest.fixture(params=["light", "dark"])
def berlin(
    request: pytest.FixtureRequest, browser: Browser, live_api: str, owner: ProjectKey
) -> Iterator[Dash]:
    """A Berlin browser (de-DE) at 1366x768, once light and once dark."""
    with new_dash(
        browser, live_api, owner.api_key, request.param, LAPTOP, timezone_id="Europe/Berlin",
        locale="de-DE",
    ) as dash:  # fmt: skip
        yield dash


def test_a_berlin_browser_shows_the_job_pages_times_in_utc_with_the_clis_digits(
    berlin: Dash, engine: Engine, owner: ProjectKey, dataset_id: str
) -> None:
    job_id = _job(engine, owner, dataset_id)
    with session_scope(engine) as s:
        s.add(JobEvent(job_id=job_id, attempt=1, kind="info", message="checkpointing",
                       created_at=AT))  # fmt: skip
        line = _trainer_line(AT, "saving checkpoint at step 10")
        upserts.logs(session=s, job_id=job_id, attempt=1,
                    lines=[upserts.Log(rank=0, stream="stdout", offset=0, line=line)])  # fmt: skip
    cli_stamp = format_when(AT).split(" (")[0]  # the CLI's `2026-11-25 06:47:57 UTC (... ago)`
    assert cli_stamp == "2026-11-25 06:47:57 UTC"

    page = berlin.page
    berlin.open(f"/jobs/{job_id}")
    event = page.locator("#events li[data-kind='info']")
    expect(event.locator(".when")).to_have_text(cli_stamp)
    # The log line beside it names the same zone, with the same digits for the same instant.
    log = page.locator("#logs div[data-rank='0']")
    expect(log).to_contain_text(f"{cli_stamp[:-4]}.120 UTC INFO trainer: saving checkpoint")
    # Every time on the page is UTC and says so: no Berlin time, no unnamed zone.
    created = page.locator("#job-summary dd[data-field='created']")
    expect(created).to_have_text(STAMP)
    text = page.locator("main").inner_text()
    assert not re.search(r"\b(MEZ|MESZ|CET|CEST|GMT[+-]\d)", text), text
    assert "07:47" not in text, text


def test_the_checkpoints_uri_and_its_copy_button_fit_the_card_at_1366(
    laptop_scheme: Dash, engine: Engine, owner: ProjectKey, dataset_id: str, settings: Settings
) -> None:
    job_id = _job(engine, owner, dataset_id)
    uris = {step: Path(settings.storage_url) / f"jobs/{job_id}/checkpoints/step_{step:08d}"
            for step in (60, 120)}  # fmt: skip
    with session_scope(engine) as s:
        for step, uri in uris.items():
            uri.mkdir(parents=True)
            (uri / ".metadata").write_bytes(b"not read by the page")
            upserts.checkpoint(session=s, job_id=job_id, attempt=2, step=step, uri=str(uri),
                              size_bytes=123_456_789)  # fmt: skip
    page = laptop_scheme.page
    laptop_scheme.open(f"/jobs/{job_id}")
    # The widest export cell there is: a pending export waiting for an exporter.
    row = page.locator("#checkpoints tr[data-step='60']")
    row.locator("button.export-checkpoint").click()
    expect(row.locator(".export-waiting")).to_be_visible()
    card = page.locator("#checkpoints-section").bounding_box()
    table = page.locator("#checkpoints-section table").bounding_box()
    assert card is not None and table is not None
    assert table["x"] >= card["x"] and table["x"] + table["width"] <= card["x"] + card["width"], (
        table,
        card,
    )
    viewport = LAPTOP["width"]
    for step in uris:
        where = page.locator(f"#checkpoints tr[data-uri-of='{step}'] td.uri")
        expect(where.locator("code")).to_be_visible()
        code = where.locator("code").bounding_box()
        copy = where.locator("button.copy")
        expect(copy).to_be_visible()
        box = copy.bounding_box()
        assert code is not None and box is not None
        assert code["x"] + code["width"] <= card["x"] + card["width"], (code, card)
        right = min(viewport, card["x"] + card["width"])
        assert box["x"] >= 0 and box["x"] + box["width"] <= right, (box, card)
        expect(where.locator("code")).to_have_text(re.compile(f"checkpoints/step_{step:08d}$"))
    assert laptop_scheme.fits_width()
