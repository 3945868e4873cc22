"""A job's page and the jobs list as a team uses them daily (issue 15): the summary card of a
finished run (losses, tokens, throughput, sample, hyperparameters), labels and a note edited
from the page, the list's loss columns, deep links through sign-in, and no overflow at 1366 and
1920 px, light and dark.

One module: a real API (uvicorn), one real worker, and the module's `run` project with one tiny
run that succeeded and one job parked on a pool no worker serves; the tests only read the run.
A test that writes (labels, note) works on its own parked job. Waits are Playwright's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect
from sqlalchemy import Engine

from core.jobs import upserts
from core.jobs.exports import NO_EXPORTER
from core.platform.db import session_scope
from tests.conftest import ProjectKey, make_project
from tests.e2e.conftest import LAPTOP, Dash, api_client, new_dash, register_corpus
from tests.integration.conftest import cli_invoker
from tests.integration.workers.helpers import Worker, tiny_spec, unique_queue, wait_for
from torchyard.units import format_rate

RUN_TIMEOUT_S = 180
STEPS = 24
DESKTOP = {"width": 1920, "height": 1080}


@dataclass(frozen=True)
class Run:
    owner: ProjectKey
    job: dict[str, Any]  # the succeeded run, as the API shows it
    parked: int  # a queued job that never runs


@pytest.fixture(scope="module")
def run(engine: Engine, live_api: str, corpus_dir: Path, pool: str, worker: Worker) -> Run:
    owner = make_project(engine)
    with api_client(live_api, owner) as api:
        dataset_id = register_corpus(api, corpus_dir)
        # As wide as real rows get: a long name, three labels, its place in the queue.
        parked = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id,
                           name="gpt-small-lr3e-4-warmup200-bs64-seq1024-sweep-7",
                           labels={"team": "nlp", "experiment": "warmup-sweep",
                                   "stage": "baseline"})  # fmt: skip
        parked_id = api.post("/v1/jobs", json=parked.model_dump(mode="json")).json()["id"]
        spec = tiny_spec(pool=pool, dataset_id=dataset_id, name="summary-run",
                         train={"max_steps": STEPS}, labels={"team": "nlp"})  # fmt: skip
        answer = api.post("/v1/jobs", json=spec.model_dump(mode="json"))
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]

        def ended() -> dict[str, Any] | None:
            job = api.get(f"/v1/jobs/{job_id}").json()
            return job if job["state"] in ("succeeded", "failed", "cancelled") else None

        job = wait_for("the run to end", ended, RUN_TIMEOUT_S, 0.2)
        assert job["state"] == "succeeded", worker.log[-4000:]
    return Run(owner=owner, job=job, parked=int(parked_id))


@pytest.fixture
def reader(browser: Browser, live_api: str, run: Run) -> Iterator[Dash]:
    with new_dash(browser, live_api, run.owner.api_key, viewport=LAPTOP) as dash:
        yield dash


def _stat(dash: Dash, key: str) -> str:
    return dash.page.locator(f"#run-stats dd[data-stat='{key}']").inner_text()


def _events(api: httpx.Client, job_id: int) -> list[dict[str, Any]]:
    return list(api.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["items"])


def test_a_finished_runs_summary_card_shows_losses_tokens_throughput_sample_and_params(
    reader: Dash, live_api: str, run: Run
) -> None:
    job = run.job
    with api_client(live_api, run.owner) as api:
        events = _events(api, job["id"])
    per_step = next(e["data"]["tokens_per_step"] for e in events
                    if "tokens_per_step" in (e["data"] or {}))  # fmt: skip
    completed = next(
        e["data"] for e in events if (e["data"] or {}).get("trainer_state") == "completed"
    )
    sample = next(e["data"] for e in events if e["kind"] == "sample")

    reader.open(f"/jobs/{job['id']}")
    page = reader.page
    expect(page.locator("#run-stats dd[data-stat='final_loss']")).not_to_have_text("\u2013")
    metrics = job["latest_metrics"]
    assert float(_stat(reader, "final_loss")) == pytest.approx(metrics["loss"], rel=1e-3)
    assert float(_stat(reader, "best_loss")) == pytest.approx(job["best_loss"], rel=1e-3)
    assert job["best_loss"] <= metrics["loss"]
    assert float(_stat(reader, "final_eval_loss")) == pytest.approx(metrics["eval_loss"], rel=1e-3)
    assert float(_stat(reader, "best_eval_loss")) == pytest.approx(job["best_eval_loss"], rel=1e-3)
    # From the events, which the page loads after the job: wait for them (expect retries).
    stats = "#run-stats dd[data-stat='{}']"
    expect(page.locator(stats.format("tokens_seen"))).to_have_text(f"{per_step * STEPS:,}")
    throughput = f"{format_rate(completed['tokens_per_second'])} tokens/s"  # as `submit --follow`
    expect(page.locator(stats.format("throughput"))).to_have_text(throughput)
    # The trainer reports no MFU on a CPU (its peak FLOP/s is unknown): none is made up.
    expect(page.locator("#run-stats dd[data-stat='mfu']")).to_have_count(0)
    expect(page.locator("#run-sample pre")).to_have_text(sample["text"])
    for param, value in (("model.n_layers", "2"), ("train.max_steps", str(STEPS)),
                         ("optim.warmup_steps", "5"), ("model.seq_len", "64")):  # fmt: skip
        expect(page.locator(f"#hparams dd[data-param='{param}']")).to_have_text(value)
    expect(page.locator("#labels-input")).to_have_value("team=nlp")
    assert reader.fits_width()
    reader.shot("job-summary", full_page=True)


def test_labels_and_a_note_are_edited_on_the_page_and_kept(
    browser: Browser, live_api: str, engine: Engine, corpus_dir: Path
) -> None:
    owner = make_project(engine)
    with api_client(live_api, owner) as api:
        dataset_id = register_corpus(api, corpus_dir)
        spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name="to-label",
                         labels={"team": "nlp"})  # fmt: skip
        job_id = api.post("/v1/jobs", json=spec.model_dump(mode="json")).json()["id"]
        with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
            page = dash.page
            dash.open(f"/jobs/{job_id}")
            expect(page.locator("#labels-input")).to_have_value("team=nlp")
            page.fill("#labels-input", "oops")
            page.click("#save-details")
            expect(page.locator("#details-status")).to_contain_text('"oops" is not key=value')
            page.fill("#labels-input", "team=vision, baseline=yes")
            page.fill("#note-input", "diverged at step 900\nretry with warmup")
            page.click("#save-details")
            expect(page.locator("#details-status")).to_have_text("saved")
            job = api.get(f"/v1/jobs/{job_id}").json()
            assert job["labels"] == {"team": "vision", "baseline": "yes"}
            assert job["note"] == "diverged at step 900\nretry with warmup"

            dash.console.expect_status(422)  # the server's limit, shown beside the form
            page.fill("#labels-input", "k=" + "v" * 201)
            page.click("#save-details")
            expect(page.locator("#details-status")).to_contain_text("labels.k")

            page.reload()
            expect(page.locator("#labels-input")).to_have_value("team=vision, baseline=yes")
            expect(page.locator("#note-input")).to_have_value(
                "diverged at step 900\nretry with warmup"
            )
            dash.open("/jobs?label=baseline%3Dyes")
            expect(page.locator("#jobs-body tr[data-job-id]")).to_have_count(1)


def test_the_save_status_says_saving_until_the_answer_and_a_late_input_event_keeps_saved(
    browser: Browser, live_api: str, engine: Engine, corpus_dir: Path
) -> None:
    """Issue 44: `test_labels_and_a_note...` once found the status empty after a save the server
    had made (the inputs held the saved values, the button was enabled again). The only code
    that empties it was an `input` event, and one that changes nothing (the tail of the edit
    just saved, delivered after the click on a loaded host) emptied it. It keeps the answer now;
    and while the PATCH is out the status says so, so a slow server is never a blank."""
    owner = make_project(engine)
    with api_client(live_api, owner) as api:
        dataset_id = register_corpus(api, corpus_dir)
        spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name="to-note")
        job_id = api.post("/v1/jobs", json=spec.model_dump(mode="json")).json()["id"]
        with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
            page = dash.page
            dash.open(f"/jobs/{job_id}")
            expect(page.locator("#labels-input")).to_have_value("")
            held: list[Any] = []
            page.route(f"**/v1/jobs/{job_id}", lambda route: held.append(route)
                       if route.request.method == "PATCH" else route.continue_())  # fmt: skip
            page.fill("#labels-input", "team=vision")
            page.click("#save-details")
            status = page.locator("#details-status")
            expect(status).to_have_text("saving…")
            expect(page.locator("#save-details")).to_be_disabled()
            wait_for("the PATCH to be held", lambda: held or None, 30, poll_s=0.05)
            held[0].continue_()
            expect(status).to_have_text("saved")
            expect(status).to_have_attribute("data-state", "saved")
            # the ordering seen once: an input event after the answer, with nothing changed
            page.dispatch_event("#note-input", "input")
            page.dispatch_event("#labels-input", "input")
            expect(status).to_have_text("saved")
            assert api.get(f"/v1/jobs/{job_id}").json()["labels"] == {"team": "vision"}
            page.fill("#note-input", "a real edit")  # a change: the old answer goes
            expect(status).to_have_text("")


def test_the_jobs_list_shows_final_loss_and_best_eval_loss(reader: Dash, run: Run) -> None:
    reader.open("/jobs")
    row = reader.page.locator(f"#jobs-body tr[data-job-id='{run.job['id']}']")
    expect(row.locator("td.best-eval")).not_to_have_text("\u2013")
    assert float(row.locator("td.loss").inner_text()) == pytest.approx(
        run.job["latest_metrics"]["loss"], rel=1e-3
    )
    assert float(row.locator("td.best-eval").inner_text()) == pytest.approx(
        run.job["best_eval_loss"], rel=1e-3
    )
    parked = reader.page.locator(f"#jobs-body tr[data-job-id='{run.parked}']")
    expect(parked.locator("td.best-eval")).to_have_text("\u2013")
    expect(parked.locator(".queue")).to_contain_text("#1")  # its place in the queue


@pytest.mark.parametrize("remember", [False, True])
def test_a_deep_link_lands_where_it_pointed_after_signing_in(
    browser: Browser, live_api: str, run: Run, remember: bool
) -> None:
    links = [f"/jobs/{run.job['id']}", "/jobs?label=team%3Dnlp&state=queued",
             f"/compare?ids={run.job['id']},{run.parked}"]  # fmt: skip
    with new_dash(browser, live_api, None, viewport=LAPTOP) as guest:
        page = guest.page
        for number, link in enumerate(links):
            guest.open(link)
            if number == 0:  # the first link signs in; the others find the key kept
                expect(page.locator("#api-key")).to_be_visible()
                assert "next=" in page.url
                page.fill("#api-key", run.owner.api_key)
                if remember:
                    page.check("#remember-key")
                page.click("button[type=submit]")
            page.wait_for_function(f"location.hash === {('#' + link)!r}")
            expect(page.locator("main[data-loaded]")).to_be_attached()
        expect(page.locator("#nav")).to_be_visible()
        kept = page.evaluate(
            "[sessionStorage.getItem('torchyard.apiKey'), localStorage.getItem('torchyard.apiKey')]"
        )
        assert kept == ([None, run.owner.api_key] if remember else [run.owner.api_key, None])
        # A new tab of the same browser: signed in only when the key was remembered.
        other = page.context.new_page()
        other.goto(f"{live_api}/ui/#/jobs/{run.job['id']}")
        if remember:
            expect(other.locator("#job-title")).to_contain_text("summary-run")
        else:
            expect(other.locator("#api-key")).to_be_visible()
        # A load already under way when the key goes may still be refused (its next request
        # carries no key): a 401 after logging out is expected, and harmless.
        guest.console.expect_status(401)
        page.click("#logout")
        expect(page.locator("#api-key")).to_be_visible()
        assert page.evaluate("localStorage.getItem('torchyard.apiKey')") is None


# Every visible element's right edge inside the viewport (unless an ancestor that scrolls or
# clips it holds it), and no horizontal scrolling of the page.
OVERFLOW = """() => {
  const clipped = (el) => {
    for (let a = el.parentElement; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      const inside = a.getBoundingClientRect().right <= innerWidth + 0.5;
      if (s.overflowX !== 'visible' && inside) return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (!r.width || !r.height || r.right <= innerWidth + 0.5 || clipped(el)) continue;
    out.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className?.baseVal ?? el.className} `
             + `right ${Math.round(r.right)}`);
  }
  return {
    over: out.slice(0, 10),
    scroll: document.scrollingElement.scrollWidth,
    width: innerWidth,
  };
}"""


# Plotly's charts (`.js-plotly-plot`): each drawing as wide as its box, give or take a few px.
CHARTS_FIT = """() => [...document.querySelectorAll('.js-plotly-plot')].every((c) => {
  const svg = c.querySelector('.main-svg');
  return !svg || Math.abs(svg.getBoundingClientRect().width - c.clientWidth) < 30;
})"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_nothing_overflows_at_1366_and_1920_and_charts_follow_a_resize(
    browser: Browser, live_api: str, run: Run, scheme: str
) -> None:
    with new_dash(browser, live_api, run.owner.api_key, scheme, DESKTOP) as dash:
        page = dash.page
        pages = ("/jobs", f"/jobs/{run.job['id']}", f"/jobs/{run.parked}", "/submit",
                 "/datasets", "/usage")  # fmt: skip
        for route in pages:
            dash.open(route)
            expect(page.locator("main[data-loaded]")).to_be_attached()
            if route == f"/jobs/{run.job['id']}":
                expect(page.locator("#chart-loss .main-svg").first).to_be_attached()
            for size in (DESKTOP, LAPTOP):
                page.set_viewport_size(size)  # type: ignore[arg-type]
                if route == "/jobs":  # at 1920 every column shows; at 1366 some collapse
                    owner = page.locator("#jobs-table th.col-owner")
                    if size == DESKTOP:
                        expect(owner).to_be_visible()
                    else:
                        expect(page.locator("#jobs-table th.col-strategy")).to_be_hidden()
                # Every chart follows the window: as wide as its box again.
                page.wait_for_function(CHARTS_FIT)
                got = page.evaluate(OVERFLOW)
                assert not got["over"] and got["scroll"] <= got["width"], (route, size, got)
            page.set_viewport_size(DESKTOP)  # type: ignore[arg-type]
        dash.open("/jobs")
        expect(page.locator("main[data-loaded]")).to_be_attached()
        dash.shot(f"jobs-1920-{scheme}")


def test_a_revoked_key_on_a_deep_link_signs_in_again_and_comes_back(
    browser: Browser, live_api: str, run: Run
) -> None:
    link = f"/jobs/{run.job['id']}"
    with new_dash(browser, live_api, "ty_revoked-or-mistyped", viewport=LAPTOP) as dash:
        dash.console.expect_status(401)
        dash.open(link)
        expect(dash.page.locator("#api-key")).to_be_visible()
        assert dash.page.evaluate("sessionStorage.getItem('torchyard.apiKey')") is None
        dash.page.fill("#api-key", run.owner.api_key)
        dash.page.click("button[type=submit]")
        expect(dash.page.locator("#job-title")).to_contain_text("summary-run")
        assert dash.page.evaluate("location.hash") == f"#{link}"


def test_a_pending_export_with_no_exporter_says_so_in_its_row(
    browser: Browser, live_api: str, engine: Engine, corpus_dir: Path, tmp_path: Path
) -> None:
    """No exporter runs in this module: the row of a checkpoint whose export was asked for says
    `pending` and why, instead of a silent `pending` forever (issue 28)."""
    owner = make_project(engine)
    with api_client(live_api, owner) as api:
        dataset_id = register_corpus(api, corpus_dir)
        spec = tiny_spec(pool=unique_queue("nowhere"), dataset_id=dataset_id, name="to-export")
        job_id = api.post("/v1/jobs", json=spec.model_dump(mode="json")).json()["id"]
        step_dir = tmp_path / "step_00000010"
        step_dir.mkdir()
        (step_dir / ".metadata").write_bytes(b"not read by the page")
        with session_scope(engine) as s:
            upserts.checkpoint(session=s, job_id=job_id, attempt=1, step=10, uri=str(step_dir),
                              size_bytes=10)  # fmt: skip
        with new_dash(browser, live_api, owner.api_key, viewport=LAPTOP) as dash:
            dash.open(f"/jobs/{job_id}")
            row = dash.page.locator("#checkpoints tr[data-step='10']")
            row.locator("button.export-checkpoint").click()
            expect(row.locator(".state")).to_have_text("pending")
            expect(row.locator(".export-waiting")).to_have_text(f"({NO_EXPORTER})")
            assert dash.fits_width()


def test_a_job_that_is_not_the_projects_shows_not_found_and_no_live_buttons(
    browser: Browser, live_api: str, engine: Engine, run: Run
) -> None:
    """`#/jobs/<id>` of a job of another project (the API's 404): a not-found panel, not an
    empty job page with an active Cancel button and only a toast (issue 28, item 9)."""
    stranger = make_project(engine)
    with new_dash(browser, live_api, stranger.api_key, viewport=LAPTOP) as dash:
        dash.console.expect_status(404)
        dash.open(f"/jobs/{run.job['id']}")
        missing = dash.page.locator("#job-missing")
        expect(missing).to_contain_text(f"Job #{run.job['id']} not found")
        expect(dash.page.locator("#cancel-job")).to_have_count(0)
        expect(dash.page.locator("#charts")).to_have_count(0)
        missing.locator("a", has_text="All jobs").click()
        expect(dash.page.locator("#jobs-body")).to_be_visible()


CHART_DATA = "(id) => document.getElementById(id).data.map(t => [t.name, t.x, t.y, t.opacity ?? 1])"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_page_opens_on_its_charts_with_smoothing_and_an_x_axis_as_in_compare(
    browser: Browser, live_api: str, run: Run, scheme: str
) -> None:
    with new_dash(browser, live_api, run.owner.api_key, scheme, LAPTOP) as dash:
        _charts_first(dash, live_api, run)
        dash.shot(f"job-detail-charts-first-{scheme}")


def _charts_first(reader: Dash, live_api: str, run: Run) -> None:
    """Issue 28, item 4: at 1366x768 the first chart was below the fold behind the summary,
    sample, labels and hyperparameters, with ~130 lines of spec at the end of a ~4,400 px
    page; Compare had smoothing and x axes the job page lacked."""
    job = run.job
    with api_client(live_api, run.owner) as api:
        loss = next(
            s
            for s in api.get(f"/v1/jobs/{job['id']}/metrics").json()["series"]
            if s["name"] == "loss"
        )
        per_step = next(
            e["data"]["tokens_per_step"]
            for e in _events(api, job["id"])
            if "tokens_per_step" in (e["data"] or {})
        )
    page = reader.page
    reader.open(f"/jobs/{job['id']}")
    chart = page.locator("#chart-loss")
    expect(chart).to_be_visible()
    top = chart.evaluate("el => el.getBoundingClientRect().top")
    assert top < LAPTOP["height"] - 120, f"the loss chart starts at {top} px, below the fold"
    expect(page.locator("#spec-box")).not_to_have_attribute("open", "")  # folded
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 4000, height
    # One rank: no per-rank step-time statistics repeating the step time.
    expect(page.locator("#chart-step_time_s")).to_be_visible()
    names = page.evaluate("document.getElementById('chart-step_time_s').data.map(t => t.name)")
    assert names == ["step_time_s"], names

    page.locator("#job-smoothing").fill("0.9")
    page.wait_for_function(
        "document.getElementById('chart-loss').data.some(t => t.name === 'loss (raw)')"
    )
    traces = {t[0]: t for t in page.evaluate(CHART_DATA, "chart-loss")}
    raw, smooth = traces["loss (raw)"], traces["loss"]
    assert raw[2] == pytest.approx(loss["values"]) and raw[3] < 1
    assert smooth[2] != pytest.approx(loss["values"])  # smoothed
    assert smooth[2][0] == pytest.approx(loss["values"][0])  # debiased: starts at the first
    lr = page.evaluate(CHART_DATA, "chart-lr")
    assert [t[0] for t in lr] == ["lr"], lr  # a schedule is never smoothed

    page.select_option("#job-x-axis", "tokens")
    page.wait_for_function("document.querySelector('main').dataset.xAxis === 'tokens'")
    page.wait_for_function(
        "(n) => document.getElementById('chart-loss').data.find(t => t.name === 'loss').x[0] === n",
        arg=loss["steps"][0] * per_step,
    )
    assert reader.fits_width()


def test_the_page_and_the_cli_show_a_job_with_the_same_figures(
    reader: Dash, live_api: str, run: Run, tmp_path: Path
) -> None:
    """Issue 28, item 8: 102.3 MB in the CLI was 97.5 MB on the page (binary units labelled
    MB), "3m 05s" was "3m05s", times had no zone, and "trained" sat beside a longer span with
    no word on the difference. One rule each, in both clients."""
    job = run.job
    cli = cli_invoker(live_api, run.owner.api_key, tmp_path, COLUMNS="200")
    shown = cli("show", str(job["id"]))
    assert shown.exit_code == 0, shown.output
    trained = re.search(r"^trained\s+(.+?)\s*$", shown.stdout, re.MULTILINE)
    assert trained is not None, shown.stdout
    table = cli("checkpoints", str(job["id"]))
    assert table.exit_code == 0, table.output
    sizes = {
        int(cells[1]): f"{cells[3]} {cells[4]}"  # ID STEP ATTEMPT SIZE(number unit) ...
        for cells in (line.split() for line in table.stdout.splitlines()[1:])
        if len(cells) > 4 and cells[1].isdigit()
    }
    assert sizes, table.stdout

    page = reader.page
    reader.open(f"/jobs/{job['id']}")
    expect(page.locator("#job-summary dd[data-field='trained']")).to_have_text(trained.group(1))
    for step, size in sizes.items():
        cell = page.locator(f"#checkpoints tr[data-step='{step}'] td").nth(2)
        expect(cell).to_have_text(size)
    created = page.locator("#job-summary dd[data-field='created']").inner_text()
    assert re.search(r"\b(UTC|GMT)", created), created  # the zone is named


LAST_HOVER = (
    "([id, name]) => document.getElementById(id).data.find(t => t.name === name).text.at(-1)"
)


def test_the_clis_latest_figures_are_the_pages_digits(
    reader: Dash, live_api: str, run: Run, tmp_path: Path
) -> None:
    """Issue 46: the terminal printed ``2.06e+04`` tokens/s and ``1.3e+07`` for RSS while the
    page said 20.6k and 13.0 MB. `torchyard show`'s latest metrics read as the page's summary
    (losses) and as its charts' hover at the last point (tokens/s, step time, each rank's RSS):
    the same digits in both clients."""
    job = run.job
    cli = cli_invoker(live_api, run.owner.api_key, tmp_path, COLUMNS="200")
    shown = cli("show", str(job["id"]))
    assert shown.exit_code == 0, shown.output
    rows = dict(re.findall(r"^(\S+)  +(.+?)\s*$", shown.stdout, re.MULTILINE))
    rss = {key.split("/", 2)[2]: value for key, value in rows.items()
           if key.startswith("sys/rss_bytes/")}  # fmt: skip
    assert rss, shown.stdout  # the worker samples each rank's memory
    assert re.fullmatch(r"[\d.]+ [kMG]B", next(iter(rss.values()))), rss
    assert re.fullmatch(r"[\d.]+k?", rows["tokens_per_second"]), rows

    page = reader.page
    reader.open(f"/jobs/{job['id']}")
    expect(page.locator("#run-stats dd[data-stat='final_loss']")).to_have_text(rows["loss"])
    expect(page.locator("#run-stats dd[data-stat='final_eval_loss']")).to_have_text(
        rows["eval_loss"]
    )
    expect(page.locator("#chart-tokens_per_second")).to_be_visible()
    for chart, trace, value in [
        ("chart-tokens_per_second", "tokens_per_second", rows["tokens_per_second"]),
        ("chart-step_time_s", "step_time_s", rows["step_time_s"]),
        *(("chart-sys-rss_bytes", rank, value) for rank, value in rss.items()),
    ]:
        if page.locator(f"#{chart}").count():
            assert page.evaluate(LAST_HOVER, [chart, trace]) == value, (chart, trace)
        else:  # a series of one sample (a short run) is a number in the values list, not a chart
            name = f"sys/rss_bytes/{trace}" if chart == "chart-sys-rss_bytes" else trace
            expect(page.locator(f"#metric-values dd[data-metric='{name}']")).to_have_text(value)
