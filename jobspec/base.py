"""The base of every job-spec section (`jobspec.job`, `jobspec.data`,
`jobspec.method`): unknown fields are errors, `true`/`false` is no number, and assignments
are validated."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Boolean:
    """A JSON boolean given to a field that takes none: no validator of a number, string,
    literal or section accepts it, so the field's own error reports it at its path, shown as
    `true` / `false`."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "true" if self.value else "false"


class StrictSpec(BaseModel):
    """A spec section: `extra="forbid"`, `validate_assignment=True`, and a boolean is no
    number or string: pydantic's lax mode reads `max_steps: true` as 1 and `dropout: false` as
    0.0, so a boolean given to a field that takes none is passed on as a `Boolean`, which fails
    that field's own validation at its path ("Input should be a valid number"). (Passing on its
    text, `"false"`, failed numbers but was a valid `model.hf.revision`.)"""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        wrong = [
            k
            for k, v in data.items()
            if isinstance(v, bool)
            and k in fields
            and not _takes_bool(fields[k].annotation)
            and not _takes_section(fields[k].annotation)
        ]
        if not wrong:
            return data
        return {k: (Boolean(v) if k in wrong else v) for k, v in data.items()}


def _takes_section(annotation: Any) -> bool:
    """Whether a field of type `annotation` takes a spec section (a model, alone or in a union
    or `Annotated`). A boolean stays a boolean there: FastAPI validates a body with
    `from_attributes`, which would read a `Boolean` as a section of defaults (`model.hf: false`
    was accepted as an empty `hf`), and a plain boolean is refused as no object."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _takes_section(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(_takes_section(arg) for arg in typing.get_args(annotation))
    return False


def _takes_bool(annotation: Any) -> bool:
    """Whether a field of type `annotation` may hold a boolean: bool itself, Any, or a union,
    `Annotated` or `Literal` that includes one."""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(isinstance(arg, bool) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _takes_bool(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(_takes_bool(arg) for arg in typing.get_args(annotation))
    return False


def given(*names: str) -> dict[str, Any]:
    """A JSON Schema (2020-12) that holds when every field of `names` is present and not null:
    a model's `json_schema_extra` states its cross-field rules with it (`oneOf`, `not`)."""
    return {"required": list(names), "properties": {n: {"not": {"type": "null"}} for n in names}}
