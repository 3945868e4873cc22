"""Render the REST API reference (Markdown) from the app's OpenAPI document.

`python scripts/api_reference.py` prints it; `--write` writes docs/reference/api.md.
tests/unit/project/test_reference_docs.py keeps the committed page equal to this output.

One section per tag, one entry per operation in the document's order: method and path, its
`operationId`, the permission it needs (`x-permission`), its description (the route's
docstring), its parameters, its request body's schema and its answers. The interactive
version of the same document is served by the API itself (`/docs`, `/redoc`, offline).
"""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "api.md"
METHODS = ("get", "post", "put", "patch", "delete")
TITLES = {"openai": "OpenAI view", "job data": "Job data"}
HEADER = """# REST API reference

Generated from the API's OpenAPI document (`python scripts/api_reference.py --write`). A
running API serves the document itself at `/openapi.json` and interactive docs at `/docs` and
`/redoc` (offline: no CDN). Every request under `/v1` carries `Authorization: Bearer <key>`
(an API key, or an OIDC access token: [Security](../security.md)); every error has one body
shape, `{"error": {"code", "message", "details": [{"loc", "msg", "type"}]}}`. Each
operation's example request and answer are in the document, valid against its schemas.
"""


def _escape(text: str) -> str:
    """`<` outside code spans as `&lt;`, so Markdown does not read `<api key>` as an HTML tag;
    inside backticks it is shown as written."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _cell(text: str) -> str:
    return _escape(" ".join(str(text).split()).replace("|", "\\|").replace("*", "\\*"))


def _schema_name(schema: dict[str, Any]) -> str:
    """A schema as a reader names it: its component's name, a list of one, or a union."""
    if "$ref" in schema:
        return f"`{schema['$ref'].rsplit('/', 1)[-1]}`"
    for union in ("oneOf", "anyOf"):
        if union in schema:
            names = [_schema_name(s) for s in schema[union] if s.get("type") != "null"]
            return " or ".join(names)
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def _body(content: dict[str, Any]) -> str:
    return "; ".join(
        f"{_schema_name(media.get('schema', {}))} (`{kind}`)" for kind, media in content.items()
    )


def _operation(method: str, path: str, op: dict[str, Any]) -> list[str]:
    lines = ["", f"### `{method.upper()} {path}`", ""]
    facts = [f"`{op['operationId']}`"]
    if op.get("x-permission"):
        facts.append(f"permission `{op['x-permission']}`")
    lines += [" · ".join(facts), ""]
    description = inspect.cleandoc(op.get("description") or op.get("summary") or "")
    if description:
        lines += [_escape(description), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | required | meaning |", "|---|---|---|---|"]
        for param in params:
            meaning = param.get("description") or param.get("schema", {}).get("description", "")
            required = "yes" if param.get("required") else "no"
            row = f"`{param['name']}` | {param['in']} | {required} | {_cell(meaning)}"
            lines.append(f"| {row} |")
        lines.append("")
    if "requestBody" in op:
        lines += [f"Body: {_body(op['requestBody'].get('content', {}))}", ""]
    lines += ["| answer | meaning |", "|---|---|"]
    for code, answer in op.get("responses", {}).items():
        body = _body(answer.get("content", {}))
        meaning = _cell(answer.get("description", "")) + (f": {body}" if body else "")
        lines.append(f"| {code} | {meaning} |")
    return lines


def render() -> str:
    """The whole page from `api.main.create_app().openapi()`, built with the server settings
    of a bare environment (no `TORCHYARD_*` variable), so the page is the same on any host."""
    for name in [name for name in os.environ if name.startswith("TORCHYARD_")]:
        del os.environ[name]
    from api.main import create_app

    document = create_app().openapi()
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                tag = (item[method].get("tags") or ["other"])[0]
                by_tag.setdefault(tag, []).append((method, path, item[method]))
    lines = HEADER.splitlines()
    for tag, operations in by_tag.items():
        lines += ["", f"## {TITLES.get(tag, tag[0].upper() + tag[1:])}"]
        for method, path, op in operations:
            lines += _operation(method, path, op)
    return "\n".join(line.rstrip() for line in lines) + "\n"


def main() -> int:
    text = render()
    if "--write" in sys.argv:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
