"""What a fine-tuning job produced, in OpenAI's shapes: its result file (a CSV of step metrics,
generated on request from the stored metric points, never stored itself) and its
`trained_tokens` (from the trainer's `data` and `running` reports, stored as job events)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from core.jobs import reports as queries
from core.platform.tables import Job, JobEvent, JobState
from jobspec.job import JobSpec

RESULT_PREFIX = "file-result-"
RESULT_PURPOSE = "fine-tune-results"
RESULT_COLUMNS = ("step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy")
# Our metric name -> OpenAI's column; the accuracy columns stay empty (not measured).
_METRIC_COLUMNS = {"loss": "train_loss", "eval_loss": "valid_loss"}
# A reinforcement (GRPO) job's: the mean reward of the step's sampled completions, and of the
# greedy completions of the held-out prompts at an evaluation.
REINFORCEMENT_COLUMNS = ("step", "train_reward_mean", "valid_reward_mean")
_REWARD_COLUMNS = {"reward": "train_reward_mean", "eval_reward": "valid_reward_mean"}


def result_file_id(job: Job) -> str:
    """`file-result-<job id>`: the id of a succeeded job's result file."""
    return f"{RESULT_PREFIX}{job.id}"


def result_job_id(file_id: str) -> int | None:
    """The job id of a result file's id; None when `file_id` is not one."""
    digits = file_id.removeprefix(RESULT_PREFIX)
    if not file_id.startswith(RESULT_PREFIX) or not digits.isdigit() or len(digits) > 18:
        return None
    return int(digits)


def results_csv(session: Session, job: Job) -> str:
    """The job's step metrics as OpenAI's results CSV: header `RESULT_COLUMNS`, one row per
    step that logged `loss` or `eval_loss` (ascending), values as stored (`repr` floats),
    empty where unknown or not finite. A reinforcement (`grpo`) job's: header
    `REINFORCEMENT_COLUMNS`, one row per step that logged `reward` or `eval_reward`."""
    rows: dict[int, dict[str, str]] = {}
    reinforcement = isinstance(job.spec, JobSpec) and job.spec.method.kind == "grpo"
    columns = REINFORCEMENT_COLUMNS if reinforcement else RESULT_COLUMNS
    metric_columns = _REWARD_COLUMNS if reinforcement else _METRIC_COLUMNS
    names = list(metric_columns)
    for series in queries.metric_series(session=session, job_id=job.id, names=names):
        column = metric_columns[series.name]
        for step, value in zip(series.steps, series.values, strict=True):
            rows.setdefault(step, {})[column] = repr(value) if math.isfinite(value) else ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    for step in sorted(rows):
        writer.writerow({"step": str(step), **rows[step]})
    return out.getvalue()


def trained_tokens(session: Session, found: Iterable[Job]) -> dict[int, int]:
    """Tokens trained on, by job id, for the succeeded ones among `found`: the training
    split's `tokens` from the latest `data` report (tokens of the kept examples after
    truncation, prompt and answer alike; for preference data chosen and rejected together)
    times `train.epochs` — OpenAI's "tokens in the training file x epochs". A run without such
    a report counts its `running` status' `tokens_per_step` x the steps taken."""
    done = {j.id: j for j in found if j.state == JobState.SUCCEEDED and isinstance(j.spec, JobSpec)}
    if not done:
        return {}
    query = (
        select(JobEvent.job_id, JobEvent.data)
        .where(JobEvent.job_id.in_(list(done)), JobEvent.kind.in_(["info", "state"]))
        .order_by(JobEvent.id)
    )
    reports: dict[int, dict[str, int]] = {}
    for job_id, data in session.execute(query):
        mine = reports.setdefault(job_id, {})
        if not isinstance(data, dict):
            continue
        train = data.get("train")
        if isinstance(train, dict) and isinstance(train.get("tokens"), int):
            mine["tokens"] = train["tokens"]
        if isinstance(data.get("tokens_per_step"), int):
            mine["per_step"] = data["tokens_per_step"]
    out: dict[int, int] = {}
    for job_id, job in done.items():
        spec, mine = job.spec, reports.get(job_id, {})
        assert isinstance(spec, JobSpec)
        if "tokens" in mine and spec.train.epochs:
            out[job_id] = mine["tokens"] * spec.train.epochs
        elif "per_step" in mine:
            out[job_id] = mine["per_step"] * (job.current_step or 0)
    return out
