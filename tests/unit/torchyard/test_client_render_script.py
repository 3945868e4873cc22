"""A script job (`entrypoint`, docs/CONTRACTS.md section 5) prints as one in `torchyard jobs`,
`show` and the end-of-run summary: its kind, its command as a shell line, its code archive, env
and requirements, and the metrics it chose to report; none of the trainer's figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rich.console import Console
from rich.progress import Progress

from torchyard.follow import _View
from torchyard.render import job_details, jobs_table, step_text
from torchyard.summary import render_summary, summarize
from torchyard.types import Event, Job, MetricPoint, MetricSeries

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
ENTRYPOINT = {
    "code": "code_0123456789abcdef",
    "command": ["python", "train.py", "--note", "two words", "--lr", "3e-4"],
    "env": {"WANDB_MODE": "offline", "GREETING": "hi there"},
    "requirements": ["numpy>=1.26", "sentencepiece==0.2.0"],
    "keep_last_checkpoints": 2,
}


def _text(renderable: object) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


def _script_job(**kw: object) -> Job:
    fields: dict[str, object] = {
        "id": 9,
        "name": "my-script",
        "state": "running",
        "pool": "default",
        "current_step": 40,
        "max_steps": 0,  # the API's for a script job: the end is the script's to know
        "latest_metrics": {"loss": 0.5, "accuracy": 0.875},
        "spec": {"name": "my-script", "resources": {"nodes": 1}, "entrypoint": ENTRYPOINT},
        "created_at": NOW - timedelta(minutes=2),
    }
    fields.update(kw)
    return Job.model_validate(fields)


def test_a_script_job_is_of_kind_script_with_a_typed_entrypoint() -> None:
    job = _script_job()
    assert job.kind == "script"
    assert job.entrypoint is not None and job.entrypoint.command[1] == "train.py"
    trainer = Job.model_validate({"id": 1, "name": "t", "state": "queued", "spec": {"model": {}}})
    assert (trainer.kind, trainer.entrypoint) == ("trainer", None)


def test_jobs_table_marks_script_jobs_and_shows_steps_without_an_end() -> None:
    text = _text(jobs_table([_script_job(), _script_job(id=10, current_step=None)], now=NOW))
    lines = [line.split() for line in text.splitlines() if line.strip()]
    assert lines[1][:6] == ["9", "my-script", "running", "40", "0.5", "script"]
    assert lines[2][:4] == ["10", "my-script", "running", "-"], "not 0/0"


def test_show_prints_kind_command_as_a_shell_line_code_env_and_requirements() -> None:
    text = _text(job_details(_script_job()))
    rows = {line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1] for line in text.splitlines()
            if len(line.split(maxsplit=1)) == 2}  # fmt: skip
    assert rows["kind"].strip() == "script"
    assert rows["command"].strip() == "python train.py --note 'two words' --lr 3e-4"
    assert rows["code"].strip() == "code_0123456789abcdef"
    assert "GREETING='hi there'" in text and "WANDB_MODE=offline" in text
    assert rows["requirements"].strip() == "numpy>=1.26, sentencepiece==0.2.0"
    assert "last 2" in text
    assert rows["step"].strip() == "40"
    assert rows["accuracy"].strip() == "0.875"


def test_a_script_jobs_summary_lists_its_own_metrics_not_the_trainers() -> None:
    job = _script_job(state="succeeded", started_at=NOW - timedelta(seconds=90), finished_at=NOW)
    series = [MetricSeries(name="accuracy", steps=[10, 40], values=[0.5, 0.875])]
    done = Event(id=1, job_id=9, kind="status", data={"steps": 40, "final_loss": 0.5})
    text = _text(render_summary(summarize(job, [done], series, [])))
    assert "python train.py --note 'two words' --lr 3e-4" in text
    assert "accuracy" in text and "0.875" in text and "loss" in text
    for trainer_only in ("eval loss", "tokens/s", "unigram"):
        assert trainer_only not in text


def test_a_trainer_jobs_summary_keeps_its_figures() -> None:
    job = Job.model_validate({"id": 1, "name": "t", "state": "succeeded", "current_step": 5,
                              "max_steps": 5, "spec": {"model": {}}})  # fmt: skip
    text = _text(render_summary(summarize(job, [], [], [])))
    assert "eval loss" in text and "tokens/s" in text and "command" not in text
    assert step_text(job) == "5/5"


def test_following_a_script_job_shows_its_own_metrics_not_tokens_per_second() -> None:
    progress = Progress(console=Console(record=True, width=160, color_system=None))
    view = _View(progress, 9)
    view.on_job(_script_job())
    for point in (("accuracy", 0.875), ("loss", 0.5), ("sys/cpu_percent/0", 99.0)):
        view.on_metric(MetricPoint(name=point[0], step=41, value=point[1]))
    fields = progress.tasks[0].fields
    assert (fields["loss"], fields["extra"]) == ("loss 0.5", "accuracy 0.875")

    trainer = _View(progress, 1)
    trainer.on_job(Job.model_validate({"id": 1, "name": "t", "state": "running", "max_steps": 9}))
    trainer.on_metric(MetricPoint(name="tokens_per_second", step=1, value=51234.0))
    assert progress.tasks[1].fields["extra"] == "51.2k tok/s"
