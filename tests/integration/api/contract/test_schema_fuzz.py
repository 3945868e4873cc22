"""The whole OpenAPI contract, fuzzed: every operation with schemathesis, every check on.

Schemathesis reads the app's OpenAPI document and, per operation, sends the schema's examples,
its coverage cases (the boundaries of every constraint) and generated requests, valid and
invalid by the schema, to the real app (in process, on the session's Postgres) with an
organisation admin key of a fresh project. Every response must pass every check: no 5xx; a
status code, content type, body and headers the schema documents for the operation; a request
the schema allows is accepted (or answered 401/403/404/409/429, as documented), one it forbids
is refused with a 4xx; a 405 lists every documented method in `Allow`.

Deterministic (`derandomize`, a fixed number of examples per operation), so a failure repeats.
The document is built at import (schemathesis parametrizes at collection, one test per
operation); the test first proves the app it calls serves exactly that document.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance
from schemathesis.config import SchemathesisConfig
from sqlalchemy import Engine

from api.main import create_app
from core.access import auth
from core.platform.db import session_scope
from core.platform.settings import Settings

# Examples per operation and generation mode (valid, invalid) of the fuzzing phase.
MAX_EXAMPLES = 5
# A job spec has ~150 fields: the coverage phase (every boundary of every field) sends
# hundreds of requests to each of these. The quick test fuzzes them without it;
# `test_spec_operations_cover_every_boundary` (marked long) adds it.
SPEC_OPERATIONS = [
    "jobs_create",
    "spec_validate",
    "datasets_preview",
    "openai_fine_tuning_jobs_create",
]

# The org admin key's secret, known at collection so schemathesis sends it as the schema's
# `HTTPBearer` credentials (and knows when it leaves them out on purpose).
SECRET = auth.KEY_PREFIX + secrets.token_urlsafe(32)


# `forward_backward`'s body is protobuf bytes (`format: binary`): sent as they are, as an
# `application/octet-stream` body is.
schemathesis.serializer.alias("application/x-protobuf", "application/octet-stream")


def _config(*, coverage_of_specs: bool) -> SchemathesisConfig:
    return SchemathesisConfig.from_dict(
        {
            # Under /tinker the key goes as the `tinker` client sends it (`X-API-Key: tml-...`).
            "auth": {
                "openapi": {
                    "HTTPBearer": {"bearer": SECRET},
                    "APIKeyHeader": {"api_key": f"tml-{SECRET}"},
                }
            },
            "checks": {"enabled": True},
            "phases": {
                "examples": {"enabled": True},
                "coverage": {"enabled": True},
                "fuzzing": {"enabled": True},
                "stateful": {"enabled": False},
            },
            # Strings are Unicode text without NUL: a lone surrogate is no text, and Postgres
            # stores no NUL (both are refused with 422 `string_unicode`, not stated per field).
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,
                "allow-x00": False,
                "codec": "utf-8",
            },
            "operations": [
                {"include-operation-id": op, "phases": {"coverage": {"enabled": False}}}
                for op in SPEC_OPERATIONS
                if not coverage_of_specs
            ],
        }
    )


# The contract: the document depends on no setting a test session changes.
DOCUMENT = create_app(Settings(env="test")).openapi()


class _AppUnderTest:
    """An ASGI app that forwards to the app a fixture sets (lifespan included): schemathesis
    needs its app at collection, the real one needs the session's database."""

    app: FastAPI | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert self.app is not None, "the app_under_test fixture sets the app"
        await self.app(scope, receive, send)


APP = _AppUnderTest()
schema = schemathesis.openapi.from_dict(DOCUMENT, config=_config(coverage_of_specs=False))
schema.app = APP
spec_schema = schemathesis.openapi.from_dict(
    DOCUMENT, config=_config(coverage_of_specs=True)
).include(operation_id=SPEC_OPERATIONS)
spec_schema.app = APP


@pytest.fixture(scope="module")
def app_under_test(settings: Settings) -> Iterator[FastAPI]:
    """The app on the session's database, serving exactly the fuzzed document."""
    app = create_app(settings)
    assert app.openapi() == DOCUMENT
    APP.app = app
    yield app


@pytest.fixture(scope="module")
def org_admin_key(engine: Engine) -> str:
    """SECRET as a fresh project's organisation admin key: it may call every operation."""
    with session_scope(engine) as s:
        project = auth.create_project(session=s, name=f"fuzzed-{secrets.token_hex(4)}")
        _, key = auth.new_key_row(project_id=project.id, name="fuzz")
        key.key_hash, key.prefix, key.org_admin = auth.hash_key(SECRET), SECRET[:10], True
        s.add(key)
    return SECRET


# 422s that no schema can foresee, so a request valid by the schema may get them (the check
# "schema-valid request accepted" does not apply to them; every other check does): (where,
# error type or None for any). A `loc` starts with one of these.
SEMANTIC: dict[tuple[str, ...], str | None] = {
    # An opaque cursor or `after` must be one this API handed out (for this project).
    ("query", "cursor"): None,
    ("query", "after"): None,
    # `until - since` is at most 400 days: a relation between two parameters.
    ("query", "until"): "value_error",
    # The webhook's host must resolve to an address the SSRF check allows (DNS, settings).
    ("body", "url"): "ssrf_refused",
    # An uploaded file's bytes must be an archive / records of its format.
    ("body", "file"): None,
    # `limits.max_cost` needs a price for the job's pool (a server setting).
    ("body", "limits", "max_cost"): None,
    # `data.dataset` and `entrypoint.code` must name a dataset / archive of the project.
    ("body", "data", "dataset"): "value_error",
    ("body", "data", "eval_dataset"): "value_error",
    ("body", "entrypoint", "code"): "entrypoint",
    # A GRPO job's `method.grpo.code` must name an archive of the project that holds each
    # python grader's `file`.
    ("body", "method", "grpo", "code"): "grader_code",
    ("body", "method", "grpo", "graders"): "grader_code",
    # `entrypoint.inputs` name datasets, jobs, base models and paths the project and server
    # must hold (each alone a 403, 404 or 409; with others, one 422 listing all).
    ("body", "entrypoint", "inputs"): None,
    # A refused spec lists its references' problems beside its fields' (issue 28): a data path
    # the server's roots must hold, a model directory it may read, an `init_from` of the
    # project (each alone is a 403, 404 or 409; beside a field error, one more detail).
    ("body", "data", "uri"): None,
    ("body", "data", "eval_uri"): None,
    ("body", "model", "hf"): None,
    ("body", "model", "init_from"): None,
    # An eval job's source must be a trainer job of the project with a complete checkpoint,
    # its datasets of the project and of a format each evaluation reads.
    ("body", "evaluate", "source"): None,
    ("body", "evaluate", "evaluations"): None,
    ("body", "eval_after", "evaluations"): None,
    # Each of `entrypoint.requirements` is a PEP 508 line (packaging's grammar: no pattern
    # states it).
    ("body", "entrypoint", "requirements"): "value_error",
    # A job spec's rules across fields and sections (`jobspec/checks.py`: meshes divide
    # heads, eval interval within max_steps, ...; BODY_RULES below); the simple ones are in the
    # JSON Schema too.
    # A sweep (`POST /v1/sweeps`): its base spec is checked as a job's (the same references
    # and rules, under `base`), and its search space against that base (`jobspec/sweep.py`:
    # a path must be a field of the base that takes each value drawn).
    ("body", "base", "data", "dataset"): "value_error",
    ("body", "base", "data", "eval_dataset"): "value_error",
    ("body", "base", "entrypoint", "code"): "entrypoint",
    ("body", "base", "method", "grpo", "code"): "grader_code",
    ("body", "base", "method", "grpo", "graders"): "grader_code",
    ("body", "base", "entrypoint", "inputs"): None,
    ("body", "base", "entrypoint", "requirements"): "value_error",
    ("body", "base", "limits", "max_cost"): None,
    ("body", "base"): "spec_conflict",
    ("body", "space"): None,
    # A Tinker session's `project_id`, when given, must be the key's own project (id or name).
    ("body", "project_id"): "value_error",
}
# Error types refused anywhere in a body: a job spec's rules across fields (above), a sweep's
# rules between its space, metric and base, and a grader's rules no schema states, wherever
# graders sit (`method.grpo.graders`, a `reward` evaluation's, under a sweep's base): a python
# grader's `source` defines `grade` and its `file` is a relative `.py` path (and none in an
# eval job, which has no code directory), a multi grader's names and formula; and a binary body that
# is not the protobuf message it should be (`forward_backward`: no schema states protobuf).
BODY_RULES = ("spec_conflict", "sweep_conflict", "grader_source", "grader_file", "grader_names",
              "grader_formula", "protobuf",
              "load_addressing")  # Tinker's load_weights: into a client, or a new one  # fmt: skip

# Under /openai/v1 (OpenAI's error body names one `param`): ids of this project's files and
# jobs, names of the server's base models (`TORCHYARD_BASE_MODELS`), a file's records.
OPENAI_REFERENCES = {"after", "model", "training_file", "validation_file", "file"}
# A reinforcement job's grader (`jobspec.graders`), by rules no schema states: a python grader's
# `source` is Python that defines `grade` and its `file` a relative `.py` path, exactly one of
# them (at the grader); a multi grader's `calculate_output` is a formula over its graders'
# names, which are no Python keywords, and its graders have no `weight` (at the grader).
OPENAI_GRADER_RULES = re.compile(
    r"method\.reinforcement\.grader(\.graders\.\w+)?(\.source|\.file|\.calculate_output)?"
)


def _semantic_refusal(response: Any) -> bool:
    """A 422 (Torchyard's error body) or, under /openai/v1, a 400 (OpenAI's) whose every
    problem is one of SEMANTIC / OPENAI_REFERENCES."""
    if response.status_code not in (400, 422):
        return False
    error = response.json()["error"]
    if "details" not in error:  # OpenAI's shape: only the first bad field, as `param`
        param = error.get("param") or ""
        return response.status_code == 400 and (
            param in OPENAI_REFERENCES or OPENAI_GRADER_RULES.fullmatch(param) is not None
        )
    problems = [(tuple(str(p) for p in d["loc"]), d["type"]) for d in error["details"]]
    return bool(problems) and all(_semantic(loc, kind) for loc, kind in problems)


def _semantic(loc: tuple[str, ...], kind: str | None) -> bool:
    if loc[:1] == ("body",) and kind in BODY_RULES:
        return True
    return any(
        loc[: len(where)] == where and expected in (None, kind)
        for where, expected in SEMANTIC.items()
    )


def _call_and_validate(case: Any) -> None:
    response = case.call()
    excluded = [positive_data_acceptance] if _semantic_refusal(response) else []
    case.validate_response(response, excluded_checks=excluded)


_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


@schema.parametrize()
@_SETTINGS
def test_every_operation_conforms_to_its_schema(
    case: Any, app_under_test: FastAPI, org_admin_key: str
) -> None:
    _call_and_validate(case)


@pytest.mark.long
@spec_schema.parametrize()
@_SETTINGS
def test_spec_operations_cover_every_boundary(
    case: Any, app_under_test: FastAPI, org_admin_key: str
) -> None:
    _call_and_validate(case)
