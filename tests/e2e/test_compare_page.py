"""Compare at 1366x768 (issue 45, item 9): runs named as they were written (the table's header
upper-cased "gpt-small-lr3e-4"), metrics grouped as train, eval and system node by node with
readable labels ("RSS, node 0", not `sys/rss_bytes/node0`), and wall time in the hover label as
a duration ("47s", "3m51s"), not "46.936".

Two parked jobs whose metric points are written as ingest writes them: no training runs.
Waits are Playwright's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from core.jobs import upserts
from core.platform.db import session_scope
from tests.conftest import ProjectKey
from tests.e2e.conftest import LAPTOP, Dash, new_dash
from tests.integration.workers.helpers import create_job, tiny_spec, unique_queue

T0 = 1_795_000_000.0  # unix seconds of each run's first point
SECONDS = (0.0, 46.936, 231.2)  # wall time of steps 1, 2 and 3
SERIES = ("loss", "eval_loss", "sys/cpu_percent/rank0", "sys/rss_bytes/node0",
          "sys/gpu_memory_bytes/node1-gpu0")  # fmt: skip
NAMES = ("gpt-small-lr3e-4", "Baseline-v2")
HOVER = """(id) => {
  const node = document.getElementById(id);
  Plotly.Fx.hover(node, [{ curveNumber: 0, pointNumber: 1 }]);
  return node.querySelector('.hoverlayer').textContent;
}"""


@pytest.fixture
def runs(engine: Engine, owner: ProjectKey, dataset_id: str) -> list[int]:
    ids = []
    for name in NAMES:
        spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name=name)
        job_id = create_job(engine, owner, spec)
        points = [upserts.Metric(series, step + 1, 2.0 / (step + 1), T0 + s)
                  for series in SERIES for step, s in enumerate(SECONDS)]  # fmt: skip
        with session_scope(engine) as session:
            upserts.metrics(session=session, job_id=job_id, attempt=1, points=points)
        ids.append(job_id)
    return ids


@pytest.fixture(params=["light", "dark"])
def laptop(
    request: pytest.FixtureRequest, browser: Browser, live_api: str, owner: ProjectKey
) -> Iterator[Dash]:
    """The dashboard at 1366x768, once light and once dark."""
    with new_dash(browser, live_api, owner.api_key, request.param, LAPTOP) as dash:
        yield dash


def test_compare_names_runs_as_written_groups_metrics_and_hovers_wall_time_as_a_duration(
    laptop: Dash, runs: list[int]
) -> None:
    page = laptop.page
    laptop.open(f"/compare?ids={runs[0]},{runs[1]}&x=time")
    page.wait_for_selector("main[data-loaded]")
    heads = page.locator("#compare-diff thead th a")
    expect(heads).to_have_count(2)
    # as rendered (innerText follows CSS text-transform), not only as written in the DOM
    shown = [head.inner_text() for head in heads.all()]
    assert shown == [f"#{i} {name}" for i, name in zip(runs, NAMES, strict=True)], shown

    groups = page.locator("#compare-metrics .metric-group")
    expect(groups).to_have_count(4)
    assert [g.get_attribute("data-group") for g in groups.all()] == [
        "train", "eval", "system, node 0", "system, node 1",
    ]  # fmt: skip
    label = page.locator("#compare-metrics label:has(input[value='sys/rss_bytes/node0'])")
    expect(label).to_have_text("RSS, node 0")
    expect(groups.nth(2)).to_contain_text("CPU %, rank 0")
    expect(groups.nth(3)).to_contain_text("memory used, GPU 0")

    page.wait_for_function("document.getElementById('compare-chart-loss')?.data?.length === 4")
    hover = page.evaluate(HOVER, "compare-chart-loss")
    assert "47s" in hover and "46.9" not in hover, hover
    page.evaluate("Plotly.Fx.unhover(document.getElementById('compare-chart-loss'))")
    late = page.evaluate(HOVER.replace("pointNumber: 1", "pointNumber: 2"), "compare-chart-loss")
    assert "3m51s" in late and "231" not in late, late
    assert laptop.fits_width()
