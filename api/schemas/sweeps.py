"""Bodies of `/v1/sweeps` (`api/routes/sweeps.py`): a sweep, its trials, its best trial."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from api import openapi_examples
from api.schemas import Timestamp
from jobspec.sweep import SweepSpec

SWEEP_SPEC_EXAMPLE: dict[str, Any] = {
    "name": "lr-sweep",
    "base": {
        "name": "gpt-small",
        "data": {"dataset": "ds_2f6c1a9e0b7d4c21"},
        "train": {"max_steps": 600, "micro_batch_size": 8},
        "eval": {"interval_steps": 50},
    },
    "space": {
        "optim.lr": {"log_uniform": [1e-5, 1e-2]},
        "optim.warmup_steps": {"int": [0, 100, 25]},
    },
    "metric": "eval_loss",
    "direction": "minimize",
    "searcher": "tpe",
    "pruner": {"kind": "asha", "min_resource": 100, "reduction_factor": 3},
    "max_trials": 16,
    "max_concurrent_trials": 4,
}

_TRIAL_EXAMPLE: dict[str, Any] = {
    "number": 3,
    "state": "pruned",
    "params": {"optim.lr": 0.0071, "optim.warmup_steps": 25},
    "value": 5.12,
    "job_id": 1042,
    "job_state": "cancelled",
    "current_step": 300,
    "pruned_step": 300,
    "pruned_rung": 1,
    "error": None,
    "created_at": "2026-11-27T12:00:00Z",
    "finished_at": "2026-11-27T12:04:10Z",
}


SWEEP_EXAMPLE: dict[str, Any] = {
    "id": 7,
    "name": "lr-sweep",
    "state": "running",
    "spec": SWEEP_SPEC_EXAMPLE,
    "owner": "ci",
    "error": None,
    "max_trials": 16,
    "trials": {"running": 4, "succeeded": 5, "pruned": 3, "failed": 0, "cancelled": 0},
    "best": {
        "number": 2,
        "value": 4.87,
        "params": {"optim.lr": 0.0021, "optim.warmup_steps": 50},
        "job_id": 1041,
        "checkpoint_id": 310,
        "checkpoint_step": 600,
    },
    "created_at": "2026-11-27T12:00:00Z",
    "updated_at": "2026-11-27T12:31:00Z",
    "finished_at": None,
}


class TrialOut(BaseModel):
    """One trial: the values it drew, how it went, its job."""

    model_config = openapi_examples.config(_TRIAL_EXAMPLE)

    number: int = Field(description="The trial's number in the sweep, from 0.")
    state: str = Field(
        description="running (its job queued or training), succeeded, pruned (stopped by the "
        "pruner), failed (its job failed, or the drawn spec was invalid: see `error`), "
        "cancelled."
    )
    params: dict[str, Any] = Field(description="The drawn value of each search-space path.")
    value: float | None = Field(
        description="The metric's last reported value (null while running or when never reported)."
    )
    job_id: int | None = Field(description="The trial's job; null when it never had one.")
    job_state: str | None = Field(description="That job's state.")
    current_step: int | None = Field(description="The job's last reported step.")
    pruned_step: int | None = Field(description="The step at which the pruner stopped it.")
    pruned_rung: int | None = Field(
        description="The successive-halving rung it lost at (null for the median pruner)."
    )
    error: str | None = Field(description="Why it failed or was cancelled.")
    created_at: Timestamp = Field(description="When it was drawn. UTC, ISO 8601.")
    finished_at: Timestamp | None = Field(description="When it ended; null while running.")


class TrialList(BaseModel):
    model_config = openapi_examples.config({"items": [_TRIAL_EXAMPLE]})

    items: list[TrialOut] = Field(description="Every trial of the sweep, by number.")


class BestTrial(BaseModel):
    """The best completed trial and where its model is."""

    number: int = Field(description="The trial's number.")
    value: float = Field(description="Its metric's last value, the best of the completed trials.")
    params: dict[str, Any] = Field(description="The values it drew, by search-space path.")
    job_id: int | None = Field(description="Its job.")
    checkpoint_id: int | None = Field(
        description="Its job's latest checkpoint (export it with "
        "`POST /v1/jobs/{job_id}/checkpoints/{checkpoint_id}/export`); null when none is kept."
    )
    checkpoint_step: int | None = Field(description="That checkpoint's step.")
    export_refused: str | None = Field(
        default=None,
        description="Why that export would be refused (409), and what the job offers instead: "
        "a LoRA/QLoRA or Hugging Face trial's checkpoints hold no full built-in GPT, its run "
        "wrote its adapter and merged model at its end. Null when the export works.",
    )


class SweepOut(BaseModel):
    """A sweep: its spec, state, trials by state, and best trial so far."""

    model_config = openapi_examples.config(SWEEP_EXAMPLE)

    id: int = Field(description="The sweep's id.")
    name: str = Field(description="Its name; each trial's job is named `<name>-<number>`.")
    state: str = Field(description="running, succeeded, failed or cancelled.")
    spec: SweepSpec = Field(description="The sweep spec as submitted (`init_from` pinned).")
    owner: str | None = Field(description="The name of the API key that submitted it.")
    error: str | None = Field(description="Why it failed, or why it stopped starting trials.")
    max_trials: int = Field(description="Trials it runs in all (a grid's size when smaller).")
    trials: dict[str, int] = Field(description="Trials by state.")
    best: BestTrial | None = Field(description="The best completed trial; null before one.")
    created_at: Timestamp = Field(description="When it was submitted. UTC, ISO 8601.")
    updated_at: Timestamp = Field(description="When a trial last ended or it changed state.")
    finished_at: Timestamp | None = Field(description="When it ended; null while running.")


class SweepPage(BaseModel):
    model_config = openapi_examples.config({"items": [SWEEP_EXAMPLE], "next_after": None})

    items: list[SweepOut] = Field(description="Sweeps, newest first.")
    next_after: int | None = Field(
        description="Pass as `after` for the next page (older sweeps); null on the last page."
    )
