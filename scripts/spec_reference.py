"""Render the JobSpec reference (Markdown) from its JSON Schema.

`python scripts/spec_reference.py` prints it; `--write` replaces the block between the
`<!-- spec-reference -->` markers in docs/reference/spec.md.
tests/unit/project/test_reference_docs.py keeps them in step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobspec.job import JobSpec, ScriptJobSpec

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "spec.md"
BEGIN, END = "<!-- spec-reference -->", "<!-- /spec-reference -->"


def _type(prop: dict[str, Any]) -> str:
    if "$ref" in prop:
        return "object"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop:
        return " or ".join(_type(p) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}))}"
    return str(kind)


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    return f"`{json.dumps(prop['default'])}`" if "default" in prop else "see below"


def render() -> str:
    """The built-in trainer's `JobSpec`, then `entrypoint`, what a `ScriptJobSpec` has instead
    of the trainer's sections."""
    lines = _render(JobSpec.model_json_schema())
    script = ScriptJobSpec.model_json_schema()
    entry = script["$defs"]["EntrypointSpec"]
    lines += [
        "",
        "**Your own code: `entrypoint`** — " + " ".join((ScriptJobSpec.__doc__ or "").split()),
    ]
    lines += ["", " ".join((entry.get("description") or "").split()), ""]
    lines += _render({**entry, "description": ""}, "entrypoint.", script["$defs"])
    return "\n".join(line.rstrip() for line in lines)


def _render(
    schema: dict[str, Any], prefix: str = "", defs: dict[str, Any] | None = None
) -> list[str]:
    defs = schema.get("$defs", {}) if defs is None else defs
    lines: list[str] = []

    def table(prefix: str, body: dict[str, Any]) -> None:
        lines.append("| field | type | default | meaning |")
        lines.append("|---|---|---|---|")
        nested = []
        required = set(body.get("required", []))
        for name, prop in body.get("properties", {}).items():
            path = f"{prefix}{name}"
            desc = prop.get("description", "").replace("|", "\\|").replace("\n", " ")
            default = _default(prop, name in required)
            lines.append(f"| `{path}` | {_type(prop)} | {default} | {desc} |")
            # a nested object, also a nullable one (`X | None`: anyOf [$ref, null])
            refs = [p["$ref"] for p in (prop, *prop.get("anyOf", [])) if "$ref" in p]
            if refs:
                nested.append((path, defs[refs[0].split("/")[-1]]))
        for path, sub in nested:
            lines.append("")
            lines.append(f"**`{path}`** — {sub.get('description', '').strip()}")
            lines.append("")
            table(f"{path}.", sub)

    table(prefix, schema)
    return lines


def main() -> int:
    text = render()
    if "--write" not in sys.argv:
        print(text)
        return 0
    page = PAGE.read_text()
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
