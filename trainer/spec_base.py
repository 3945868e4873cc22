"""The base of every job-spec section (`trainer.spec`, `trainer.spec_data`,
`trainer.spec_method`): unknown fields are errors, and assignments are validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictSpec(BaseModel):
    """A spec section: `extra="forbid"`, `validate_assignment=True`."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)
