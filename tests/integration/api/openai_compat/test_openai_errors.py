"""Under `/openai/v1` an invalid request is OpenAI's 400 (`invalid_request_error`), stated so in
the OpenAPI document; `/v1` keeps its 422. (The official client's view: test_openai_api.py.)"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import ProjectKey

_OPENAI_BODY = "#/components/schemas/OpenAIErrorBody"
_OUR_BODY = "#/components/schemas/ErrorBody"


def _operations(document: dict[str, Any], openai: bool) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{method.upper()} {path}", op)
        for path, item in document["paths"].items()
        if path.startswith("/openai/") == openai
        for method, op in item.items()
    ]


def _schema_ref(response: dict[str, Any]) -> str:
    return str(response["content"]["application/json"]["schema"]["$ref"])


def test_openapi_states_400_not_422_under_openai_and_422_under_v1(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    openai_ops = _operations(document, openai=True)
    assert len(openai_ops) >= 10
    for name, op in openai_ops:
        assert "422" not in op["responses"], name
        assert _schema_ref(op["responses"]["400"]) == _OPENAI_BODY, name
    validated = [
        (name, op)
        for name, op in _operations(document, openai=False)
        if name.split()[1].startswith("/v1/") and (op.get("parameters") or op.get("requestBody"))
    ]
    assert validated
    for name, op in validated:
        assert _schema_ref(op["responses"]["422"]) == _OUR_BODY, name


def test_invalid_parameters_answer_400_under_openai_and_422_under_v1(
    client: TestClient, project: ProjectKey
) -> None:
    theirs = client.get("/openai/v1/fine_tuning/jobs?limit=0", headers=project.headers)
    assert theirs.status_code == 400, theirs.text
    error = theirs.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "limit", error
    ours = client.get("/v1/jobs?limit=0", headers=project.headers)
    assert ours.status_code == 422, ours.text
    assert ours.json()["error"]["details"][0]["loc"] == ["query", "limit"]


def test_an_unparseable_body_is_400_under_openai(client: TestClient, project: ProjectKey) -> None:
    answer = client.post(
        "/openai/v1/fine_tuning/jobs",
        content=b"{not json",
        headers={**project.headers, "Content-Type": "application/json"},
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"
