"""An eval job (`evaluate`) prints as one in `torchyard jobs`, `show`, while followed and in the
end-of-run summary: kind ``eval``, its scores first, the job and checkpoint it scored, and the
starting weights' score beside each where another eval job measured it; none of a training
job's figures (losses, tokens/s, steps, checkpoint)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.progress import Progress

from torchyard.eval_results import eval_result
from torchyard.follow import _View
from torchyard.render import job_details, jobs_table
from torchyard.summary import render_summary, summarize
from torchyard.types import Evaluation, Event, Job, MetricPoint, MetricSeries

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
SOURCE, CHECKPOINT, STEP = 12, 34, 600


def _text(renderable: object, width: int = 80) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def _eval_job(job_id: int = 40, initial: bool = False, **kw: object) -> Job:
    source = {"job": SOURCE, "initial": True} if initial else {"job": SOURCE, "checkpoint": 34}
    fields: dict[str, object] = {
        "id": job_id,
        "name": "quickstart-eval",
        "state": "succeeded",
        "pool": "default",
        "current_step": STEP,
        "max_steps": None,
        "latest_metrics": {"perplexity.loss": 2.5, "perplexity.perplexity": 12.18},
        "spec": {"name": "quickstart-eval", "evaluate": {"source": source, "evaluations": []}},
        "created_at": NOW - timedelta(minutes=2),
        "started_at": NOW - timedelta(seconds=5),
        "finished_at": NOW,
        "running_s": 2.0,
    }
    fields.update(kw)
    return Job.model_validate(fields)


def _evaluation(job_id: int, checkpoint: int | None, step: int, loss: float) -> Evaluation:
    return Evaluation(
        id=job_id,
        job_id=job_id,
        source_job_id=SOURCE,
        checkpoint_id=checkpoint,
        step=step,
        name="perplexity",
        kind="perplexity",
        metrics={"loss": loss, "perplexity": 2.718281828**loss},
    )


# the source job's evals: this job's (step 600) and a baseline eval job's (starting weights)
EVALS = [_evaluation(41, None, 0, 3.5), _evaluation(40, CHECKPOINT, STEP, 2.5)]


def test_an_eval_job_is_of_kind_eval_with_a_typed_source() -> None:
    job = _eval_job()
    assert job.kind == "eval"
    assert job.eval_source is not None
    assert (job.eval_source.job, job.eval_source.checkpoint) == (SOURCE, CHECKPOINT)
    assert _eval_job(initial=True).eval_source.initial  # type: ignore[union-attr]
    trainer = Job.model_validate({"id": 1, "name": "t", "state": "queued", "spec": {"model": {}}})
    assert (trainer.kind, trainer.eval_source) == ("trainer", None)


def test_jobs_table_at_80_columns_says_eval_in_the_kind_column() -> None:
    text = _text(jobs_table([_eval_job()], now=NOW))
    header, row = (line.split() for line in text.splitlines()[:2])
    assert row[header.index("KIND")] == "eval", text


def test_show_says_how_long_an_eval_job_ran_not_that_it_trained() -> None:
    text = _text(job_details(_eval_job()))
    rows = {line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1].strip() for line in
            text.splitlines() if len(line.split(maxsplit=1)) == 2}  # fmt: skip
    assert rows["kind"] == "eval"
    assert rows["ran"].startswith("2s")
    assert "trained" not in rows


def test_the_result_pairs_each_score_with_the_starting_weights_score_of_the_same_name() -> None:
    result = eval_result(_eval_job(), EVALS)
    assert result is not None
    assert result.scores["perplexity.loss"] == 2.5
    assert result.baseline["perplexity.loss"] == 3.5 and result.baseline_job == 41
    assert (result.source_job, result.checkpoint_id, result.step) == (SOURCE, CHECKPOINT, STEP)
    # the baseline eval job itself has no baseline: it is the starting weights
    base = eval_result(_eval_job(41, initial=True), EVALS)
    assert base is not None and base.scores["perplexity.loss"] == 3.5 and not base.baseline
    assert eval_result(Job(id=1, name="t", state="queued"), EVALS) is None


def test_an_eval_jobs_summary_leads_with_its_scores_source_and_change_not_training() -> None:
    done = Event(id=1, job_id=40, kind="state", state_to="succeeded", data={})
    series = [MetricSeries(name="perplexity.loss", steps=[STEP], values=[2.5])]
    summary = summarize(_eval_job(), [done], series, [], EVALS)
    text = _text(render_summary(summary))
    lines = [line.split() for line in text.splitlines() if line.strip()]
    assert [line[0] for line in lines[:5]] == [
        "job",
        "state",
        "perplexity.loss",
        "perplexity.perplexity",
        "source",
    ], text
    assert lines[2] == ["perplexity.loss", "2.5", "base", "3.5,", "change", "-1"], text
    assert lines[4] == ["source", "job", "12,", "checkpoint", "34", "(step", "600)"], text
    assert "eval job 41 (starting weights)" in text
    assert "ran" in text and "2s" in text
    for training_only in ("train loss", "eval loss", "tokens/s", "steps", "checkpoint  ", "/?"):
        assert training_only not in text, text


def test_an_eval_jobs_summary_falls_back_to_its_metric_series_without_evaluations() -> None:
    series = [MetricSeries(name="qa.exact_match", steps=[STEP], values=[0.75])]
    text = _text(render_summary(summarize(_eval_job(), [], series, [], [])))
    lines = [line.split() for line in text.splitlines()]
    assert ["qa.exact_match", "0.75"] in lines and lines[3][:4] == [
        "source",
        "job",
        "12,",
        "checkpoint",
    ]
    assert "base" not in text


def test_following_an_eval_job_shows_its_scores_not_tokens_per_second() -> None:
    progress = Progress(console=Console(record=True, width=160, color_system=None))
    view = _View(progress, 40)
    view.on_job(_eval_job(state="running"))
    view.on_metric(MetricPoint(name="perplexity.loss", step=STEP, value=2.5))
    assert progress.tasks[0].fields["extra"] == "perplexity.loss 2.5"
