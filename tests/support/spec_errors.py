"""Helpers for the JobSpec validation tests: a minimal raw spec, and the errors a raw spec
gets, keyed by JSON path."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jobspec.job import JobSpec


def raw_spec(**overrides: Any) -> dict[str, Any]:
    """The smallest valid raw spec (a dataset by id), with top-level sections replaced."""
    base: dict[str, Any] = {"name": "job", "data": {"dataset": "ds_1"}}
    base.update(overrides)
    return base


def spec_errors(raw: dict[str, Any]) -> dict[tuple[Any, ...], str]:
    """{JSON path: message} of the `ValidationError` that `raw` must raise."""
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(raw)
    return {tuple(e["loc"]): e["msg"] for e in exc.value.errors()}
