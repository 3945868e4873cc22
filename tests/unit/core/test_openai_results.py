"""The OpenAI view's projections of stored rows (`core/openai/results.py`, `jobs_page`): the
results CSV, `trained_tokens` and the label-filtered jobs page, on a SQLite database of their own
(the integration module covers Postgres through the official client)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from core.openai.projection import BASE_LABEL, META_PREFIX, jobs_page
from core.openai.results import (
    REINFORCEMENT_COLUMNS,
    RESULT_COLUMNS,
    results_csv,
    trained_tokens,
)
from core.platform.db import make_engine, session_factory
from core.platform.tables import Base, Job, JobEvent, MetricPoint, Project
from jobspec.job import JobSpec


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    engine = make_engine(f"sqlite:///{tmp_path / 'oai.db'}")
    Base.metadata.create_all(engine)
    with session_factory(engine)() as s:
        s.add(Project(id="p", name="p"))
        s.flush()
        yield s
    engine.dispose()


GRPO = {"kind": "grpo", "grpo": {"graders": [{"type": "python", "name": "g", "source": "grade=1"}]}}


def _job(
    session: Session,
    state: str = "succeeded",
    step: int = 6,
    method: dict[str, Any] | None = None,
    **labels: str,
) -> Job:
    spec = JobSpec(name="j", data={"uri": "/data/corpus"}, train={"epochs": 3}, method=method or {})
    job = Job(
        project_id="p",
        name="j",
        spec=spec,
        labels=labels,
        max_steps=0,
        state=state,
        current_step=step,
    )
    session.add(job)
    session.flush()
    return job


def _event(session: Session, job: Job, kind: str, data: dict[str, Any]) -> None:
    session.add(JobEvent(job_id=job.id, kind=kind, data=data))
    session.flush()


def test_results_csv_is_one_row_per_logged_step_of_the_stored_losses(session: Session) -> None:
    job = _job(session)
    points = [("loss", 2, 2.5), ("loss", 4, 1.25), ("eval_loss", 0, 3.0), ("eval_loss", 4, 1.5)]
    points += [("loss", 6, float("inf")), ("lr", 3, 0.01)]
    for name, step, value in points:
        session.add(MetricPoint(job_id=job.id, name=name, step=step, value=value, time=0.0))
    session.flush()
    text = results_csv(session, job)
    rows = list(csv.reader(io.StringIO(text)))
    assert tuple(rows[0]) == RESULT_COLUMNS
    assert rows[1:] == [
        ["0", "", "", "3.0", ""],
        ["2", "2.5", "", "", ""],
        ["4", "1.25", "", "1.5", ""],
        ["6", "", "", "", ""],  # logged, but not a number
    ]
    assert results_csv(session, _job(session)) == ",".join(RESULT_COLUMNS) + "\n"


def test_a_reinforcement_jobs_results_csv_has_the_reward_columns(session: Session) -> None:
    job = _job(session, method=GRPO)
    points = [("reward", 2, 0.25), ("reward", 4, 0.5), ("eval_reward", 4, 0.75)]
    points += [("eval_loss", 4, -0.75), ("loss", 2, 0.1), ("reward/g", 2, 0.25)]
    for name, step, value in points:
        session.add(MetricPoint(job_id=job.id, name=name, step=step, value=value, time=0.0))
    session.flush()
    rows = list(csv.reader(io.StringIO(results_csv(session, job))))
    assert (
        tuple(rows[0])
        == REINFORCEMENT_COLUMNS
        == ("step", "train_reward_mean", "valid_reward_mean")
    )
    assert rows[1:] == [["2", "0.25", ""], ["4", "0.5", "0.75"]]


def test_trained_tokens_are_the_data_reports_tokens_times_epochs(session: Session) -> None:
    reported, unreported, running = _job(session), _job(session, step=5), _job(session, "running")
    for job in (reported, unreported, running):
        _event(session, job, "state", {"tokens_per_step": 512, "max_steps": 6})
    _event(session, reported, "info", {"format": "messages", "train": {"tokens": 700}})
    _event(session, reported, "info", {"format": "messages", "train": {"tokens": 1000}})
    _event(session, running, "info", {"format": "messages", "train": {"tokens": 10}})
    found = trained_tokens(session, [reported, unreported, running])
    # the latest report x 3 epochs; no report: tokens_per_step x steps; not yet succeeded: none
    assert found == {reported.id: 3000, unreported.id: 5 * 512}


def test_jobs_page_filters_by_label_in_the_query(session: Session) -> None:
    plain = _job(session)
    zero = _job(session, **{BASE_LABEL: "m", f"{META_PREFIX}run": "0"})
    one = _job(session, **{BASE_LABEL: "m", f"{META_PREFIX}run": "1"})
    assert plain.id < zero.id < one.id
    assert jobs_page(session, "p", None, 10) == ([one, zero], False)
    assert jobs_page(session, "p", None, 1) == ([one], True)
    assert jobs_page(session, "p", f"ftjob-{one.id}", 1) == ([zero], False)
    assert jobs_page(session, "p", None, 10, {"run": "0"}) == ([zero], False)
    assert jobs_page(session, "p", None, 10, {"run": "2"}) == ([], False)
