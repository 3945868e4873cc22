"""The live view's ETA arithmetic and the end-of-run summary, from plain models."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from torchyard.client import Jobs, _FollowCursor
from torchyard.errors import ConnectionFailed
from torchyard.follow import StepRate, heartbeat_silence_s
from torchyard.summary import summarize
from torchyard.types import Checkpoint, Event, Job, MetricSeries

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_eta_at_a_constant_rate_is_remaining_steps_over_rate() -> None:
    rate = StepRate()
    for i in range(5):
        rate.observe(step=10 * i, now=100.0 + 2 * i)  # 5 steps/s
    assert rate.steps_per_second() == pytest.approx(5.0)
    assert rate.eta(max_steps=600, now=108.0) == pytest.approx((600 - 40) / 5)


def test_eta_counts_down_between_observations() -> None:
    rate = StepRate()
    rate.observe(0, 0.0)
    rate.observe(100, 10.0)
    assert rate.eta(200, now=13.0) == pytest.approx(7.0)
    assert rate.eta(200, now=99.0) == 0.0


def test_eta_follows_the_recent_rate_not_the_startup() -> None:
    rate = StepRate(window_s=30.0)
    rate.observe(0, 0.0)
    rate.observe(10, 100.0)  # slow start-up: 0.1 step/s
    for i in range(1, 11):
        rate.observe(10 + 10 * i, 100.0 + 5 * i)  # then 2 steps/s
    assert rate.steps_per_second() == pytest.approx(2.0)


def test_eta_falls_back_to_the_trainers_step_time_then_unknown() -> None:
    rate = StepRate()
    assert rate.eta(600, now=0.0) is None
    rate.observe(100, 50.0)
    assert rate.eta(600, now=50.0) is None
    assert rate.eta(600, now=50.0, step_time_s=0.1) == pytest.approx(50.0)
    assert rate.eta(None, now=50.0, step_time_s=0.1) is None


def test_eta_ignores_steps_that_do_not_advance() -> None:
    rate = StepRate()
    rate.observe(10, 0.0)
    rate.observe(10, 5.0)
    rate.observe(5, 6.0)
    assert list(rate.samples) == [(0.0, 10)]


def _feed(
    cursor: _FollowCursor,
    *messages: tuple[str, dict[str, Any]],
    logs: bool = False,
    rank: int | None = None,
) -> list[Any]:
    out: list[Any] = []
    for kind, data in messages:
        out += cursor.on_message(kind, data, True, True, logs, rank)
    return out


def test_follow_yields_each_metric_point_once_per_name_even_when_a_restart_replays() -> None:
    cursor = _FollowCursor()
    line = lambda step, **values: ("metric", {"step": step, "time": 0.0, "values": values})  # noqa: E731
    got = _feed(
        cursor,
        line(10, loss=3.0),
        line(20, loss=2.5),
        line(20, eval_loss=2.7),  # the eval of step 20 is a line of its own
        line(10, loss=3.1),  # a restart from the step-10 checkpoint replays step 10
        line(30, loss="NaN"),
    )
    assert [(p.step, p.name) for p in got] == [
        (10, "loss"),
        (20, "loss"),
        (20, "eval_loss"),
        (30, "loss"),
    ]
    assert math.isnan(got[-1].value)


def test_follow_yields_the_job_when_it_changed_and_advances_its_step_from_metrics() -> None:
    cursor = _FollowCursor()
    job = Job(id=1, name="a", state="running", current_step=10, max_steps=100)
    data = job.model_dump(mode="json")
    assert _feed(cursor, ("job", data)) == [job]
    assert _feed(cursor, ("job", data)) == []  # the server's timed refresh: nothing new
    moved = _feed(cursor, ("metric", {"step": 20, "time": 1.0, "values": {"loss": 1.0}}))
    assert [j.current_step for j in moved if isinstance(j, Job)] == [20]


def test_follow_yields_logs_only_when_asked_and_of_the_rank_asked() -> None:
    lines = [
        (
            "log",
            {
                "id": i,
                "attempt": 1,
                "rank": i % 2,
                "stream": "stdout",
                "line": f"l{i}",
                "created_at": T0.isoformat(),
            },
        )
        for i in range(1, 5)
    ]
    assert _feed(_FollowCursor(), *lines) == []
    assert [x.line for x in _feed(_FollowCursor(), *lines, logs=True, rank=1)] == ["l1", "l3"]


def _event(i: int, kind: str, data: dict[str, object], **kw: object) -> Event:
    return Event(id=i, job_id=1, kind=kind, data=data, created_at=T0, **kw)


def test_summary_prefers_the_trainers_final_report() -> None:
    job = Job(
        id=1,
        name="q",
        state="succeeded",
        current_step=600,
        max_steps=600,
        started_at=T0,
        finished_at=T0 + timedelta(seconds=90),
    )
    events = [
        _event(1, "state", {"unigram_eval_loss": 3.1, "max_steps": 600}, state_to="running"),
        _event(2, "sample", {"prompt": "def ", "text": "foo(x):", "step": 600}),
        _event(
            3,
            "state",
            {
                "final_loss": 1.5,
                "final_eval_loss": 1.6,
                "tokens_per_second": 9000.0,
                "checkpoint_uri": "/c/step_600",
            },
            state_to="succeeded",
        ),
    ]
    series = [MetricSeries(name="loss", steps=[590, 600], values=[1.7, 1.8])]
    checkpoints = [
        Checkpoint(id=1, job_id=1, step=400, uri="/c/step_00000400"),
        Checkpoint(id=2, job_id=1, step=600, uri="/c/step_00000600"),
    ]
    s = summarize(job, events, series, checkpoints)
    assert (s.final_loss, s.final_eval_loss, s.unigram_eval_loss) == (1.5, 1.6, 3.1)
    assert s.tokens_per_second == 9000.0
    assert s.checkpoint_uri == "/c/step_00000600"
    assert (s.sample_prompt, s.sample_text) == ("def ", "foo(x):")
    assert s.duration_s == 90.0  # no `running_s` (an older server): the wall time
    assert (
        summarize(job.model_copy(update={"running_s": 75.0}), events, series, []).duration_s == 75.0
    )
    assert s.succeeded


def test_summary_falls_back_to_metric_series_and_error_events() -> None:
    job = Job(id=1, name="q", state="failed", current_step=30, max_steps=600)
    series = [
        MetricSeries(name="loss", steps=[10, 20, 30], values=[3.0, 2.9, 2.8]),
        MetricSeries(name="tokens_per_second", steps=[10, 20, 30], values=[100.0, 900.0, 1000.0]),
    ]
    events = [_event(1, "error", {}, message="NCCL timeout")]
    s = summarize(job, events, series, [])
    assert s.final_loss == 2.8
    assert s.final_eval_loss is None
    assert s.tokens_per_second == 900.0  # median: robust to the slow first steps
    assert s.checkpoint_uri is None
    assert s.error == "NCCL timeout"
    assert not s.succeeded


def test_heartbeat_silence_counts_only_for_jobs_a_worker_holds() -> None:
    now = T0 + timedelta(seconds=75)
    running = Job(id=1, name="q", state="running", heartbeat_at=T0)
    assert heartbeat_silence_s(running, now) == 75.0
    naive = running.model_copy(update={"heartbeat_at": T0.replace(tzinfo=None)})
    assert heartbeat_silence_s(naive, now) == 75.0, "SQLite's naive times are UTC"
    assert heartbeat_silence_s(running.model_copy(update={"state": "succeeded"}), now) is None
    assert heartbeat_silence_s(running.model_copy(update={"heartbeat_at": None}), now) is None


class _InterruptedWhileClosing(Jobs):
    """A stream whose read is interrupted by Ctrl-C, and whose close then fails: what httpx
    raises is a transport error with the interrupt only as its context."""

    streams = 0

    def stream(self, job_id: int, *, last_event_id: str | None = None) -> Any:
        self.streams += 1
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise httpx.ReadError("connection closed while reading") from None
        except httpx.ReadError as exc:
            raise ConnectionFailed(f"stream of job {job_id} broke: {exc}") from exc
        yield  # a generator, as the real stream is


def test_follow_stops_on_ctrl_c_even_when_closing_the_stream_failed_too() -> None:
    jobs = _InterruptedWhileClosing(client=None)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        list(jobs.follow(1, poll_s=0.0))
    assert jobs.streams == 1  # not taken for a dropped connection and resumed
