"""Bodies of `/v1/jobs/{job_id}/lora/{kind}` (`api/routes/lora_exports.py`): a LoRA run's
adapter or merged model, written at its end, and its files."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api import openapi_examples
from api.schemas import ServerUri

_LORA_EXAMPLE: dict[str, Any] = {
    "job_id": 42,
    "kind": "adapter",
    "step": 600,
    "uri": "jobs/42/checkpoints/lora/step_00000600/adapter",
    "server_uri": None,
    "files": [
        {"name": "adapter_config.json", "size_bytes": 812},
        {"name": "adapter_model.safetensors", "size_bytes": 1572952},
    ],
}


class LoraFile(BaseModel):
    name: str = Field(description="The file's name in the directory.")
    size_bytes: int = Field(description="Its size in bytes.")


class LoraExport(BaseModel):
    """What a LoRA/QLoRA run wrote at its end: its PEFT adapter (`adapter`: load it with
    `peft.PeftModel.from_pretrained(base, DIR)`) or its base with the adapters merged in
    (`merged`: a `transformers` model directory). Download each file from `.../files/{name}`."""

    job_id: int = Field(description="The job that wrote it.")
    kind: Literal["adapter", "merged"] = Field(description="`adapter` or `merged`.")
    step: int = Field(description="The training step it is of (the run's last).")
    uri: str = Field(description="Its directory, relative to the server's storage.")
    server_uri: ServerUri = None
    files: list[LoraFile] = Field(description="Its files, by name.")


class LoraExports(BaseModel):
    """A job's LoRA exports: each null until a LoRA/QLoRA run writes it at its end (a run of
    another kind writes none)."""

    model_config = openapi_examples.config({"adapter": _LORA_EXAMPLE, "merged": None})

    adapter: LoraExport | None = Field(description="The PEFT adapter directory.")
    merged: LoraExport | None = Field(description="The base model with the adapter merged in.")
