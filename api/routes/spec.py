"""The job spec's JSON Schema, for clients and forms that build specs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from trainer.spec import json_schema

router = APIRouter(prefix="/v1/spec", tags=["spec"])


@router.get("/schema")
def spec_schema() -> dict[str, Any]:
    """The JSON Schema of JobSpec, the body of `POST /v1/jobs`."""
    return json_schema()
