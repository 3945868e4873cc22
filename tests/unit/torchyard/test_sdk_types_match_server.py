"""Issue 46: the SDK's answer types (`torchyard.types`, hand-written so the client needs no
server package) are tied to the server's schemas, so neither can drift silently: every field an
SDK type declares is a field the server sends, and the SDK accepts every JSON type the server
may send there (an integer where the SDK reads a number, anything where it reads `Any`)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import pydantic
import pytest

import api.schemas
import torchyard.types as sdk
from core.attempts import retry_budget
from core.datasets import stats
from jobspec import entrypoint, evaluate

# SDK type -> the server's model, where the names differ (else the same name in api.schemas).
RENAMED: dict[str, type[pydantic.BaseModel]] = {
    "ClassBudget": retry_budget.ClassBudget,
    "RetryPolicy": retry_budget.RetryPolicy,
    "Entrypoint": entrypoint.EntrypointSpec,
    "EvalSource": evaluate.EvalSourceSpec,
    "Lengths": stats.Lengths,
    "StatsWarning": stats.StatsWarning,
    "DatasetStats": stats.DatasetStats,
    "SampleRecord": api.schemas.DatasetSampleItem,
    "Trial": importlib.import_module("api.schemas.sweeps").TrialOut,
    "Sweep": importlib.import_module("api.schemas.sweeps").SweepOut,
    "SessionModel": importlib.import_module("api.schemas.sessions").SessionModelOut,
    "TrainingSession": importlib.import_module("api.schemas.sessions").SessionOut,
}
# Client-side shapes with no server model of their own.
CLIENT_ONLY = {
    "Page",  # the SDK's generic page of any list answer
    "MetricPoint",  # one point of a `MetricSeries`, as the SDK's iterators yield it
}


def _server_models() -> dict[str, type[pydantic.BaseModel]]:
    found: dict[str, type[pydantic.BaseModel]] = {}
    modules = [api.schemas] + [
        importlib.import_module(f"api.schemas.{m.name}")
        for m in pkgutil.iter_modules(api.schemas.__path__)
    ]
    for module in modules:
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel):
                found.setdefault(name, obj)
    return found


def _sdk_models() -> list[tuple[str, type[pydantic.BaseModel]]]:
    return [
        (name, obj)
        for name, obj in vars(sdk).items()
        if inspect.isclass(obj)
        and issubclass(obj, pydantic.BaseModel)
        and obj.__module__ == sdk.__name__
        and not name.startswith("_")
    ]


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def _types(schema: dict[str, Any], defs: dict[str, Any]) -> set[str] | None:
    """The JSON types a property schema admits; None for any (no constraint)."""
    if "$ref" in schema:
        return _types(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in schema:
        return {_JSON_TYPES[type(schema["const"])]}
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [_types(s, defs) for s in schema[key]]
            return None if any(p is None for p in parts) else set().union(*parts)  # type: ignore[arg-type]
    if "enum" in schema:
        return {"null" if v is None else "string" for v in schema["enum"]}
    kind = schema.get("type")
    if kind is None:
        return None
    return set(kind) if isinstance(kind, list) else {kind}


def _accepts(sdk_types: set[str] | None, server_types: set[str] | None) -> bool:
    if sdk_types is None:
        return True
    if server_types is None:
        return False
    widened = sdk_types | ({"integer"} if "number" in sdk_types else set())
    return server_types <= widened


def _properties(model: type[pydantic.BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = model.model_json_schema(mode="serialization")
    return schema.get("properties", {}), schema.get("$defs", {})


def _pairs() -> list[tuple[str, type[pydantic.BaseModel], type[pydantic.BaseModel]]]:
    server = _server_models()
    pairs = []
    for name, model in _sdk_models():
        if name in CLIENT_ONLY:
            continue
        theirs = RENAMED.get(name) or server.get(name)
        assert theirs is not None, f"torchyard.types.{name} has no server model: map it"
        pairs.append((name, model, theirs))
    return pairs


@pytest.mark.parametrize("name", [name for name, _ in _sdk_models() if name not in CLIENT_ONLY])
def test_each_sdk_field_is_one_the_server_sends_with_a_type_the_sdk_reads(name: str) -> None:
    _, ours, theirs = next(p for p in _pairs() if p[0] == name)
    mine, my_defs = _properties(ours)
    served, served_defs = _properties(theirs)
    unknown = sorted(set(mine) - set(served))
    assert not unknown, f"{name}: the server sends no {unknown}"
    drift = [
        (field, _types(served[field], served_defs), _types(schema, my_defs))
        for field, schema in mine.items()
        if not _accepts(_types(schema, my_defs), _types(served[field], served_defs))
    ]
    assert not drift, f"{name}: (field, server's types, SDK's types) {drift}"


def test_the_check_sees_a_renamed_field_and_a_narrowed_type() -> None:
    class Drifted(pydantic.BaseModel):
        identifier: int  # the server calls it `id`
        state: int  # the server sends a string

    mine, defs = _properties(Drifted)
    served, served_defs = _properties(api.schemas.Job)
    assert set(mine) - set(served) == {"identifier"}
    assert not _accepts(_types(mine["state"], defs), _types(served["state"], served_defs))
    assert _accepts({"number"}, {"integer"}) and not _accepts({"integer"}, {"number"})
