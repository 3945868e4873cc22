"""A GRPO job (`method.kind: grpo`) is read by its rewards, not its losses: the end-of-run
summary gives the last training reward and the held-out reward with the first evaluation's
beside it, and the live view's bar and evaluation lines show rewards (its `eval_loss` is
-eval_reward, which would read as a loss going below zero)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress

from torchyard.follow import _View
from torchyard.summary import render_summary, summarize
from torchyard.types import Job, MetricPoint, MetricSeries


def _job(method: str) -> Job:
    spec = {"model": {}, "method": {"kind": method}}
    return Job.model_validate(
        {"id": 2, "name": "sums-grpo", "state": "succeeded", "current_step": 40,
         "max_steps": 40, "spec": spec, "latest_metrics": {"reward": 0.62, "eval_reward": 0.85,
                                                          "loss": -0.0085, "eval_loss": -0.85}}
    )  # fmt: skip


def _text(renderable: object) -> str:
    console = Console(record=True, width=120, color_system=None)
    console.print(renderable)
    return console.export_text()


def _rows(text: str) -> dict[str, str]:
    return {line[:12].strip(): line[12:].strip() for line in text.splitlines() if line[:12].strip()}


def test_a_grpo_jobs_summary_gives_its_rewards_and_the_held_out_reward_it_started_from() -> None:
    series = [
        MetricSeries(name="eval_reward", steps=[0, 10, 40], values=[0.25, 0.7, 0.85]),
        MetricSeries(name="reward", steps=[5, 40], values=[0.3, 0.62]),
    ]
    job = _job("grpo")
    assert job.method == "grpo"
    rows = _rows(_text(render_summary(summarize(job, [], series, []))))
    assert rows["reward"] == "0.62"
    assert rows["eval reward"] == "0.85 (0.25 at step 0)"
    assert "train loss" not in rows and "eval loss" not in rows


def test_other_methods_keep_their_losses() -> None:
    for method in ("sft", "dpo"):
        rows = _rows(_text(render_summary(summarize(_job(method), [], [], []))))
        assert "eval loss" in rows and "reward" not in rows, method
    assert Job.model_validate({"id": 1, "name": "t", "state": "queued"}).method == "sft"


def test_following_a_grpo_job_shows_its_reward_and_prints_its_held_out_rewards() -> None:
    console = Console(record=True, width=160, color_system=None)
    progress = Progress(console=console)
    view = _View(progress, 2)
    view.on_job(_job("grpo"))
    for name, value in (
        ("reward", 0.5),
        ("loss", -0.01),
        ("eval_reward", 0.7),
        ("eval_loss", -0.7),
    ):
        view.on_metric(MetricPoint(name=name, step=10, value=value))
    assert progress.tasks[0].fields["loss"] == "reward 0.5"
    printed = console.export_text()
    assert "step 10: eval reward 0.7" in printed and "eval loss" not in printed
