"""Stable, readable OpenAPI `operationId`s: `<tag>_<action>`, such as `jobs_create`.

FastAPI's default ids repeat the path and method (`get_job_v1_jobs__job_id__get`), which makes
generated clients hard to read and changes them whenever a path changes. `operation_id`
derives the id from the route's first tag and its endpoint's name instead: the tag's words
lead, and the endpoint name's words that repeat the tag are dropped (`list_jobs` under tag
`jobs` -> `jobs_list`; `job_events` under `job data` -> `job_data_events`). A route whose
derived id reads badly sets `operation_id=` itself. Routes under `/openai/v1` (tag `openai`)
are named after the official OpenAI SDK call they answer (`client.files.create` ->
`openai_files_create`), so a reader can match them to OpenAI's reference.
"""

from __future__ import annotations

import re

from fastapi.routing import APIRoute
from fastapi.utils import generate_unique_id

# (endpoint name) -> id for the routes of tag `openai`, after the OpenAI SDK's method paths.
OPENAI_IDS = {
    "list_models": "openai_models_list",
    "get_model": "openai_models_retrieve",
    "list_files": "openai_files_list",
    "create_file": "openai_files_create",
    "get_file": "openai_files_retrieve",
    "delete_file": "openai_files_delete",
    "file_content": "openai_files_content",
    "create_job": "openai_fine_tuning_jobs_create",
    "list_jobs": "openai_fine_tuning_jobs_list",
    "get_job": "openai_fine_tuning_jobs_retrieve",
    "cancel_job": "openai_fine_tuning_jobs_cancel",
    "pause_job": "openai_fine_tuning_jobs_pause",
    "resume_job": "openai_fine_tuning_jobs_resume",
    "list_events": "openai_fine_tuning_jobs_list_events",
    "list_checkpoints": "openai_fine_tuning_jobs_checkpoints_list",
}

_ACTION_BY_METHOD = {"GET": "get", "POST": "create", "PUT": "replace", "PATCH": "update"}


def _words(text: str) -> list[str]:
    return [word for word in re.split(r"[^a-z0-9]+", text.lower()) if word]


def operation_id(route: APIRoute) -> str:
    """The `operationId` of `route`: `<tag>_<action>`, lower case, words joined by `_`.

    Routes left out of the schema keep FastAPI's default id. Raises ValueError for a documented
    route without a tag: every route in the schema must have one.
    """
    if not route.include_in_schema:
        return generate_unique_id(route)
    if not route.tags:
        raise ValueError(f"route {route.path} has no tag; every documented route needs one")
    tag = _words(str(route.tags[0]))
    if tag == ["openai"] and route.name in OPENAI_IDS:
        return OPENAI_IDS[route.name]
    repeated = set(tag) | {word.removesuffix("s") for word in tag}
    action = [word for word in _words(route.name) if word not in repeated]
    if not action:
        method = min(route.methods or {"GET"})
        action = [_ACTION_BY_METHOD.get(method, method.lower())]
    return "_".join(tag + action)
