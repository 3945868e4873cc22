"""Training runs and checkpoints of the Tinker-compatible API (`api/routes/tinker_api/runs.py`), on
the wire as the official client `tinker==0.38.0` reads them (`tinker.types.TrainingRun`,
`Checkpoint`, `TrainingRunsResponse`, `CheckpointsListResponse`, `Cursor`; docs/TINKER-WIRE.md;
here `RunCheckpoint` and `PageCursor`, names the OpenAPI document has free). Mirrored, not
imported (see `api.schemas.tinker`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from api.schemas import Timestamp
from api.schemas.tinker import _wire
from core.sessions import marks

CHECKPOINT = {
    "checkpoint_id": "weights/step-20",
    "checkpoint_type": "training",
    "time": "2026-11-30T10:04:50Z",
    "tinker_path": "tinker://ses_4f1c2a9e0b7d6c3a:train:0/weights/step-20",
    "size_bytes": 4718592,
    "public": False,
    "user_metadata": None,
    "expires_at": None,
}
RUN = {
    "training_run_id": "ses_4f1c2a9e0b7d6c3a:train:0",
    "base_model": "Qwen/Qwen3-8B",
    "model_owner": "key_0123456789abcdef",
    "is_lora": True,
    "corrupted": False,
    "lora_rank": 32,
    "last_request_time": "2026-11-30T10:05:02Z",
    "last_checkpoint": CHECKPOINT,
    "last_sampler_checkpoint": None,
    "user_metadata": {"experiment": "sums-rl"},
}


class PageCursor(BaseModel):
    model_config = _wire({"offset": 0, "limit": 20, "total_count": 1})

    offset: int = Field(description="Items skipped.")
    limit: int = Field(description="Items asked for.")
    total_count: int = Field(description="Items there are.")


class RunCheckpoint(BaseModel):
    """A state a training client saved by name (`save_state`)."""

    model_config = _wire(CHECKPOINT)

    checkpoint_id: str = Field(description="`weights/<name>`: the path after the run's id.")
    checkpoint_type: Literal["training", "sampler", "external"] = Field(
        description="`training`: adapters and optimizer state (`save_state`)."
    )
    time: Timestamp = Field(description="When it was saved.")
    tinker_path: str = Field(description="`tinker://<model_id>/weights/<name>`.")
    size_bytes: int | None = Field(default=None, description="Bytes in storage.")
    public: bool = Field(
        default=False,
        description="Published: every project may read and load it (`publish_checkpoint`).",
    )
    user_metadata: dict[str, str] | None = Field(default=None, description="None set.")
    expires_at: Timestamp | None = Field(
        default=None,
        description="When it expires (`set_checkpoint_ttl`); null: kept until deleted.",
    )


class TrainingRun(BaseModel):
    """A training client (`create_lora_training_client`) as its run."""

    model_config = _wire(RUN)

    training_run_id: str = Field(description="The training client's model id.")
    base_model: str = Field(description="The registered base model it adapts.")
    model_owner: str = Field(description="The key (or SSO subject) that created it.")
    is_lora: bool = Field(description="Always true: sessions train LoRA adapters.")
    corrupted: bool = Field(default=False, description="Always false.")
    lora_rank: int | None = Field(default=None, description="Its adapters' rank.")
    last_request_time: Timestamp = Field(description="Its client's last call.")
    last_checkpoint: RunCheckpoint | None = Field(
        default=None, description="Its latest named state; null before the first `save_state`."
    )
    last_sampler_checkpoint: RunCheckpoint | None = Field(
        default=None, description="Its latest sampler weights; null (none served yet)."
    )
    user_metadata: dict[str, str] | None = Field(
        default=None, description="Its session's `user_metadata`."
    )


class TrainingRunsResponse(BaseModel):
    model_config = _wire(
        {"training_runs": [RUN], "cursor": {"offset": 0, "limit": 20, "total_count": 1}}
    )

    training_runs: list[TrainingRun] = Field(description="The project's runs, newest first.")
    cursor: PageCursor = Field(description="This page's place in the list.")


class CheckpointsListResponse(BaseModel):
    model_config = _wire({"checkpoints": [CHECKPOINT], "cursor": None})

    checkpoints: list[RunCheckpoint] = Field(
        description="Oldest first (one run), newest first (all)."
    )
    cursor: PageCursor | None = Field(
        default=None, description="This page's place (`/checkpoints`); null for one run's list."
    )


WEIGHTS_PATH_EXAMPLE = "tinker://ses_0123456789abcdef:train:0/weights/step-20"


class WeightsInfoRequest(BaseModel):
    model_config = _wire({"tinker_path": WEIGHTS_PATH_EXAMPLE})

    tinker_path: str = Field(
        max_length=400,
        pattern=r"^tinker://[^/]+/(weights|sampler_weights)/[^/]+$",
        description="`tinker://<model_id>/weights/<name>` or `.../sampler_weights/<name>`.",
    )


class WeightsInfoResponse(BaseModel):
    """What loading a saved state needs to know (`RestClient.get_weights_info_by_tinker_path`):
    the base model and the adapters' shape."""

    model_config = _wire(
        {
            "base_model": "llama-tiny",
            "is_lora": True,
            "lora_rank": 32,
            "train_unembed": False,
            "train_mlp": True,
            "train_attn": True,
        }
    )

    base_model: str = Field(description="The registered base model the adapters are on.")
    is_lora: bool = Field(description="Always true: sessions train LoRA adapters.")
    lora_rank: int | None = Field(default=None, description="The adapters' rank.")
    train_unembed: bool | None = Field(default=None, description="An adapter on the output head.")
    train_mlp: bool | None = Field(default=None, description="Adapters on the MLPs.")
    train_attn: bool | None = Field(default=None, description="Adapters on attention.")


class SetTtlRequest(BaseModel):
    model_config = _wire({"ttl_seconds": 86400})

    ttl_seconds: int | None = Field(
        ge=marks.MIN_TTL_S,
        le=marks.MAX_TTL_S,
        description="Seconds from now until the state expires (an hour to ten years); null: never.",
    )
