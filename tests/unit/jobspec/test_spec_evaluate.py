"""JobSpec validation of evaluations (`jobspec.evaluate`): the messages name what they refuse."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from jobspec.evaluate import EvalAfterSpec


def test_two_evaluations_of_one_name_are_named_in_the_error() -> None:
    """The message's template held `{name!r}`, which pydantic does not format (it substitutes
    plain names only): users read the literal text instead of the name."""
    twice = [{"kind": "perplexity", "name": "held"}, {"kind": "perplexity", "name": "held"}]
    with pytest.raises(ValidationError) as info:
        EvalAfterSpec.model_validate({"evaluations": twice})
    message = info.value.errors()[0]["msg"]
    assert "evaluations[1].name: 'held' names two evaluations" in message, message
