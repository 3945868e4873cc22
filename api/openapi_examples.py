"""Example bodies of the REST API, shown in `/docs` and `/redoc` and sent by the schema fuzzer.

Each shape's example is written once and referenced by the models (`model_config =
examples.config(...)`) and routes (`openapi_examples`, `responses`) that use it: a list or page
reuses its item's example, and the job in `JOB` carries `JOB_SPEC` as the API shows it. The
examples tell one story: job 1043 of project `prj_8a1d3f5c7e9b2d40` trains a small GPT on the
Python corpus `ds_4f1c2a9e0b7d3c55`; `ds_0b7d3c554f1c2a9e` is an uploaded chat dataset. The
access and webhook bodies keep theirs next to their models (api/schemas/access.py,
api/schemas/webhooks.py). tests/integration/api/contract/test_api_examples.py checks that every
operation has its examples and that each is valid against its schema.
"""

from __future__ import annotations

import json
from typing import Any, Unpack

from fastapi import FastAPI
from pydantic import ConfigDict

from core.attempts.retry_budget import retry_policy
from jobspec.job import JobSpec

PROJECT_ID = "prj_8a1d3f5c7e9b2d40"
DATASET_ID = "ds_4f1c2a9e0b7d3c55"
CHAT_DATASET_ID = "ds_0b7d3c554f1c2a9e"
CODE_ID = "code_5e2b8c1d9f3a7e60"
JOB_ID = 1043
SHA256 = "9b1f0c3e5a7d2b4f6e8c0a1d3f5b7e9c2a4d6f8b0e1c3a5d7f9b2e4c6a8d0f1e"

JOB_SPEC: dict[str, Any] = {
    "name": "gpt-small-code",
    "labels": {"team": "nlp"},
    "model": {"kind": "gpt", "n_layers": 6, "n_heads": 8, "d_model": 512, "seq_len": 1024},
    "data": {"dataset": DATASET_ID, "include": ["**/*.py"]},
    "optim": {"lr": 0.0006, "warmup_steps": 200},
    "train": {"micro_batch_size": 8, "grad_accum_steps": 4, "max_steps": 5000},
    "eval": {"interval_steps": 500},
    "checkpoint": {"interval_steps": 1000},
    "resources": {"nodes": 1, "procs_per_node": 2, "device": "cuda", "pool": "a100"},
    "retries": {"max_restarts": 2},
}
SCRIPT_JOB_SPEC: dict[str, Any] = {
    "name": "resnet-ddp",
    "entrypoint": {
        "code": CODE_ID,
        "command": ["python", "train.py", "--epochs", "10", "--lr", "0.1"],
        "env": {"WANDB_MODE": "offline"},
        "requirements": ["timm==1.0.9"],
    },
    "resources": {"nodes": 2, "procs_per_node": 8, "device": "cuda", "pool": "a100"},
    "retries": {"max_restarts": 3},
}
# `openapi_examples` of a job spec body (`POST /v1/jobs`, `POST /v1/spec/validate`).
JOB_SPEC_EXAMPLES: dict[str, Any] = {
    "trainer": {"summary": "The built-in trainer: a small GPT", "value": JOB_SPEC},
    "script": {"summary": "Your own code (`entrypoint`) on 2 nodes", "value": SCRIPT_JOB_SPEC},
}

_SPEC = JobSpec.model_validate(JOB_SPEC)
JOB: dict[str, Any] = {
    "id": JOB_ID,
    "project_id": PROJECT_ID,
    "name": JOB_SPEC["name"],
    "state": "running",
    "attempt": 1,
    "labels": JOB_SPEC["labels"],
    "pool": "a100",
    "spec": _SPEC.model_dump(mode="json"),
    "created_at": "2026-11-25T09:58:12.402113Z",
    "updated_at": "2026-11-25T11:41:07.918245Z",
    "started_at": "2026-11-25T10:01:33.120877Z",
    "finished_at": None,
    "current_step": 2400,
    "max_steps": 5000,
    "latest_metrics": {"loss": 1.873, "lr": 0.00052, "tokens_per_second": 118250.0},
    "exit_code": None,
    "error": None,
    "worker": "gpu-node-07",
    "heartbeat_at": "2026-11-25T11:41:05.004512Z",
    "owner": "ci",
    "running_s": 6014.2,
    "eta_s": 6515.4,
    "queue_position": None,
    "queue": None,
    "waiting_for": None,
    "failure": None,
    "restarts_used": 0,
    "restarts_by_class": {},
    "retry_policy": retry_policy(
        retries=_SPEC.retries,
        restarts_used=0,
        restarts_by_class={},
        state="running",
        failure_class=None,
    ).model_dump(mode="json"),
    "usage": {"slot_seconds": 12028.4, "cpu_seconds": 11710.9, "cost": 6.68},
    "note": None,
    "best_loss": 1.861,
    "best_eval_loss": 1.942,
}
JOB_PAGE: dict[str, Any] = {"items": [JOB], "next_cursor": "eyJiZWZvcmVfaWQiOjEwNDN9"}

EVENT: dict[str, Any] = {
    "id": 88412,
    "job_id": JOB_ID,
    "attempt": 1,
    "kind": "checkpoint",
    "state_from": None,
    "state_to": None,
    "message": "checkpoint at step 2000",
    "data": {
        "step": 2000,
        "uri": f"s3://torchyard/jobs/{JOB_ID}/checkpoints/step_00002000",
        "size_bytes": 544210944,
    },
    "created_at": "2026-11-25T11:26:51.311042Z",
}
EVENT_PAGE: dict[str, Any] = {"items": [EVENT], "next_cursor": "88412"}

LOG_LINE: dict[str, Any] = {
    "id": 5120337,
    "attempt": 1,
    "rank": 0,
    "stream": "stdout",
    "line": "step 2400 | loss 1.8730 | lr 5.20e-04 | 118250 tok/s",
    "created_at": "2026-11-25T11:41:04.770193Z",
}
LOG_PAGE: dict[str, Any] = {"items": [LOG_LINE], "next_cursor": "5120337"}

METRICS: dict[str, Any] = {
    "series": [
        {
            "name": "loss",
            "steps": [2200, 2300, 2400],
            "values": [1.902, 1.887, 1.873],
            "last": {"step": 2400, "value": 1.873},
        }
    ]
}

CHECKPOINT_EXPORT: dict[str, Any] = {
    "id": 77,
    "job_id": JOB_ID,
    "checkpoint_id": 512,
    "step": 2000,
    "state": "ready",
    "uri": f"s3://torchyard/jobs/{JOB_ID}/exports/step_00002000",
    "size_bytes": 181403648,
    "sha256": SHA256,
    "error": None,
    "queue_position": None,
    "waiting_for": None,
    "created_at": "2026-11-25T11:30:02.117400Z",
    "started_at": "2026-11-25T11:30:04.902311Z",
    "finished_at": "2026-11-25T11:31:18.440925Z",
}
CHECKPOINT_LIST: dict[str, Any] = {
    "items": [
        {
            "id": 512,
            "job_id": JOB_ID,
            "attempt": 1,
            "step": 2000,
            "uri": f"s3://torchyard/jobs/{JOB_ID}/checkpoints/step_00002000",
            "size_bytes": 544210944,
            "created_at": "2026-11-25T11:26:51.298776Z",
            "export": CHECKPOINT_EXPORT,
        }
    ]
}

EVALUATION_LIST: dict[str, Any] = {
    "items": [
        {
            "id": 31,
            "job_id": JOB_ID + 1,
            "source_job_id": JOB_ID,
            "checkpoint_id": 512,
            "step": 2000,
            "attempt": 1,
            "name": "perplexity",
            "kind": "perplexity",
            "dataset": None,
            "metrics": {"loss": 1.7342, "perplexity": 5.664, "tokens": 98304.0, "rows": 384.0},
            "samples": [],
            "created_at": "2026-11-25T11:31:02.118201Z",
        },
        {
            "id": 32,
            "job_id": JOB_ID + 1,
            "source_job_id": JOB_ID,
            "checkpoint_id": 512,
            "step": 2000,
            "attempt": 1,
            "name": "qa",
            "kind": "generate",
            "dataset": "ds_9f2c41d07a3b5e18",
            "metrics": {"exact_match": 0.5, "chrf": 71.3, "rouge_l": 0.82, "answers": 2.0},
            "samples": [
                {
                    "prompt": "<|im_start|>user\nCapital of France?<|im_end|>\n"
                    "<|im_start|>assistant\n",
                    "reference": "Paris.",
                    "answer": "Paris.",
                    "exact_match": 1.0,
                    "chrf": 100.0,
                    "rouge_l": 1.0,
                },
                {
                    "prompt": "<|im_start|>user\nCapital of Peru?<|im_end|>\n"
                    "<|im_start|>assistant\n",
                    "reference": "Lima.",
                    "answer": "Lima, Peru.",
                    "exact_match": 0.0,
                    "chrf": 42.6,
                    "rouge_l": 0.67,
                },
            ],
            "created_at": "2026-11-25T11:31:40.502113Z",
        },
    ]
}

# `GET /v1/jobs/{id}/stream`: a `job`, an `event`, a `metric` and a `log` message.
JOB_STREAM = "".join(
    f"id: {cursor}\nevent: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
    for cursor, kind, data in (
        ("88411.5120330.1795606800.5.2390", "job", JOB),
        ("88412.5120330.1795606800.5.2390", "event", EVENT),
        (
            "88412.5120330.1795606864.2.2400",
            "metric",
            {"step": 2400, "time": 1795606864.2, "values": {"loss": 1.873}},
        ),
        ("88412.5120337.1795606864.2.2400", "log", LOG_LINE),
    )
)

DATASET_STATS: dict[str, Any] = {
    "records": 12000,
    "bytes": 18402311,
    "roles": {"system": 12000, "user": 15230, "assistant": 15230},
    "chars": {
        "example": {"p50": 1210, "p90": 2980, "p99": 6120, "max": 15833},
        "supervised": {"p50": 640, "p90": 1710, "p99": 3950, "max": 9120},
    },
    "tokens": None,
    "num_tokens": None,
    "supervised_tokens": None,
    "max_token_id": None,
    "token_dtype": None,
    "duplicates": 3,
    "warnings": [
        {
            "type": "duplicate",
            "message": "3 records repeat an earlier one",
            "count": 3,
            "first": "line 4107",
        }
    ],
}
DATASET: dict[str, Any] = {
    "id": CHAT_DATASET_ID,
    "project_id": PROJECT_ID,
    "name": "support-chats",
    "uri": f"datasets/{CHAT_DATASET_ID}/support-chats.jsonl",
    "server_uri": None,
    "size_bytes": 18402311,
    "sha256": SHA256,
    "num_files": 1,
    "format": "messages",
    "stats": DATASET_STATS,
    "created_at": "2026-11-24T16:20:45.871003Z",
}
DATASET_LIST: dict[str, Any] = {"items": [DATASET]}
DATASET_FILES: dict[str, Any] = {
    "items": [
        {"path": "asyncio/base_events.py", "size_bytes": 78812},
        {"path": "asyncio/events.py", "size_bytes": 28770},
    ],
    "next_cursor": "asyncio/events.py",
}
DATASET_SAMPLE: dict[str, Any] = {
    "dataset_id": CHAT_DATASET_ID,
    "format": "messages",
    "items": [
        {
            "where": "support-chats.jsonl:1",
            "record": {
                "messages": [
                    {"role": "user", "content": "How do I reset my password?"},
                    {"role": "assistant", "content": "Open Settings, then Security, then Reset."},
                ]
            },
            "truncated": False,
        }
    ],
}
DATASET_REGISTER: dict[str, Any] = {
    "name": "python-corpus",
    "uri": "/data/corpora/python",
    "format": "text",
}
# `POST /v1/datasets/upload`'s multipart form: the file's content and its fields.
DATASET_UPLOAD: dict[str, Any] = {
    "name": "support-chats",
    "format": "messages",
    "file": '{"messages": [{"role": "user", "content": "How do I reset my password?"}, '
    '{"role": "assistant", "content": "Open Settings, then Security, then Reset."}]}\n',
}
DATASET_PREVIEW_REQUEST: dict[str, Any] = {
    "model": {"kind": "gpt", "seq_len": 512},
    "loss_on": "assistant",
    "num_examples": 1,
}
DATASET_PREVIEW: dict[str, Any] = {
    "dataset_id": CHAT_DATASET_ID,
    "format": "messages",
    "tokenizer": "bytes",
    "seq_len": 512,
    "loss_on": "assistant",
    "verdict": "ok",
    "refused": None,
    "examples": [
        {
            "where": "support-chats.jsonl:1",
            "status": "kept",
            "num_tokens": 6,
            "input_ids": [72, 105, 10, 79, 75, 10],
            "tokens": ["H", "i", "\n", "O", "K", "\n"],
            "supervised": [False, False, False, True, True, True],
            "roles": ["user", "user", "user", "assistant", "assistant", "assistant"],
        }
    ],
    "report": {
        "examples": 1,
        "dropped": 0,
        "truncated": 0,
        "lost_all_supervision": 0,
        "tokens": 6,
        "supervised_tokens": 3,
        "supervised_share_by_role": {"assistant": 1.0},
        "tokens_by_role": {"user": 3, "assistant": 3},
        "supervised_by_role": {"assistant": 3},
    },
}

CODE_ARCHIVE_SUMMARY: dict[str, Any] = {
    "id": CODE_ID,
    "name": "resnet-trainer",
    "format": "tar.gz",
    "sha256": SHA256,
    "size_bytes": 48213,
    "unpacked_bytes": 190544,
    "num_files": 3,
    "created_at": "2026-11-24T15:02:10.553871Z",
}
CODE_ARCHIVE: dict[str, Any] = {
    **CODE_ARCHIVE_SUMMARY,
    "files": ["data.py", "model.py", "train.py"],
}
CODE_ARCHIVE_LIST: dict[str, Any] = {"items": [CODE_ARCHIVE_SUMMARY]}
# `POST /v1/code`'s multipart form; `file` stands for the archive's bytes.
CODE_UPLOAD: dict[str, Any] = {"name": "resnet-trainer", "file": "<bytes of resnet-trainer.tar.gz>"}

SPEC_CHECK: dict[str, Any] = {
    "spec": {"name": "gpt-small-code", "data": {"dataset": DATASET_ID}},
    "lines": {"": 1, "/name": 1, "/data": 2, "/data/dataset": 3},
}
SPEC_YAML = f"name: gpt-small-code\ndata:\n  dataset: {DATASET_ID}\n"
# `GET /v1/spec/schema`, abridged to one field of each kind; the document puts the kinds in
# `$defs` and refers to them, which a viewer would try to resolve here.
SPEC_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {
            "title": "JobSpec",
            "type": "object",
            "additionalProperties": False,
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 100}},
            "required": ["name"],
        },
        {
            "title": "ScriptJobSpec",
            "type": "object",
            "additionalProperties": False,
            "properties": {"entrypoint": {"type": "object"}},
            "required": ["name", "entrypoint"],
        },
    ],
}

ME: dict[str, Any] = {
    "project": {"id": PROJECT_ID, "name": "nlp"},
    "key": {"id": "key_a9302a30cc5536b0", "name": "ci", "prefix": "ty_K9pNX8l"},
    "role": "member",
    "scopes": ["jobs:read", "jobs:write", "datasets:write"],
    "org_admin": False,
}
STATUS: dict[str, Any] = {"status": "ok"}
READINESS: dict[str, Any] = {
    "status": "ok",
    "reconciler": {
        "state": "ok",
        "reconciled_at": "2026-11-27T15:02:11.204Z",
        "seconds_since": 1.3,
        "leader": "ctl-0:41",
        "detail": "reconciled 1 s ago by ctl-0:41",
    },
}


# FastAPI leaves every null out of the OpenAPI document it builds (its final `exclude_none`
# pass, fastapi/fastapi#5559), the nulls of examples too: a required nullable field would be
# missing from its example. So the helpers below write each null of an example as `_NULL`, and
# `install`'s `openapi()` turns them back into nulls in the finished document.
_NULL = "\x00null"  # no example holds NUL: the API refuses it in text


def marked(value: Any) -> Any:
    """`value` with each null (at any depth) written as `_NULL`, to survive FastAPI."""
    return _swap(value, None, _NULL)


def _restored(value: Any) -> Any:
    return _swap(value, _NULL, None)


def _swap(value: Any, old: str | None, new: str | None) -> Any:
    """`value` with every `old` (at any depth of dicts and lists) replaced by `new`."""
    if value is old or (isinstance(value, str) and value == old):
        return new
    if isinstance(value, dict):
        return {key: _swap(item, old, new) for key, item in value.items()}
    if isinstance(value, list):
        return [_swap(item, old, new) for item in value]
    return value


def install(app: FastAPI) -> None:
    """`app.openapi()` builds FastAPI's document with the examples' nulls put back."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _restored(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def config(*values: dict[str, Any], **keywords: Unpack[ConfigDict]) -> ConfigDict:
    """A model's `model_config` (with `keywords`) whose JSON Schema has these `examples`."""
    settings = ConfigDict(**keywords)
    settings["json_schema_extra"] = {"examples": marked(list(values))}
    return settings


def json_example(example: Any) -> dict[str, Any]:
    """A `responses=` entry for a route whose answer is untyped JSON: its example."""
    return {"content": {"application/json": {"example": marked(example)}}}
