"""The usage page in a real browser: reached from the nav, it shows what `GET /v1/usage`
answers (the table's rows and total) and draws the per-day bar chart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from playwright.sync_api import expect
from sqlalchemy import Engine

from tests.conftest import ProjectKey
from tests.e2e.conftest import Dash
from tests.integration.usage_rows import make_job


def test_the_usage_page_shows_the_apis_rows_and_a_bar_per_day(
    dash: Dash, api: httpx.Client, engine: Engine, owner: ProjectKey
) -> None:
    now = datetime.now(UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)  # one day: one bar
    start = max(today, now - timedelta(hours=2))
    make_job(engine, owner, "dash-usage", [(1, start, now - timedelta(seconds=1), 2, 30.0)])
    report = api.get("/v1/usage", params={"group_by": "pool"}).json()
    page = dash.page
    dash.open("/jobs")
    page.click("#nav a[data-nav='usage']")
    page.wait_for_selector("main[data-loaded]")
    expect(page.locator("#nav a[data-nav='usage']")).to_have_class("active")
    page.select_option("#usage-by", "pool")
    row = page.locator("#usage-table tbody tr[data-key='dash-usage']")
    expect(row.locator("td").first).to_have_text("dash-usage")
    slot_hours = f"{report['total']['slot_seconds'] / 3600:.2f}"
    expect(row.locator("td").nth(1)).to_have_text(slot_hours)
    expect(page.locator("#usage-table tfoot")).to_contain_text(slot_hours)
    expect(page.locator("#usage-chart .bars .point")).to_have_count(1)
    # Issue 28, item 7: no pool has a price here, so the chart is of slot-hours (a cost chart
    # would be all zeros) and the page says which pool lacks a price and what a slot-hour is.
    expect(page.locator("#usage-chart")).to_have_attribute("data-series", "slot_hours")
    expect(page.locator("#usage-chart .gtitle")).to_have_text("Slot-hours per day")
    days = api.get("/v1/usage", params={"group_by": "day"}).json()
    charted = page.locator("#usage-chart").evaluate("el => el.data[0].y")
    assert charted == pytest.approx([r["slot_seconds"] / 3600 for r in days["rows"]])
    note = page.locator("#usage-price-note")
    expect(note).to_be_visible()
    expect(note).to_contain_text("No price set for pool")
    expect(note).to_contain_text("dash-usage")
    expect(note).to_contain_text("(TORCHYARD_SLOT_PRICES)")
    expect(page.locator("#usage-explain")).to_contain_text("Slot-hours: devices (GPUs, or CPU")
