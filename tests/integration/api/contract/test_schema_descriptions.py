"""Every field of the REST API's schemas (`/v1`, `/openai/v1`, `/healthz`, `/readyz`) has a
description.

FastAPI's built-in `HTTPValidationError` / `ValidationError` are not ours (422s answer with
`ErrorBody`, 400s under `/openai/v1` with `OpenAIErrorBody`).
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

NOT_OURS = {"HTTPValidationError", "ValidationError"}
_REF = "#/components/schemas/"


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].removeprefix(_REF)} if "$ref" in node else set()
        return found.union(*(_refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node))
    return set()


def _reachable(document: dict[str, Any], operations: list[Any]) -> set[str]:
    schemas = document["components"]["schemas"]
    seen: set[str] = set()
    todo = _refs(operations)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo |= _refs(schemas[name]) - seen
    return seen - NOT_OURS


def test_every_field_of_the_rest_api_schemas_is_described(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    names = _reachable(document, list(document["paths"].values()))
    assert {"Job", "JobPage", "Dataset", "DatasetStats", "CodeArchive", "ErrorBody"} <= names
    assert {"FineTuneCreate", "Hyperparameters", "Method", "OpenAIErrorBody"} <= names
    undescribed = [
        f"{name}.{field}"
        for name in sorted(names)
        for field, prop in document["components"]["schemas"][name].get("properties", {}).items()
        if not prop.get("description")
    ]
    assert not undescribed, f"{len(undescribed)} fields lack a description: {undescribed}"
