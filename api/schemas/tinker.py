"""Bodies of the Tinker-compatible API (`/tinker/api/v1`, `api/routes/tinker_api/`), on the wire
exactly as the official client `tinker==0.38.0` sends and reads them (docs/TINKER-WIRE.md).

Mirrored, not imported: `tinker.types` loads torch (770 modules, ~1 s), which the API never
does (tests/unit/project/test_layers.py). tests/integration/api/tinker/test_wire_types.py
round-trips the client's own types through these and back, so a drift fails there.

Requests ignore fields they do not know (a newer client may send more; the client's own
answer types do the same) but check every field they know: a bad one is a 422 at its path.
Answers may carry more than the client reads (`GetSessionResponse`'s Torchyard fields): its
types ignore extra fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api import openapi_examples
from api.schemas import PRINTABLE, Timestamp

PREFIX = "/tinker/api/v1"  # the client's paths under its `base_url` `<api>/tinker`
Tag = Annotated[str, StringConstraints(max_length=100, pattern=r"^[^\x00]*$")]
MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=PRINTABLE)]
MetaValue = Annotated[str, StringConstraints(max_length=1000, pattern=r"^[^\x00]*$")]
SessionId = Annotated[str, StringConstraints(min_length=1, max_length=40, pattern=PRINTABLE)]


def _key_pattern_in_property_names(schema: dict[str, Any]) -> None:
    """A dict field whose keys have a pattern: pydantic states it as `patternProperties`, which
    leaves any other key allowed by the schema (and refused by the model); as `propertyNames`
    with the values under `additionalProperties`, the schema says what the model accepts."""
    for branch in schema.get("anyOf", [schema]):
        patterns = branch.pop("patternProperties", None)
        if patterns:
            ((pattern, values),) = patterns.items()
            branch["propertyNames"] = {**branch.get("propertyNames", {}), "pattern": pattern}
            branch["additionalProperties"] = values


def _wire(*examples: dict[str, Any]) -> ConfigDict:
    return openapi_examples.config(*examples, extra="ignore")


class HealthResponse(BaseModel):
    model_config = _wire({"status": "ok"})

    status: Literal["ok"] = Field(default="ok", description="The API process is up.")


class ClientConfigRequest(BaseModel):
    model_config = _wire({"sdk_version": "0.38.0"})

    sdk_version: str = Field(
        max_length=40, pattern=PRINTABLE, description="The client's version (`tinker.__version__`)."
    )


class ClientConfigResponse(BaseModel):
    """The client's feature flags, as this server answers them to every client: the plain
    httpx transport, the key sent as it is (no JWT exchange), uncompressed protobuf, and none
    of the optional routes. Flags the client has and this leaves out keep its defaults."""

    model_config = _wire(
        {
            "pjwt_auth_enabled": False,
            "use_pyqwest_transport": False,
            "proto_compress_fwdbwd": False,
            "sample_use_retrieve_futures": False,
            "sample_join_sampling_session": False,
            "custom_loss_server_side": False,
        }
    )

    pjwt_auth_enabled: bool = Field(
        default=False,
        description="False: the client sends its key (`X-API-Key`) on every request; no "
        "`/auth/token` exchange.",
    )
    use_pyqwest_transport: bool = Field(
        default=False, description="False: the client uses httpx's own transport."
    )
    proto_compress_fwdbwd: bool = Field(
        default=False,
        description="False: `forward_backward` bodies come uncompressed, so the API's body "
        "limit bounds what it decodes (no zstd decompression to guard).",
    )
    sample_use_retrieve_futures: bool = Field(
        default=False, description="False: no `/retrieve_futures` batch polling."
    )
    sample_join_sampling_session: bool = Field(
        default=False, description="False: no `/join_sampling_session`."
    )
    custom_loss_server_side: bool = Field(
        default=False, description="False: custom losses run in the client."
    )


class ClientDynamicConfigResponse(BaseModel):
    model_config = _wire(
        {
            "refresh_interval_sec": 300,
            "sample_cancel_enabled": False,
            "sample_cancel_max_batch_size": 64,
        }
    )

    refresh_interval_sec: int = Field(
        default=300, description="How often the client asks again (seconds)."
    )
    sample_cancel_enabled: bool = Field(
        default=False, description="False: the client sends no `/cancel_future`."
    )
    sample_cancel_max_batch_size: int = Field(
        default=64, description="Cancellations the client sends at once (unused while disabled)."
    )


class SupportedModel(BaseModel):
    model_config = _wire(
        {
            "model_name": "tiny-llama",
            "max_context_length": 512,
            "trainable": False,
            "sampleable": False,
        }
    )

    model_name: str = Field(description="A registered base model (`TORCHYARD_BASE_MODELS`).")
    max_context_length: int = Field(
        description="The longest datum a session of it takes: the entry's `seq_len` (tokens)."
    )
    trainable: bool = Field(description="Whether `create_model` can train it here yet.")
    sampleable: bool = Field(description="Whether it can be sampled here yet.")


class GetServerCapabilitiesResponse(BaseModel):
    model_config = _wire(
        {
            "supported_models": [
                {
                    "model_name": "tiny-llama",
                    "max_context_length": 512,
                    "trainable": False,
                    "sampleable": False,
                }
            ]
        }
    )

    supported_models: list[SupportedModel] = Field(
        description="The deployment's registered base models, by name."
    )


class CreateSessionRequest(BaseModel):
    model_config = _wire(
        {
            "tags": ["grpo", "sums"],
            "user_metadata": {"experiment": "sums-rl"},
            "sdk_version": "0.38.0",
            "type": "create_session",
        }
    )

    tags: list[Tag] = Field(max_length=100, description="The client's tags (`TINKER_TAGS`).")
    user_metadata: dict[MetaKey, MetaValue] | None = Field(
        default=None,
        max_length=64,
        description="The client's metadata (`ServiceClient(user_metadata=...)`), strings only.",
        json_schema_extra=_key_pattern_in_property_names,
    )
    sdk_version: str = Field(max_length=40, pattern=PRINTABLE, description="The client's version.")
    project_id: str | None = Field(
        default=None,
        max_length=100,
        description="A project the client names: null, or the key's own project (its id or "
        "name); a key acts in its own project only.",
    )
    display_name: str | None = Field(
        default=None, max_length=200, pattern=r"^[^\x00]*$", description="A name to show."
    )
    type: Literal["create_session"] = Field(
        default="create_session", description="The request's kind."
    )


class CreateSessionResponse(BaseModel):
    model_config = _wire({"type": "create_session", "session_id": "ses_4f1c2a9e0b7d6c3a"})

    type: Literal["create_session"] = Field(
        default="create_session", description="The answer's kind."
    )
    session_id: str = Field(description="The new session's id.")
    info_message: str | None = Field(
        default=None, description="Logged by the client at INFO level."
    )
    warning_message: str | None = Field(
        default=None, description="Logged by the client as a warning: what is not served yet."
    )


class SessionHeartbeatRequest(BaseModel):
    model_config = _wire({"session_id": "ses_4f1c2a9e0b7d6c3a", "type": "session_heartbeat"})

    session_id: SessionId = Field(description="The session the client keeps alive.")
    type: Literal["session_heartbeat"] = Field(
        default="session_heartbeat", description="The request's kind."
    )


class SessionHeartbeatResponse(BaseModel):
    model_config = _wire({"type": "session_heartbeat"})

    type: Literal["session_heartbeat"] = Field(
        default="session_heartbeat", description="The answer's kind."
    )


class ListSessionsResponse(BaseModel):
    model_config = _wire({"sessions": ["ses_4f1c2a9e0b7d6c3a"]})

    sessions: list[str] = Field(description="Session ids of the project, newest first.")


class GetSessionResponse(BaseModel):
    """A session as the client reads it (`training_run_ids`, `sampler_ids`, `user_metadata`,
    `display_name`) and, beyond what it reads, as Torchyard keeps it."""

    model_config = _wire(
        {
            "training_run_ids": ["ses_4f1c2a9e0b7d6c3a:train:0"],
            "sampler_ids": ["req_0123456789abcdef"],
            "user_metadata": {"experiment": "sums-rl"},
            "display_name": None,
            "session_id": "ses_4f1c2a9e0b7d6c3a",
            "state": "active",
            "tags": ["grpo", "sums"],
            "sdk_version": "0.38.0",
            "owner": "default",
            "created_at": "2026-11-30T10:00:00Z",
            "last_heartbeat_at": "2026-11-30T10:04:50Z",
            "ended_at": None,
            "ended_reason": None,
        }
    )

    training_run_ids: list[str] = Field(
        description="Its training clients' model ids, in the order its client made them."
    )
    sampler_ids: list[str] = Field(description="Its sampling sessions' ids, oldest first.")
    user_metadata: dict[str, str] | None = Field(description="The client's metadata.")
    display_name: str | None = Field(description="The client's display name.")
    session_id: str = Field(description="The session's id.")
    state: Literal["active", "ended"] = Field(
        description="`active` while its client heartbeats; `ended` once silent past "
        "`TORCHYARD_SESSION_IDLE_TIMEOUT_S` (final)."
    )
    tags: list[str] = Field(description="The client's tags, sorted.")
    sdk_version: str = Field(description="The client's version.")
    owner: str | None = Field(description="The key (or SSO subject) that created it.")
    created_at: Timestamp = Field(description="When it was created.")
    last_heartbeat_at: Timestamp = Field(description="Its client's last heartbeat.")
    ended_at: Timestamp | None = Field(description="When it ended; null while active.")
    ended_reason: str | None = Field(description="Why it ended; null while active.")


class FinishReason(BaseModel):
    model_config = _wire({"type": "success"})

    type: Literal["success", "errored", "interrupted"] = Field(
        description="How the client's work ended: its `with` block left normally, by an "
        "exception, or by an interrupt."
    )


class FinishSessionRequest(BaseModel):
    model_config = _wire({"reason": {"type": "success"}, "detail": "training complete"})

    reason: FinishReason = Field(description="How the client ended.")
    detail: str | None = Field(
        default=None, max_length=2000, pattern=r"^[^\x00]*$", description="The client's words."
    )


ModelId = Annotated[str, StringConstraints(min_length=1, max_length=80, pattern=PRINTABLE)]
RequestId = Annotated[str, StringConstraints(min_length=1, max_length=40, pattern=PRINTABLE)]
SESSION_EXAMPLE = "ses_4f1c2a9e0b7d6c3a"
MODEL_EXAMPLE = f"{SESSION_EXAMPLE}:train:0"


class LoraConfig(BaseModel):
    model_config = _wire({"rank": 16, "seed": 0, "train_mlp": True})

    rank: int = Field(ge=1, le=4096, description="Rank of each adapter.")
    seed: int | None = Field(
        default=None, ge=0, le=2**53, description="Seed of the adapters' init; null: 0."
    )
    train_unembed: bool = Field(default=True, description="An adapter on the output head.")
    train_mlp: bool = Field(default=True, description="Adapters on the MLP layers.")
    train_attn: bool = Field(default=True, description="Adapters on attention.")


class OptimizerConfig(BaseModel):
    model_config = _wire({"type": "adamw"})

    type: Literal["adamw", "adam"] = Field(
        default="adamw", description="The optimizer fixed for the model's life: Adam(W)."
    )


class CreateModelRequest(BaseModel):
    model_config = _wire(
        {
            "session_id": SESSION_EXAMPLE,
            "model_seq_id": 0,
            "base_model": "llama-tiny",
            "lora_config": {"rank": 16, "seed": 0},
            "type": "create_model",
        }
    )
    model_config["protected_namespaces"] = ()

    session_id: SessionId = Field(description="The session the training client belongs to.")
    model_seq_id: int = Field(ge=0, le=10**6, description="The client's count of its models.")
    base_model: str = Field(
        min_length=1, max_length=200, description="A registered base model's name."
    )
    user_metadata: dict[str, Any] | None = Field(
        default=None, description="The client's metadata of the training run (not kept yet)."
    )
    lora_config: LoraConfig | None = Field(
        default=None, description="The LoRA adapters; null: rank 32, every target."
    )
    optimizer_config: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="Adam(W), the only one served."
    )
    type: Literal["create_model"] = Field(default="create_model", description="The kind.")


class UntypedAPIFuture(BaseModel):
    """A call's receipt: poll `retrieve_future` with `request_id` for its answer."""

    model_config = _wire({"request_id": "req_9d2e4b7a1c0f3e58", "model_id": MODEL_EXAMPLE})
    model_config["protected_namespaces"] = ()

    request_id: str = Field(description="The call's id.")
    model_id: str | None = Field(default=None, description="The training client it is for.")


class GetInfoRequest(BaseModel):
    model_config = _wire({"model_id": MODEL_EXAMPLE, "type": "get_info"})
    model_config["protected_namespaces"] = ()

    model_id: ModelId = Field(description="A training client of the project.")
    type: Literal["get_info"] = Field(default="get_info", description="The kind.")


class ModelData(BaseModel):
    model_config = _wire({"arch": "lora", "model_name": "llama-tiny"})
    model_config["protected_namespaces"] = ()

    arch: str | None = Field(default=None, description="`lora`.")
    model_name: str | None = Field(default=None, description="The base model.")
    tokenizer_id: str | None = Field(
        default=None, description="Where the base model's tokenizer lies (its directory)."
    )


class GetInfoResponse(BaseModel):
    model_config = _wire({"model_id": MODEL_EXAMPLE, "model_data": {}, "is_lora": True})
    model_config["protected_namespaces"] = ()

    type: Literal["get_info"] = Field(default="get_info", description="The kind.")
    model_data: ModelData = Field(description="The model's architecture and base.")
    model_id: str = Field(description="The training client.")
    optimizer_config: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="Adam(W)."
    )
    is_lora: bool | None = Field(default=None, description="Always true here.")
    lora_rank: int | None = Field(default=None, description="Its adapters' rank.")
    model_name: str | None = Field(default=None, description="The base model.")


class RetrieveFutureRequest(BaseModel):
    model_config = _wire({"request_id": "req_9d2e4b7a1c0f3e58", "allow_metadata_only": False})

    request_id: RequestId = Field(description="A call's id (its `UntypedAPIFuture`).")
    allow_metadata_only: bool = Field(
        default=False, description="Ignored: every answer is sent whole."
    )


class TryAgainResponse(BaseModel):
    """Not answered yet: poll again (`queue_state` says why it waits)."""

    model_config = _wire(
        {"type": "try_again", "request_id": "req_9d2e4b7a1c0f3e58", "queue_state": "active"}
    )

    type: Literal["try_again"] = Field(default="try_again", description="The kind.")
    request_id: str = Field(description="The call polled for.")
    queue_state: Literal["active", "paused_capacity", "paused_rate_limit"] = Field(
        description="`active`: its session job runs; `paused_capacity`: it waits for devices."
    )
    queue_state_reason: str | None = Field(default=None, description="Why, in words.")


class RequestFailedResponse(BaseModel):
    """A call that failed: final (`tinker.RequestFailedError`)."""

    model_config = _wire({"error": "session ended", "category": "user"})

    error: str = Field(description="What went wrong.")
    category: Literal["unknown", "server", "user"] = Field(description="Whose fault.")


class AdamParams(BaseModel):
    """One `optim_step`'s AdamW hyperparameters (the client's defaults)."""

    model_config = _wire({"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12})

    learning_rate: float = Field(default=1e-4, ge=0, le=1e3, description="The step's lr.")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="First-moment decay.")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="Second-moment decay.")
    eps: float = Field(default=1e-12, ge=0, le=1, description="Added to the denominator.")
    weight_decay: float = Field(
        default=0.0, ge=0, le=1e3, description="Decoupled weight decay (AdamW)."
    )
    grad_clip_norm: float = Field(
        default=0.0, ge=0, le=1e9, description="Clip the global gradient norm to this; 0: none."
    )


class OptimStepRequest(BaseModel):
    model_config = _wire(
        {
            "model_id": MODEL_EXAMPLE,
            "seq_id": 2,
            "adam_params": {"learning_rate": 1e-4},
            "type": "optim_step",
        }
    )
    model_config["protected_namespaces"] = ()

    model_id: ModelId = Field(description="A training client of the project.")
    seq_id: int = Field(ge=0, le=2**31 - 1, description="Its place in the client's calls.")
    adam_params: AdamParams = Field(description="The step's AdamW hyperparameters.")
    type: Literal["optim_step"] = Field(default="optim_step", description="The kind.")
