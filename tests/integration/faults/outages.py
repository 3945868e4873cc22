"""What a database outage (a cut or a restart) must leave behind: one clean run, stored once."""

from __future__ import annotations

from sqlalchemy import Engine

from tests.integration.workers.helpers import job_events, log_lines, metric_series


def assert_stored_once(engine: Engine, job_id: int, steps: int, checkpoints: list[int]) -> None:
    """Job `job_id` ran once (queued, starting, running, succeeded): every step's `loss`,
    `lr` and `grad_norm` from 1 to `steps`, each checkpoint of `checkpoints` and each log line
    stored exactly once."""
    for name in ("loss", "lr", "grad_norm"):
        assert [p.step for p in metric_series(engine, job_id, name)] == list(range(1, steps + 1))
    events = job_events(engine, job_id)
    assert [e.data["step"] for e in events if e.kind == "checkpoint"] == checkpoints
    assert [e.state_to for e in events if e.kind == "state"] == [
        "queued", "starting", "running", "succeeded",
    ]  # fmt: skip
    keys = [(x.rank, x.stream, x.offset) for x in log_lines(engine, job_id)]
    assert len(keys) == len(set(keys))
