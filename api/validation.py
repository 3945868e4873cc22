"""Checks on request values that pydantic accepts but the database cannot store, or that it
reads more loosely than the OpenAPI schema states."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

# Ids are BIGINT: a larger number is not an id of anything.
MAX_ID = 2**63 - 1

JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="The job's id.")]
After = Annotated[
    int | None, Query(ge=0, le=MAX_ID, description="Return only items with a larger id.")
]
"""A page's lower bound: items with a larger id."""


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _iso_only(value: Any) -> Any:
    """Refuse what pydantic would read as a Unix time (`0.5`, `1700000000`): the schema says
    `format: date-time` (RFC 3339 / ISO 8601)."""
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError("an ISO 8601 date-time, such as 2026-01-31T12:00:00Z")
    return value


IsoDatetime = Annotated[datetime, BeforeValidator(_iso_only)]
"""A date-time given as ISO 8601 text (query parameters); UTC when it has no offset is the
caller's business."""


def _not_bool(value: Any) -> Any:
    """Refuse JSON `true`/`false` where the schema says number (pydantic's lax mode reads them
    as 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError("a number, not true or false")
    return value


NotBool = BeforeValidator(_not_bool)
"""Put in an `Annotated[int, ...]` of a request body: booleans are refused."""


def _json_int(value: Any) -> Any:
    """Refuse what a JSON Schema `integer` excludes but pydantic's lax mode converts: `true` /
    `false` (read as 1 and 0) and numeric strings (`"8"`). `2.0` stays an integer, as in JSON
    Schema."""
    if isinstance(value, bool | str | bytes):
        kind = "true or false" if isinstance(value, bool) else "a string"
        raise PydanticCustomError(
            "int_type", "Input should be an integer, not {kind}", {"kind": kind}
        )
    return value


JsonInt = BeforeValidator(_json_int)
"""Put last in a request body's `Annotated[int, Field(ge=..., le=...), JsonInt]`, after its
bounds (bounds given outside it are lost from the JSON schema). A `number` is
`Annotated[float, Strict()]`: a strict float takes any JSON number and nothing else."""
