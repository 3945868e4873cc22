"""The `entrypoint` kind of job spec: a script job carries none of the built-in trainer's
fields, its env and requirements are checked, and either kind parses as itself."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from jobspec.job import TRAINER_FIELDS, JobSpec, ScriptJobSpec, json_schema, parse_job_spec

CODE = "code_0123456789abcdef"


def _script(**entrypoint: Any) -> dict[str, Any]:
    return {
        "name": "mine",
        "entrypoint": {"code": CODE, "command": ["python", "train.py"]} | entrypoint,
    }


def test_each_kind_parses_as_itself() -> None:
    assert isinstance(parse_job_spec(_script()), ScriptJobSpec)
    assert isinstance(parse_job_spec({"name": "t", "data": {"uri": "/d"}}), JobSpec)


@pytest.mark.parametrize("field", TRAINER_FIELDS)
def test_a_trainer_field_beside_entrypoint_is_an_error_naming_it(field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_job_spec(_script() | {field: {}})
    errors = caught.value.errors()
    assert [e["loc"] for e in errors] == [(field,)]
    assert "built-in trainer" in errors[0]["msg"]


@pytest.mark.parametrize(
    ("env", "why"),
    [({"RANK": "3"}, "set by the platform"), ({"TORCHYARD_X": "1"}, "set by the platform"),
     ({"1BAD": "x"}, "not an environment variable name")],
)  # fmt: skip
def test_platform_variables_and_bad_names_are_refused_in_env(env: dict[str, str], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        parse_job_spec(_script(env=env))


@pytest.mark.parametrize("line", ["-e .", "--index-url https://x", "pkg @ https://x/p.whl", "a b"])
def test_requirements_are_pep508_names_without_options_urls_or_paths(line: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_job_spec(_script(requirements=[line]))
    assert caught.value.errors()[0]["loc"] == ("entrypoint", "requirements")


def test_good_requirements_and_env_are_kept() -> None:
    spec = parse_job_spec(
        _script(requirements=[" sentencepiece==0.2.0", "numpy>=1.26; python_version>'3.8'"],
                env={"MY_FLAG": "1"})
    )  # fmt: skip
    assert isinstance(spec, ScriptJobSpec)
    assert spec.entrypoint.requirements[0] == "sentencepiece==0.2.0"
    assert spec.entrypoint.env == {"MY_FLAG": "1"}


@pytest.mark.parametrize(
    ("command", "script"),
    [(["python", "train.py", "--lr", "3"], "train.py"), (["python3", "-u", "src/t.py"], "src/t.py"),
     (["python", "-m", "pkg.train"], None), (["bash", "run.sh"], None), (["t.py"], "t.py")],
)  # fmt: skip
def test_the_script_a_command_runs_is_found(command: list[str], script: str | None) -> None:
    spec = parse_job_spec(_script(command=command))
    assert isinstance(spec, ScriptJobSpec) and spec.entrypoint.script == script


def test_the_public_schema_offers_every_kind() -> None:
    refs = {item["$ref"].rsplit("/", 1)[-1] for item in json_schema()["oneOf"]}
    assert refs == {"JobSpec", "ScriptJobSpec", "EvalJobSpec"}
