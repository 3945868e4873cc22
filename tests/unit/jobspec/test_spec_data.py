"""DataSpec's data-preparation fields: defaults and the conflicts refused with their path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobspec.job import JobSpec


def _spec(**data: object) -> dict[str, object]:
    return {"name": "job", "data": {"dataset": "ds_1", **data}}


def _locs(exc: ValidationError) -> list[tuple[object, ...]]:
    return [tuple(e["loc"]) for e in exc.errors()]


def test_data_defaults_drop_over_long_examples_and_leave_format_to_the_dataset() -> None:
    data = JobSpec.model_validate(_spec()).data
    assert (data.format, data.loss_on, data.chat_template) == (None, None, None)
    assert (data.truncation, data.packing, data.max_truncated_share) == ("drop", False, 0.1)


def test_loss_on_that_the_format_cannot_honour_is_refused_at_data_loss_on() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(format="jsonl_text", loss_on="assistant"))
    assert ("data", "loss_on") in _locs(exc.value)
    JobSpec.model_validate(_spec(format="messages", loss_on="assistant"))


def test_packed_preference_pairs_are_refused_at_data_packing() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(format="preference", packing=True))
    assert ("data", "packing") in _locs(exc.value)


def test_two_eval_sources_are_refused_at_data_eval_uri() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(eval_dataset="ds_2", eval_uri="/tmp/x.jsonl"))
    assert ("data", "eval_uri") in _locs(exc.value)


def test_unknown_truncation_mode_is_refused() -> None:
    with pytest.raises(ValidationError) as exc:
        JobSpec.model_validate(_spec(truncation="middle"))
    assert ("data", "truncation") in _locs(exc.value)
