"""Bodies of the Tinker-compatible API's sampling calls (`api/routes/tinker_sampling.py`), on
the wire as the official client `tinker==0.38.0` sends and reads them (docs/TINKER-WIRE.md,
`types/save_weights_for_sampler_request.py`, `create_sampling_session_request.py`,
`sample_request.py`, `_pydantic_types/sampling_params.py`, `get_sampler_response.py`).
Mirrored, not imported, for the reasons `api.schemas.tinker` gives; checked against the
client's own types in tests/integration/api/tinker/test_wire_types.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints

from api.schemas.tinker import (
    MODEL_EXAMPLE,
    SESSION_EXAMPLE,
    ModelId,
    SessionId,
    _wire,
)
from api.schemas.tinker_weights import CheckpointName

SAMPLER_EXAMPLE = "req_5b8e2d4f6a0c1e37"
SAMPLER_PATH_EXAMPLE = f"tinker://{MODEL_EXAMPLE}/sampler_weights/step-20"
SamplerId = Annotated[
    str, StringConstraints(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_:-]+$")
]
TOKEN = Annotated[int, Field(ge=0, le=2**31 - 1)]
MAX_PROMPT_TOKENS = 1_000_000
MAX_SAMPLES = 256


class SaveWeightsForSamplerRequest(BaseModel):
    model_config = _wire(
        {
            "model_id": MODEL_EXAMPLE,
            "path": "step-20",
            "seq_id": 41,
            "type": "save_weights_for_sampler",
        },
        {
            "model_id": MODEL_EXAMPLE,
            "sampling_session_seq_id": 0,
            "kind": "snapshot",
            "seq_id": 41,
            "type": "save_weights_for_sampler",
        },
    )
    model_config["protected_namespaces"] = ()

    model_id: ModelId = Field(description="A training client of the project.")
    path: CheckpointName | None = Field(
        default=None,
        description="The weights' name (answered `tinker://<model_id>/sampler_weights/<name>`);"
        " null: unnamed, answered a sampling session of them "
        "(`save_weights_and_get_sampling_client`).",
    )
    sampling_session_seq_id: int | None = Field(
        default=None, ge=0, le=10**9, description="The client's count of its sampling clients."
    )
    kind: Literal["snapshot"] = Field(
        default="snapshot",
        description="`snapshot`: the weights as they are now (`inflight` is not served).",
    )
    seq_id: int = Field(ge=0, le=2**31 - 1, description="Its place in the client's calls.")
    ttl_seconds: int | None = Field(default=None, ge=0, description="Ignored.")
    user_metadata: dict[str, str] | None = Field(default=None, description="Not kept yet.")
    type: Literal["save_weights_for_sampler"] = Field(
        default="save_weights_for_sampler", description="The kind."
    )


class CreateSamplingSessionRequest(BaseModel):
    model_config = _wire(
        {
            "session_id": SESSION_EXAMPLE,
            "sampling_session_seq_id": 0,
            "model_path": SAMPLER_PATH_EXAMPLE,
            "type": "create_sampling_session",
        }
    )
    model_config["protected_namespaces"] = ()

    session_id: SessionId = Field(description="The session the sampling client belongs to.")
    sampling_session_seq_id: int = Field(
        ge=0, le=10**9, description="The client's count of its sampling clients."
    )
    base_model: str | None = Field(
        default=None, max_length=200, description="Ignored: the path's training client says it."
    )
    model_path: str = Field(
        max_length=400,
        pattern=r"^tinker://[^/]+/sampler_weights/[^/]+$",
        description="Weights saved by `save_weights_for_sampler`, "
        "`tinker://<model_id>/sampler_weights/<name>` (sampling a bare base model is not "
        "served: without a path, a 422 here).",
    )
    type: Literal["create_sampling_session"] = Field(
        default="create_sampling_session", description="The kind."
    )


class CreateSamplingSessionResponse(BaseModel):
    model_config = _wire(
        {"sampling_session_id": SAMPLER_EXAMPLE, "type": "create_sampling_session"}
    )

    sampling_session_id: str = Field(description="The sampling client's id.")
    type: Literal["create_sampling_session"] = Field(
        default="create_sampling_session", description="The kind."
    )


class EncodedTextChunk(BaseModel):
    model_config = _wire({"type": "encoded_text", "tokens": [1, 2, 3]})

    tokens: list[TOKEN] = Field(max_length=MAX_PROMPT_TOKENS, description="Token ids.")
    type: Literal["encoded_text"] = Field(
        default="encoded_text", description="Text chunks only (no images)."
    )


class ModelInput(BaseModel):
    model_config = _wire({"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]})

    chunks: list[EncodedTextChunk] = Field(
        min_length=1, max_length=10_000, description="The prompt's chunks, concatenated."
    )


class SamplingParams(BaseModel):
    model_config = _wire({"max_tokens": 16, "temperature": 1.0, "seed": 3, "stop": ["\n"]})

    max_tokens: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Most tokens sampled; null: to seq_len."
    )
    seed: int | None = Field(
        default=None, ge=0, le=2**53, description="Seed of the sampler; null: a random one."
    )
    stop: (
        Annotated[str, StringConstraints(min_length=1, max_length=1000)]
        | list[Annotated[str, StringConstraints(min_length=1, max_length=1000)]]
        | list[TOKEN]
        | None
    ) = Field(
        default=None,
        description="Stop at a string, any of strings or any of token ids (kept in the "
        "sample); null: the model's EOS; []: none.",
    )
    temperature: float = Field(default=1.0, ge=0.0, le=100.0, description="0: greedy.")
    top_k: int = Field(default=-1, ge=-1, description="-1: no limit.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus mass.")


class SampleRequest(BaseModel):
    model_config = _wire(
        {
            "sampling_session_id": SAMPLER_EXAMPLE,
            "seq_id": 0,
            "num_samples": 4,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
            "sampling_params": {"max_tokens": 16, "temperature": 1.0, "seed": 3},
            "prompt_logprobs": True,
            "type": "sample",
        }
    )
    model_config["protected_namespaces"] = ()

    sampling_session_id: SamplerId = Field(description="A sampling client of the project.")
    seq_id: int | None = Field(
        default=None, ge=0, le=2**53, description="The sampling client's count of calls."
    )
    num_samples: int = Field(default=1, ge=1, le=MAX_SAMPLES, description="Completions.")
    prompt: ModelInput = Field(description="The prompt.")
    sampling_params: SamplingParams = Field(description="How to sample.")
    prompt_logprobs: bool | None = Field(
        default=None, description="Also the prompt's log-probabilities."
    )
    topk_prompt_logprobs: Literal[0] = Field(default=0, description="Not served: 0.")
    topk_sample_logprobs: Literal[0] = Field(default=0, description="Not served: 0.")
    prompt_alt_tokens_k: Literal[0] = Field(default=0, description="Not served: 0.")
    target_prompt_logprobs: None = Field(default=None, description="Not served.")
    prompt_logprobs_last_n: None = Field(default=None, description="Not served.")
    type: Literal["sample"] = Field(default="sample", description="The kind.")


class SampleFuture(BaseModel):
    """A `sample` call's receipt: its answer via `retrieve_future`, one id per sample."""

    model_config = _wire(
        {
            "request_id": "req_9d2e4b7a1c0f3e58",
            "sample_sequence_ids": ["req_9d2e4b7a1c0f3e58:0", "req_9d2e4b7a1c0f3e58:1"],
        }
    )

    request_id: str = Field(description="The call's id.")
    sample_sequence_ids: list[str] = Field(description="An id per sample, in its order.")


class GetSamplerResponse(BaseModel):
    model_config = _wire(
        {
            "sampler_id": SAMPLER_EXAMPLE,
            "base_model": "llama-tiny",
            "model_path": SAMPLER_PATH_EXAMPLE,
        }
    )
    model_config["protected_namespaces"] = ()

    sampler_id: str = Field(description="The sampling client's id.")
    base_model: str = Field(description="The base model it samples.")
    model_path: str | None = Field(default=None, description="The weights it samples.")
