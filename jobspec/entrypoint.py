"""The `entrypoint` section of a job spec: the team's own training code instead of the built-in
trainer (docs/CONTRACTS.md section 5).

A job with `entrypoint` is a `jobspec.job.ScriptJobSpec`: the worker unpacks the uploaded code
archive (`POST /v1/code`), and torchrun runs `command` on every rank with the code as its working
directory, the spec's `env` over an allow-listed environment, and (optionally) a virtual
environment with `requirements` installed over the worker's own Python. Imports nothing heavier
than pydantic.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508
from pydantic import Field, JsonValue, field_validator

from jobspec.base import StrictSpec
from jobspec.inputs import MAX_INPUTS, Inputs

CODE_ID_PATTERN: Final = r"^code_[0-9a-f]{16}$"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Variables the platform sets for the script (torchrun's and ours); the spec's `env` may not
# override them.
RESERVED_ENV: Final = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "PATH",
        "PYTHONPATH",
        "VIRTUAL_ENV",
        "PYTHONHOME",
        "LD_PRELOAD",
    }
)
RESERVED_ENV_PREFIXES: Final = ("TORCHYARD_", "TORCHELASTIC_")
Requirement = Annotated[str, Field(min_length=1, max_length=300)]
PARAM_NAME: Final = r"^[A-Za-z_][A-Za-z0-9_.-]*$"  # a name in `entrypoint.params`
Arg = Annotated[str, Field(max_length=4096)]


class EntrypointSpec(StrictSpec):
    """The user's own training program, run by torchrun on every rank.

    What the program sees (docs/CONTRACTS.md section 5): torchrun's `RANK`, `LOCAL_RANK`,
    `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`; the unpacked archive as its working directory;
    `TORCHYARD_RUN_DIR`, `TORCHYARD_CHECKPOINT_DIR`, `TORCHYARD_JOB_ID`, `TORCHYARD_ATTEMPT`,
    `TORCHYARD_PARAMS` (`params`); each of `inputs` read-only at `/inputs/<name>`, named by
    `TORCHYARD_INPUT_<NAME>`; an environment built from an allow-list plus `env` (no secret of
    the worker's). It reports
    through the `torchyard.train` module (`report`, `checkpoint_dir`, `latest_checkpoint`,
    `should_stop`, `completed_checkpoint`).
    """

    code: str = Field(
        pattern=CODE_ID_PATTERN,
        description="Id of a code archive of the job's project (`POST /v1/code`, or "
        "`torchyard submit --code DIR`).",
    )
    command: list[Arg] = Field(
        min_length=1,
        max_length=256,
        description="The argv each rank runs, in the archive's root, e.g. "
        '`["python", "train.py", "--lr", "3e-4"]`. `python` is the job\'s interpreter (the '
        "worker's, or the job's virtual environment with `requirements`); a `.py` script it "
        "names must be in the archive.",
    )
    env: dict[str, Annotated[str, Field(max_length=4096)]] = Field(
        default={},
        max_length=128,
        description="Extra environment variables for every rank. Names are "
        "`[A-Za-z_][A-Za-z0-9_]*`; `TORCHYARD_*`, `TORCHELASTIC_*`, torchrun's (`RANK`, "
        "`WORLD_SIZE`, `MASTER_ADDR`, ...), "
        "`PATH`, `PYTHONPATH` and `CUDA_VISIBLE_DEVICES` are the platform's.",
        # The same rules as `_env_names`, in the JSON Schema.
        json_schema_extra={
            "propertyNames": {
                "pattern": ENV_NAME.pattern,
                "not": {
                    "anyOf": [
                        {"enum": list[JsonValue](sorted(RESERVED_ENV))},
                        {"pattern": "^(" + "|".join(RESERVED_ENV_PREFIXES) + ")"},
                    ]
                },
            }
        },
    )
    requirements: list[Requirement] = Field(
        default=[],
        max_length=200,
        description="Packages to install for this job (PEP 508 lines such as "
        "`sentencepiece==0.2.0`) into a virtual environment layered over the worker's Python "
        "(its torch stays), cached by the sorted list and reused across jobs and attempts. A "
        "failed install fails the job as a `user_error`, not retried.",
    )
    params: dict[
        Annotated[str, Field(min_length=1, max_length=100, pattern=PARAM_NAME)],
        float | int | str | bool,
    ] = Field(
        default_factory=dict,
        max_length=100,
        json_schema_extra={"propertyNames": {"pattern": PARAM_NAME, "maxLength": 100}},
        description="The program's own hyperparameters (`lr: 0.001`), given to every rank as "
        "`TORCHYARD_PARAMS` (a JSON object) and read with `torchyard.train.params()`; a sweep "
        "sets them at `entrypoint.params.<name>`.",
    )
    inputs: Inputs = Field(
        default_factory=dict,
        max_length=MAX_INPUTS,
        description="What the program reads, by name (`[a-z][a-z0-9_]*`): a dataset of the "
        "project (`{dataset: ID_OR_NAME}`), a registered base model (`{base_model: NAME}`), a "
        "checkpoint of a job of the project (`{job: ID}` for its latest, or `{job: ID, "
        "checkpoint: CHECKPOINT_ID}`), or a path under the data roots (`{path: ...}`, local or "
        "`s3://`). Each is placed read-only at `/inputs/<name>` before the ranks start and named "
        "by `TORCHYARD_INPUT_<NAME>` and `torchyard.train.inputs()`; nothing else of the host is "
        "visible to the job.",
        json_schema_extra={"propertyNames": {"pattern": r"^[a-z][a-z0-9_]{0,62}$"}},
    )
    keep_last_checkpoints: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Complete checkpoints to keep (the newest); older ones are deleted as new "
        "ones complete. Null keeps all.",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"{name!r} is set by the platform and cannot be overridden")
        return env

    @field_validator("requirements")
    @classmethod
    def _requirement_lines(cls, requirements: list[str]) -> list[str]:
        for line in requirements:
            try:
                parsed = Pep508(line)
            except InvalidRequirement as exc:
                raise ValueError(f"{line!r} is not a PEP 508 requirement: {exc}") from None
            if parsed.url is not None:
                raise ValueError(f"{line!r}: URLs and paths are not allowed, name a package")
        return [line.strip() for line in requirements]

    @property
    def script(self) -> str | None:
        """The `.py` file `command` runs with `python` (`python [opts] train.py ...`), which
        must be in the archive; None for `python -m module` or another executable."""
        argv = self.command
        if argv[0] not in ("python", "python3") or len(argv) < 2:
            return argv[0] if argv[0].endswith(".py") else None
        for arg in argv[1:]:
            if arg in ("-m", "-c"):
                return None
            if not arg.startswith("-"):
                return arg
        return None
