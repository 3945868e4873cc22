"""Bodies of the Tinker-compatible API's save and load calls (`save_weights`, `load_weights`,
`api/routes/tinker_api/calls.py`), on the wire as the official client `tinker==0.38.0` sends them
(docs/TINKER-WIRE.md, `types/save_weights_request.py`, `load_weights_request.py`). Mirrored,
not imported, for the reasons `api.schemas.tinker` gives; checked against the client's own
types in tests/integration/api/tinker/test_wire_types.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from api.schemas.tinker import (
    MODEL_EXAMPLE,
    ModelId,
    OptimizerConfig,
    SessionId,
    _wire,
)

CheckpointName = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
TINKER_PATH_EXAMPLE = f"tinker://{MODEL_EXAMPLE}/weights/step-20"


class SaveWeightsRequest(BaseModel):
    model_config = _wire(
        {"model_id": MODEL_EXAMPLE, "path": "step-20", "seq_id": 41, "type": "save_weights"}
    )
    model_config["protected_namespaces"] = ()

    model_id: ModelId = Field(description="A training client of the project.")
    path: CheckpointName | None = Field(
        default=None, description="The state's name; null: `seq-<seq_id>`."
    )
    seq_id: int = Field(ge=0, le=2**31 - 1, description="Its place in the client's calls.")
    ttl_seconds: int | None = Field(default=None, ge=0, description="Ignored: kept until deleted.")
    overwrite: bool = Field(default=False, description="Replace a state of the same name.")
    user_metadata: dict[str, str] | None = Field(default=None, description="Not kept yet.")
    type: Literal["save_weights"] = Field(default="save_weights", description="The kind.")


class LoadWeightsRequest(BaseModel):
    """A load into a training client (`model_id` and `seq_id`), or a new training client made
    by the load (create-via-load: `session_id` and `model_seq_id`; the load is its seq 0)."""

    model_config = _wire(
        {
            "model_id": MODEL_EXAMPLE,
            "seq_id": 42,
            "path": TINKER_PATH_EXAMPLE,
            "optimizer": True,
            "type": "load_weights",
        }
    )
    model_config["protected_namespaces"] = ()

    model_id: ModelId | None = Field(
        default=None, description="The training client that loads; with `seq_id`."
    )
    seq_id: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="Its place in the client's calls."
    )
    session_id: SessionId | None = Field(
        default=None,
        description="Create-via-load: the session of the new training client the load makes "
        "(its LoRA is the saved state's); with `model_seq_id`, instead of `model_id`.",
    )
    model_seq_id: int | None = Field(
        default=None, ge=0, le=10**6, description="Create-via-load: the client's count of models."
    )
    base_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Create-via-load: another registered name of the saved state's base model "
        "(the same weights); null: the state's own.",
    )
    user_metadata: dict[str, Any] | None = Field(default=None, description="Not kept yet.")
    path: str = Field(
        max_length=400,
        pattern=r"^tinker://[^/]+/weights/[^/]+$",
        description="A saved state, `tinker://<model_id>/weights/<name>`.",
    )
    optimizer: bool = Field(description="Load the optimizer's state too (else a fresh one).")
    optimizer_config: OptimizerConfig | None = Field(
        default=None, description="Create-via-load without the optimizer's state: Adam(W)."
    )
    weights_access_token: str | None = Field(
        default=None, max_length=2000, description="Not needed: a key reads its project's states."
    )
    type: Literal["load_weights"] = Field(default="load_weights", description="The kind.")

    @model_validator(mode="after")
    def _one_addressing(self) -> LoadWeightsRequest:
        into = (self.model_id is not None, self.seq_id is not None)
        create = (self.session_id is not None, self.model_seq_id is not None)
        if {into, create} != {(True, True), (False, False)}:
            raise PydanticCustomError(  # a rule between fields, which no schema states
                "load_addressing",
                "address a load by model_id and seq_id (into a training client) or by "
                "session_id and model_seq_id (a new one), not both or neither",
            )
        return self
