"""A GRPO job's page (issue 48) in headless Chromium at 1366x768: its reward charts lead the
page (the reward with its held-out greedy reward, then one chart of every grader's reward), its
loss chart shows the training loss alone (its `eval_loss` is the negative held-out reward), and
every series it reports has a chart; the job is a real one through a worker
(`tests.support.grpo`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from tests.conftest import make_project
from tests.e2e.conftest import LAPTOP, new_dash
from tests.integration.workers.helpers import Worker
from tests.support.grpo import grpo_job, write_prompts
from torchyard.client import Client

JOB_TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(JOB_TIMEOUT_S + 120)
TRACES = "(id) => (document.getElementById(id)?.data ?? []).map((t) => t.name)"


def test_a_grpo_jobs_reward_charts_lead_its_page(
    browser: Browser,
    live_api: str,
    engine: Engine,
    pool: str,
    worker: Worker,
    tmp_path: Path,
) -> None:
    owner = make_project(engine)
    with Client(live_api, owner.api_key) as client:
        client.datasets.upload("prompts", write_prompts(tmp_path / "prompts.jsonl"))
        job = client.jobs.create(grpo_job(dataset="prompts", pool=pool))
        done = client.jobs.wait(job.id, poll_s=0.5, timeout_s=JOB_TIMEOUT_S)
        assert done.state == "succeeded", (done.error, worker.log[-4000:])
        (held,) = client.jobs.metrics(job.id, names=["eval_reward"])
    with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
        dash.open(f"/jobs/{job.id}")
        page = dash.page
        page.wait_for_function(f"({TRACES})('chart-reward').length === 2")
        ids = page.eval_on_selector_all("#charts .chart", "(nodes) => nodes.map((n) => n.id)")
        assert ids[:2] == ["chart-reward", "chart-reward_graders"], ids
        assert ids.index("chart-loss") > ids.index("chart-entropy"), ids
        traces = {i: page.evaluate(TRACES, i) for i in ids}
        assert traces["chart-reward"] == ["reward", "eval_reward"]
        assert sorted(traces["chart-reward_graders"]) == ["reward/exact", "reward/lower"]
        assert traces["chart-loss"] == ["loss"], "eval_loss is -eval_reward: not a loss to read"
        assert traces["chart-clip_ratio"] == [
            "clip_ratio/low",
            "clip_ratio/high",
            "clip_ratio/region",
        ]
        shown = {name for names in traces.values() for name in names}
        own = {"chart-reward_lower", "chart-reward_exact", "chart-eval_loss", "chart-loss_eval"}
        assert own.isdisjoint(ids), "a grader's reward and eval_loss get no chart of their own"
        assert {"entropy", "completion_length", "frac_reward_zero_std"} <= shown
        # The summary reads the run by its rewards, not by a loss that is ~0 by construction.
        latest = done.latest_metrics
        stat = "#run-stats dd[data-stat='{}']"
        for key, value in (("final_reward", latest["reward"]),
                           ("final_eval_reward", latest["eval_reward"])):  # fmt: skip
            assert float(page.inner_text(stat.format(key))) == pytest.approx(value, rel=1e-3)
        assert page.locator(stat.format("final_loss")).count() == 0
        # The last step's group: its completions with their rewards, which the run averaged.
        rows = page.locator("#run-samples tbody tr")
        expect(rows).to_have_count(8)  # group_size
        rewards = [
            float(r)
            for r in page.eval_on_selector_all(
                "#run-samples td[data-reward]", "(cells) => cells.map((c) => c.dataset.reward)"
            )
        ]
        assert all(0.0 <= r <= 1.0 for r in rewards) and len(rewards) == 8
        events = page.inner_text("#events")
        assert "training and" in events and "evaluation prompts (prompt records" in events
        assert dash.fits_width()
        dash.shot("grpo-job", full_page=True)
        # The jobs list reads it by its rewards too, the held-out one the best reported.
        dash.open("/jobs")
        row = page.locator(f"#jobs-table tr[data-job-id='{job.id}']")
        expect(row.locator("td.loss")).to_contain_text("reward ")
        cells = {c: row.locator(f"td.{c}").inner_text().split() for c in ("loss", "best-eval")}
        assert [words[0] for words in cells.values()] == ["reward", "reward"], cells
        assert float(cells["loss"][1]) == pytest.approx(latest["reward"], rel=1e-3)
        assert float(cells["best-eval"][1]) == pytest.approx(max(held.values), rel=1e-3)
        # Compare reads it by its rewards: those charts by default, those results first.
        dash.open(f"/compare?ids={job.id}")
        page.wait_for_function("document.getElementById('compare-chart-reward')?.data?.length")
        results = page.eval_on_selector_all(
            "#compare-diff tr[data-result]", "(rows) => rows.map((r) => r.dataset.result)"
        )
        assert results[3:6] == ["final reward", "final eval reward", "best eval reward"], results
        best = page.inner_text("#compare-diff tr[data-result='best eval reward'] td")
        assert float(best) == pytest.approx(max(held.values), rel=1e-3)
