"""Every operation of the OpenAPI document shows an example request (when it takes a body) and
an example answer (each success status and media type), and every example in the document is
valid against the schema it illustrates.

A media type has its example when it carries `example` / `examples` itself, or when its schema
(through a `$ref`) has `examples` (a model's `model_config = examples.config(...)`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

from api import openapi_ids

_METHODS = {"get", "post", "put", "patch", "delete"}
_REF = "#/components/schemas/"
# (operationId, status, media type) -> why it has no example. Narrow on purpose: a new route
# that streams bytes needs its own entry and reason.
EXEMPT = {
    ("checkpoints_download_export", "200", "application/octet-stream"): "`model.safetensors`: "
    "binary weights, which no text in the document can stand for",
    ("checkpoints_download_lora_file", "200", "application/octet-stream"): "a file of a LoRA "
    "run's adapter or merged model (weights, or their JSON config, as stored)",
    ("tinker_retrieve_future", "200", "application/x-protobuf"): "a `ForwardBackwardOutput` or "
    "`SampleResponse` in protobuf's binary wire format (the tinker client's schema), which no "
    "text in the document can stand for",
}
# A success answer without a body is `204 No Content`: OpenAPI has no place for its example.
NO_BODY = {"204"}
# `GET /v1/jobs/{id}/stream`: each message's `data` by its `event` name.
STREAM_DATA = {"job": "Job", "event": "Event", "log": "LogLine"}

# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE = (
    "items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems",
)  # fmt: skip
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_NAMED = ("properties", "patternProperties", "$defs", "dependentSchemas")


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for item in document["paths"].values():
        for method, operation in item.items():
            if method in _METHODS:
                yield operation["operationId"], operation


def _has_example(document: dict[str, Any], media: dict[str, Any]) -> bool:
    if "example" in media or "examples" in media:
        return True
    schema = media.get("schema", {})
    if "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].removeprefix(_REF)]
    return bool(schema.get("examples"))


def missing_examples(document: dict[str, Any]) -> list[str]:
    """`<operationId> <request|status> <media type>` of each body without an example."""
    missing = []
    for op_id, operation in _operations(document):
        for media_type, media in operation.get("requestBody", {}).get("content", {}).items():
            if not _has_example(document, media):
                missing.append(f"{op_id} request {media_type}")
        for status, response in operation["responses"].items():
            if not status.startswith("2"):
                continue
            if not response.get("content") and status not in NO_BODY:
                missing.append(f"{op_id} {status} (no content)")
            for media_type, media in response.get("content", {}).items():
                exempt = (op_id, status, media_type) in EXEMPT
                if not exempt and not _has_example(document, media):
                    missing.append(f"{op_id} {status} {media_type}")
    return missing


def _schema_examples(schema: Any, where: str) -> Iterator[tuple[str, Any, Any]]:
    """(where, schema, example) of `schema`'s `examples` and those of its subschemas."""
    if not isinstance(schema, dict):
        return
    for i, value in enumerate(schema.get("examples", [])):
        yield f"{where} examples[{i}]", schema, value
    for key in _ONE:
        yield from _schema_examples(schema.get(key), f"{where}.{key}")
    for key in _MANY:
        for i, sub in enumerate(schema.get(key, [])):
            yield from _schema_examples(sub, f"{where}.{key}[{i}]")
    for key in _NAMED:
        for name, sub in schema.get(key, {}).items():
            yield from _schema_examples(sub, f"{where}.{key}.{name}")


def _media_examples(media: dict[str, Any], where: str) -> Iterator[tuple[str, Any, Any]]:
    """A media type's (or parameter's) own examples, and its schema's."""
    schema = media.get("schema", {})
    if "example" in media:
        yield f"{where} example", schema, media["example"]
    for name, example in media.get("examples", {}).items():
        yield f"{where} examples.{name}", schema, example["value"]
    yield from _schema_examples(schema, f"{where} schema")


def all_examples(document: dict[str, Any]) -> Iterator[tuple[str, str, Any, Any]]:
    """(where, media type, schema, example) of every example in the document."""
    for name, schema in document["components"]["schemas"].items():
        for where, sub, value in _schema_examples(schema, name):
            yield where, "application/json", sub, value
    for op_id, operation in _operations(document):
        for param in operation.get("parameters", []):
            for where, sub, value in _media_examples(param, f"{op_id} {param['name']}"):
                yield where, "application/json", sub, value
        bodies = [("request", operation.get("requestBody", {}))]
        bodies += list(operation["responses"].items())
        for status, body in bodies:
            for media_type, media in body.get("content", {}).items():
                for where, sub, value in _media_examples(media, f"{op_id} {status} {media_type}"):
                    yield where, media_type, sub, value


def _parsed(media_type: str, value: Any) -> Any:
    """An example as the data its schema describes: a YAML body's text parsed."""
    if media_type == "application/yaml" and isinstance(value, str):
        return yaml.safe_load(value)
    return value


def invalid_examples(document: dict[str, Any]) -> tuple[list[str], int]:
    """(`where: why` of each example its schema refuses, how many examples were checked)."""
    problems, checked = [], 0
    for where, media_type, schema, value in all_examples(document):
        checked += 1
        if '"$ref"' in json.dumps(value):  # Swagger UI and ReDoc would try to resolve it
            problems.append(f"{where}: holds a $ref")
        rooted = {**schema, "components": document["components"]}
        validator = jsonschema_rs.validator_for(rooted, validate_formats=True)
        problems += [
            f"{where}: {e.message}" for e in validator.iter_errors(_parsed(media_type, value))
        ]
    return problems, checked


def _stream_messages(text: str) -> list[tuple[str, Any]]:
    """(event, parsed data) of each message of an SSE text."""
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_every_operation_has_a_request_and_a_response_example(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    missing = missing_examples(document)
    assert not missing, f"{len(missing)} bodies lack an example: {missing}"


def test_every_example_is_valid_against_its_schema(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    problems, checked = invalid_examples(document)
    assert checked >= len(list(_operations(document))), checked
    assert not problems, f"{len(problems)} examples are invalid: {problems}"


def test_each_message_of_the_stream_example_is_valid_for_its_event(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    stream = document["paths"]["/v1/jobs/{job_id}/stream"]["get"]["responses"]["200"]
    messages = _stream_messages(stream["content"]["text/event-stream"]["example"])
    assert set(STREAM_DATA) <= {event for event, _ in messages}
    for event, data in messages:
        if event in STREAM_DATA:
            schema = {"$ref": _REF + STREAM_DATA[event], "components": document["components"]}
            assert jsonschema_rs.is_valid(schema, data), (event, data)


class _Thing(BaseModel):
    size: int


def test_a_route_without_examples_or_with_a_wrong_one_is_reported() -> None:
    app = FastAPI(generate_unique_id_function=openapi_ids.operation_id)

    @app.post("/things", tags=["things"], response_model=_Thing)
    def create(thing: _Thing) -> _Thing:
        return thing

    @app.get(
        "/things/one",
        tags=["things"],
        responses={200: {"content": {"application/json": {"example": {"size": "big"}}}}},
    )
    def one() -> _Thing:
        return _Thing(size=1)

    document = app.openapi()
    assert missing_examples(document) == [
        "things_create request application/json",
        "things_create 200 application/json",
    ]
    problems, _ = invalid_examples(document)
    assert problems == ['things_one 200 application/json example: "big" is not of type "integer"']
