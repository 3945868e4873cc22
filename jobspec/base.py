"""The base of every job-spec section (`jobspec.job`, `jobspec.data`,
`jobspec.method`): unknown fields are errors, and assignments are validated."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictSpec(BaseModel):
    """A spec section: `extra="forbid"`, `validate_assignment=True`."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)


def given(*names: str) -> dict[str, Any]:
    """A JSON Schema (2020-12) that holds when every field of `names` is present and not null:
    a model's `json_schema_extra` states its cross-field rules with it (`oneOf`, `not`)."""
    return {"required": list(names), "properties": {n: {"not": {"type": "null"}} for n in names}}
