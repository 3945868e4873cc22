"""Bodies of `/v1/sessions` (`api/routes/sessions.py`): training sessions of the
Tinker-compatible API as Torchyard shows them, with their training clients, jobs and calls."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from api import openapi_examples
from api.schemas import Timestamp

_SESSION_EXAMPLE: dict[str, Any] = {
    "id": "ses_4f1c2a9e0b7d",
    "state": "active",
    "display_name": "sums-rl",
    "tags": ["rl"],
    "user_metadata": {"experiment": "sums-rl"},
    "sdk_version": "0.38.0",
    "owner": "key:ci",
    "created_at": "2026-11-30T09:00:00Z",
    "last_heartbeat_at": "2026-11-30T09:12:40Z",
    "ended_at": None,
    "ended_reason": None,
    "models": [
        {
            "model_id": "ses_4f1c2a9e0b7d:train:0",
            "base_model": "tiny-llama",
            "lora_rank": 8,
            "job_id": 1207,
            "job_state": "running",
            "current_step": 40,
        }
    ],
    "calls": {"done": 81, "queued": 1},
}


class SessionModelOut(BaseModel):
    """A training client of the session and the session job serving it."""

    model_id: str = Field(description="The client's `model_id`, `<session>:train:<n>`.")
    base_model: str = Field(description="The registered base model it trains adapters of.")
    lora_rank: int = Field(description="Its LoRA rank.")
    job_id: int = Field(description="The session job serving it (`GET /v1/jobs/{id}`).")
    job_state: str | None = Field(description="That job's state; null when it is gone.")
    current_step: int | None = Field(
        description="The job's optimizer steps so far (`optim_step` calls applied)."
    )


class SessionOut(BaseModel):
    """One training session: what its client sent, its state and heartbeats, its training
    clients with their jobs, and its calls counted by state."""

    model_config = openapi_examples.config(_SESSION_EXAMPLE)

    id: str = Field(description="The session id (`ses_...`).")
    state: str = Field(description="`active` while its client heartbeats, else `ended`.")
    display_name: str | None = Field(description="The name the client gave, if any.")
    tags: list[str] = Field(description="The client's tags (`TINKER_TAGS`).")
    user_metadata: dict[str, Any] = Field(description="The client's `user_metadata`.")
    sdk_version: str = Field(description="The client's `tinker` version.")
    owner: str | None = Field(description="Who created it: the key's actor.")
    created_at: Timestamp = Field(description="When it was created. UTC, ISO 8601.")
    last_heartbeat_at: Timestamp = Field(description="Its client's last heartbeat. UTC.")
    ended_at: Timestamp | None = Field(description="When it ended; null while active.")
    ended_reason: str | None = Field(description="Why it ended (closed, idle, ...).")
    models: list[SessionModelOut] = Field(
        description="Its training clients, in the order its client made them."
    )
    calls: dict[str, int] = Field(
        description="Its clients' calls by state: queued, running, done, failed (states with "
        "none left out)."
    )


class SessionPage(BaseModel):
    model_config = openapi_examples.config({"items": [_SESSION_EXAMPLE], "next_offset": None})

    items: list[SessionOut] = Field(description="Sessions, newest first.")
    next_offset: int | None = Field(
        description="Pass as `offset` for the next page; null on the last."
    )
