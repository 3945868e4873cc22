"""Example bodies of the OpenAI-compatible view (`/openai/v1`), in OpenAI's documented shapes
(core/openai/projection.py builds them). Fine-tuning job 1051 trains LoRA SFT of the base model
`llama-3.2-1b` on the chat dataset of api/openapi_examples.py; it succeeded, so its model is listed.
"""

from __future__ import annotations

from typing import Any

from api.openapi_examples import CHAT_DATASET_ID, DATASET, DATASET_UPLOAD, PROJECT_ID

BASE_MODEL = "llama-3.2-1b"
FT_JOB_ID = "ftjob-1051"
FINE_TUNED_MODEL = f"ft:{BASE_MODEL}:{PROJECT_ID}:support:1051"
FINISHED_AT = 1795611722

BASE_MODEL_OBJECT: dict[str, Any] = {
    "id": BASE_MODEL,
    "object": "model",
    "created": 0,
    "owned_by": "torchyard",
}
MODEL_LIST: dict[str, Any] = {
    "object": "list",
    "data": [
        BASE_MODEL_OBJECT,
        {"id": FINE_TUNED_MODEL, "object": "model", "created": FINISHED_AT, "owned_by": PROJECT_ID},
    ],
}

FILE_UPLOAD: dict[str, Any] = {"purpose": "fine-tune", "file": DATASET_UPLOAD["file"]}
FILE: dict[str, Any] = {
    "id": CHAT_DATASET_ID,
    "object": "file",
    "bytes": DATASET["size_bytes"],
    "created_at": 1795537245,
    "filename": DATASET["name"],
    "purpose": "fine-tune",
    "status": "processed",
    "expires_at": None,
    "status_details": None,
}
FILE_LIST: dict[str, Any] = {
    "object": "list",
    "data": [FILE],
    "first_id": FILE["id"],
    "last_id": FILE["id"],
    "has_more": False,
}
FILE_DELETED: dict[str, Any] = {"id": CHAT_DATASET_ID, "object": "file", "deleted": True}
# `GET /openai/v1/files/{id}/content`: an upload's bytes, or a result file's CSV.
FILE_CONTENT_JSONL = DATASET_UPLOAD["file"]
RESULT_CSV = (
    "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy\n"
    "100,1.4131,,1.5022,\n200,1.1876,,1.3415,\n"
)

FINE_TUNE_CREATE: dict[str, Any] = {
    "model": BASE_MODEL,
    "training_file": CHAT_DATASET_ID,
    "suffix": "support",
    "seed": 7,
    "metadata": {"ticket": "ML-412"},
    "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3}}},
}
# Reinforcement fine-tuning (GRPO) on a file of OpenAI's RFT records
# (`{"messages": [{"role": "user", ...}], "reference_answer": ...}`), scored by exact match.
FINE_TUNE_CREATE_REINFORCEMENT: dict[str, Any] = {
    "model": BASE_MODEL,
    "training_file": "ds_7Ykq2mWc",
    "suffix": "arith",
    "method": {
        "type": "reinforcement",
        "reinforcement": {
            "grader": {
                "type": "string_check",
                "name": "exact",
                "input": "{{ sample.output_text | trim }}",
                "reference": "{{ item.reference_answer }}",
                "operation": "eq",
            },
            "hyperparameters": {"n_epochs": 2, "batch_size": 8, "compute_multiplier": 1.0},
        },
    },
}
_HYPERPARAMETERS = {"n_epochs": 3, "batch_size": 8, "learning_rate_multiplier": 1.0}
FINE_TUNING_JOB: dict[str, Any] = {
    "id": FT_JOB_ID,
    "object": "fine_tuning.job",
    "created_at": 1795609380,
    "finished_at": FINISHED_AT,
    "model": BASE_MODEL,
    "fine_tuned_model": FINE_TUNED_MODEL,
    "organization_id": PROJECT_ID,
    "status": "succeeded",
    "training_file": CHAT_DATASET_ID,
    "validation_file": None,
    "result_files": ["file-result-1051"],
    "trained_tokens": 1843200,
    "estimated_finish": None,
    "error": None,
    "seed": 7,
    "hyperparameters": _HYPERPARAMETERS,
    "method": {"type": "supervised", "supervised": {"hyperparameters": _HYPERPARAMETERS}},
    "metadata": {"ticket": "ML-412"},
    "integrations": None,
    "user_provided_suffix": "support",
}
FINE_TUNING_JOB_LIST: dict[str, Any] = {
    "object": "list",
    "data": [FINE_TUNING_JOB],
    "has_more": False,
}
FINE_TUNING_EVENTS: dict[str, Any] = {
    "object": "list",
    "data": [
        {
            "id": "ftevent-90233",
            "object": "fine_tuning.job.event",
            "created_at": FINISHED_AT,
            "level": "info",
            "message": "succeeded",
            "data": {"kind": "state"},
            "type": "message",
        }
    ],
    "has_more": True,
}
FINE_TUNING_CHECKPOINTS: dict[str, Any] = {
    "object": "list",
    "data": [
        {
            "id": "ftckpt-530",
            "object": "fine_tuning.job.checkpoint",
            "created_at": 1795611650,
            "fine_tuned_model_checkpoint": f"{FINE_TUNED_MODEL}:ckpt-step-200",
            "fine_tuning_job_id": FT_JOB_ID,
            "metrics": {
                "step": 200.0,
                "train_loss": 1.1876,
                "valid_loss": 1.3415,
                "full_valid_loss": 1.3415,
            },
            "step_number": 200,
        }
    ],
    "has_more": False,
    "first_id": "ftckpt-530",
    "last_id": "ftckpt-530",
}
