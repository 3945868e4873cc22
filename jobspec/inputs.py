"""`entrypoint.inputs`: what a team's own program reads, declared by name (docs/CONTRACTS.md
section 5; the anchor is SageMaker's input channels).

A job's program runs in a sandbox that shows it nothing of the host (`workers.isolation`); each
input it declares is placed read-only at `/inputs/<name>` before its ranks start, named by
`TORCHYARD_INPUT_<NAME>` and `torchyard.train.inputs()`. An input is one of:

- `{dataset: ID_OR_NAME}`: a dataset of the job's project, pinned at submission to its id and
  `sha256`, so the job reads what the name named when it was sent;
- `{base_model: NAME}`: a model of the server's base-model registry (`TORCHYARD_BASE_MODELS`,
  the one the OpenAI view fine-tunes), pinned to its location (`uri`, set by the server);
- `{job: ID}` or `{job: ID, checkpoint: CHECKPOINT_ID}`: a complete checkpoint of a job of the
  project (its latest, pinned at submission), in the layout it was written;
- `{path: PATH_OR_URI}`: a file, directory or object-store prefix under `TORCHYARD_DATA_ROOTS`.

Imports nothing heavier than pydantic; the references are checked by `core.jobs.inputs`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from jobspec.base import StrictSpec

INPUT_NAME: Final = r"^[a-z][a-z0-9_]{0,62}$"
MAX_INPUTS: Final = 32
MOUNT_ROOT: Final = "/inputs"  # where the sandbox places them: /inputs/<name>
ENV_PREFIX: Final = "TORCHYARD_INPUT_"  # TORCHYARD_INPUT_<NAME>: the input's path
KINDS: Final = ("dataset", "base_model", "job", "path")
SHA256: Final = r"^[0-9a-f]{64}$"


class DatasetInput(StrictSpec):
    """A dataset of the job's project: its file (an upload) or directory (a registered one)."""

    dataset: str = Field(
        min_length=1, max_length=200, description="The dataset's id or name (`GET /v1/datasets`)."
    )
    sha256: str | None = Field(
        default=None,
        pattern=SHA256,
        description="The dataset's content hash, set at submission; given, it must match "
        "(409 when the dataset changed).",
    )


class BaseModelInput(StrictSpec):
    """A model of the server's base-model registry (a Hugging Face directory)."""

    base_model: str = Field(
        min_length=1,
        max_length=200,
        description="A registered base model's name (`GET /openai/v1/models` lists them).",
    )
    uri: str | None = Field(
        default=None,
        max_length=4096,
        description="Where the model lies, set by the server at submission from its registry "
        "(a value given is replaced).",
    )


class CheckpointInput(StrictSpec):
    """A complete checkpoint of a job of the project, read-only, as it was written (DCP, or the
    program's own files)."""

    job: int = Field(ge=1, description="The job whose checkpoint is read.")
    checkpoint: int | None = Field(
        default=None,
        ge=1,
        description="A checkpoint id of that job (`GET /v1/jobs/{id}/checkpoints`); null takes "
        "its latest complete one, pinned at submission.",
    )


class PathInput(StrictSpec):
    """A file, directory or object-store prefix under the server's data roots."""

    path: str = Field(
        min_length=1,
        max_length=4096,
        description="A server-side path or an `s3://` prefix under `TORCHYARD_DATA_ROOTS`.",
    )


def input_kind(value: Any) -> str | None:
    """Which kind of input `value` is, by the key it holds (`dataset`, `base_model`, `job`,
    `path`); None when it holds none of them."""
    if isinstance(value, StrictSpec):
        value = value.model_dump()
    if not isinstance(value, dict):
        return None
    found = [kind for kind in KINDS if kind in value]
    return found[0] if len(found) == 1 else None


AnyInput = DatasetInput | BaseModelInput | CheckpointInput | PathInput
InputKind = Literal["dataset", "base_model", "job", "path"]
InputName = Annotated[str, Field(pattern=INPUT_NAME)]
MODELS: Final[dict[str, type[AnyInput]]] = {
    "dataset": DatasetInput,
    "base_model": BaseModelInput,
    "job": CheckpointInput,
    "path": PathInput,
}
KIND_MESSAGE: Final = (
    "an input is exactly one of {dataset: ...}, {base_model: ...}, {job: ..., checkpoint: ...} "
    "or {path: ...}"
)


def _parse(value: Any) -> Any:
    """Each input of the map `value` as the model its key names, with every error at
    `<name>.<field>` (a tagged union would put its tag into the path)."""
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    errors: list[InitErrorDetails] = []
    for name, item in value.items():
        if not isinstance(name, str) or not re.match(INPUT_NAME, name):
            msg = (
                "an input's name is lower-case letters, digits and '_', starting with a letter "
                "(at most 63 characters): {name}"
            )
            error = PydanticCustomError("input_name", msg, {"name": repr(name)})
            errors.append(InitErrorDetails(type=error, loc=(str(name),), input=name))
            continue
        kind = input_kind(item)
        if kind is None:
            error = PydanticCustomError("input_kind", KIND_MESSAGE)
            errors.append(InitErrorDetails(type=error, loc=(name,), input=item))
            continue
        try:
            out[name] = MODELS[kind].model_validate(item)
        except ValidationError as exc:
            for found in exc.errors():
                error = PydanticCustomError(found["type"], found["msg"])
                loc = (name, *found["loc"])
                errors.append(InitErrorDetails(type=error, loc=loc, input=found["input"]))
    if errors:
        raise ValidationError.from_exception_data("inputs", errors)
    return out


Inputs = Annotated[dict[InputName, AnyInput], BeforeValidator(_parse)]


def mount_path(name: str) -> str:
    """Where input `name` lies inside the job's sandbox."""
    return f"{MOUNT_ROOT}/{name}"


def env_name(name: str) -> str:
    """The environment variable naming input `name`'s path: `TORCHYARD_INPUT_<NAME>`."""
    return ENV_PREFIX + name.upper()
