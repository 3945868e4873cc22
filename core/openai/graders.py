"""OpenAI's reinforcement fine-tuning graders as a `POST /openai/v1/fine_tuning/jobs` body gives
them (`method.reinforcement.grader`): `jobspec.graders`' graders, validated by the same rules
(`score_model` and `label_model` refused with their reason), plus OpenAI's `image_tag` of a
python grader, accepted and dropped (`without_image_tags`) before the job's spec takes the
grader. Errors are located as OpenAI names the fields, without the discriminated union's tag."""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from jobspec.graders import (
    FORMULA_NAME,
    MultiGrader,
    PythonGrader,
    StringCheckGrader,
    TextSimilarityGrader,
    refuse_model_graders,
    refuse_nested_multi,
)


class OpenAIPythonGrader(PythonGrader):
    """A `python` grader as OpenAI's request gives it: `jobspec.graders.PythonGrader` and
    OpenAI's `image_tag`, accepted and ignored."""

    image_tag: Annotated[str, Field(max_length=200)] | None = Field(
        default=None,
        description="OpenAI's runtime image for the grader: accepted and ignored (not kept in "
        "the job). The grader runs with the worker's Python inside the job's sandbox.",
    )


FormulaName = Annotated[str, Field(pattern=FORMULA_NAME)]
OpenAISubGrader = Annotated[
    StringCheckGrader | TextSimilarityGrader | OpenAIPythonGrader,
    Field(discriminator="type"),
    BeforeValidator(refuse_nested_multi),
]


class OpenAIMultiGrader(MultiGrader):
    """A `multi` grader as OpenAI's request gives it: its python graders may carry
    `image_tag`."""

    # The same field over OpenAI's python grader: a dict is invariant to mypy, not to pydantic.
    graders: dict[FormulaName, OpenAISubGrader] = Field(  # type: ignore[assignment]
        min_length=1,
        max_length=16,
        description=MultiGrader.model_fields["graders"].description,
        json_schema_extra=MultiGrader.model_fields["graders"].json_schema_extra,
    )


GRADER_TYPES: Final = ("string_check", "text_similarity", "python", "multi")


def _untag(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """The grader as validated, its errors located as OpenAI names the fields: without the type
    tag pydantic's discriminated union puts in the path (`grader.operation`, not
    `grader.string_check.operation`)."""
    try:
        return handler(value)
    except ValidationError as exc:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(str(e["type"]), str(e["msg"])),
                loc=_untagged(e["loc"]),
                input=e["input"],
            )
            for e in exc.errors()
        ]
        raise ValidationError.from_exception_data(exc.title, errors) from None


def _untagged(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """`loc` without the discriminated union's tags: at its start, and after a multi grader's
    `graders.<key>`."""
    out = list(loc)
    if out and out[0] in GRADER_TYPES:
        nested = out.pop(0) == "multi"
        if nested and len(out) > 2 and out[0] == "graders" and out[2] in GRADER_TYPES:
            out.pop(2)
    return tuple(out)


OpenAIGrader = Annotated[
    StringCheckGrader | TextSimilarityGrader | OpenAIPythonGrader | OpenAIMultiGrader,
    Field(discriminator="type"),
    BeforeValidator(refuse_model_graders),
    WrapValidator(_untag),
]


def without_image_tags(grader: dict[str, Any]) -> dict[str, Any]:
    """A dumped OpenAI grader as `jobspec.graders.Grader` takes it: no `image_tag`, at the top
    or in a multi grader's `graders`."""
    out = {k: v for k, v in grader.items() if k != "image_tag"}
    if isinstance(out.get("graders"), dict):
        out["graders"] = {k: without_image_tags(v) for k, v in out["graders"].items()}
    return out
