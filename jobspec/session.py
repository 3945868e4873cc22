"""The `session` section of a session job (`jobspec.job.SessionJobSpec`, issue 47): which
training client of a Tinker-compatible session the job serves, and the LoRA adapters the
client asked for (`create_model`'s `lora_config`). The job's program (`trainer.session`) loads
`model` and serves the client's calls one at a time; nobody writes this section by hand: the
Tinker API's `create_model` builds it (`core.sessions.training_clients`).
"""

from __future__ import annotations

from typing import Final

from pydantic import Field

from jobspec.base import StrictSpec

NAMES_FILE: Final = "tinker_names.json"
"""In a session job's checkpoint directory: `{name: step}` of the states its client saved by name
(`save_state`), written by its program (`trainer.session_calls`), read by the worker's relay
for a `load_weights` and by the API's training-run reads (`core.sessions.runs`)."""

LORA_ALPHA: Final = 32.0
"""The adapters' alpha: Tinker's API has no alpha, and its documentation fixes it at 32 for
every rank ("LoRA Without Regret"), so the update is (32 / rank) B A x."""


class SessionSpec(StrictSpec):
    """One training client of a session: its ids, its registered base model and its LoRA."""

    session_id: str = Field(max_length=40, description="The session (`ses_...`).")
    model_id: str = Field(
        max_length=80, description="The training client's id, `<session_id>:train:<seq>`."
    )
    base_model: str = Field(
        max_length=200, description="The registered base model (`TORCHYARD_BASE_MODELS`)."
    )
    lora_rank: int = Field(ge=1, le=4096, description="Rank of each adapter.")
    lora_seed: int | None = Field(
        default=None,
        ge=0,
        le=2**53,
        description="Seed of the adapters' initialization; null: the job's `seed`.",
    )
    train_mlp: bool = Field(default=True, description="Adapters on the MLP's linear layers.")
    train_attn: bool = Field(default=True, description="Adapters on attention's projections.")
    train_unembed: bool = Field(default=True, description="An adapter on the output head.")
