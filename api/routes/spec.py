"""The job spec: its JSON Schema, and a check of a spec text that names the lines of its errors."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from api import openapi_examples, schemas
from api.deps import ReadPrincipal, SessionDep, SettingsDep
from api.errors import ERROR_RESPONSES, ErrorBody
from core.jobs import references, spec_yaml
from core.platform.errors import DomainError, InvalidInput
from core.submission import service as submission
from jobspec.job import json_schema, parse_job_spec

router = APIRouter(prefix="/v1/spec", tags=["spec"])

# A spec, as `POST /v1/jobs` takes it: JSON, or the same document written as YAML.
_SPEC = {
    "oneOf": [
        {"$ref": "#/components/schemas/JobSpec"},
        {"$ref": "#/components/schemas/ScriptJobSpec"},
        {"$ref": "#/components/schemas/EvalJobSpec"},
    ]
}
_TEXT_BODY = {
    "required": True,
    "content": {
        "application/yaml": {"schema": _SPEC, "example": openapi_examples.SPEC_YAML},
        "application/json": {"schema": _SPEC, "examples": openapi_examples.JOB_SPEC_EXAMPLES},
    },
}


@router.get("/schema", responses={200: openapi_examples.json_example(openapi_examples.SPEC_SCHEMA)})
def spec_schema() -> dict[str, Any]:
    """The JSON Schema of a job spec (JobSpec, ScriptJobSpec or EvalJobSpec), the body of
    `POST /v1/jobs`."""
    return json_schema()


async def _text(request: Request) -> str:
    """The raw body as UTF-8 text (the size is bounded by `api.limits.BodyLimit`)."""
    raw = await request.body()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            "body: not UTF-8 text",
            details=[{"loc": ["body"], "msg": f"not UTF-8: {exc.reason}", "type": "unicode"}],
        ) from None


def _pointer(path: tuple[str | int, ...]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


@router.post(
    "/validate",
    response_model=schemas.SpecCheck,
    responses={
        **ERROR_RESPONSES,
        403: {"model": ErrorBody, "description": "`data.uri` is outside the allowed data roots"},
    },
    openapi_extra={"requestBody": _TEXT_BODY},
)
def validate_spec(
    principal: ReadPrincipal,
    session: SessionDep,
    settings: SettingsDep,
    text: Annotated[str, Depends(_text)],
) -> schemas.SpecCheck:
    """Check a spec written as YAML or JSON exactly as `POST /v1/jobs` would, without submitting
    it; each error's `details` item also gives the `line` and `column` of its field."""
    doc = spec_yaml.parse(text)
    try:
        spec = parse_job_spec(doc.data)
        submission.check(
            session=session, settings=settings, project_id=principal.project_id, spec=spec
        )
    except ValidationError:
        # every problem at once: fields, the rules they hid, and the references (issue 28)
        details = references.problems(
            session=session, settings=settings, project_id=principal.project_id, data=doc.data
        )
        first = details[0]
        loc = list(first["loc"])
        where = ".".join(str(p) for p in (loc[1:] if loc[:1] == ["body"] else loc))
        more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
        raise InvalidInput(
            f"invalid spec: {where}: {first['msg']}{more}", details=_placed(doc, details)
        ) from None
    except DomainError as exc:
        exc.details = _placed(doc, exc.details)
        raise
    return schemas.SpecCheck(
        spec=doc.data, lines={_pointer(path): line for path, (line, _) in doc.positions.items()}
    )


def _placed(doc: spec_yaml.SpecDocument, details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`details` with the line and column of each `loc` (`["body", ...]`) in the text."""
    out = []
    for d in details:
        loc = list(d.get("loc", ()))
        line, column = doc.locate(loc[1:] if loc[:1] == ["body"] else loc)
        out.append({**d, "line": line, "column": column})
    return out
