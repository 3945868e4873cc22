"""The YAML blocks of the repository's Markdown docs, for the tests that hold the docs' specs
to what the server accepts (`tests/unit/project/test_doc_specs.py`, the README sweep in
`tests/integration/workers/test_sweeps.py`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def yaml_blocks(path: Path) -> list[tuple[str, str]]:
    """(`file:line`, text) of every ```yaml block of `path`."""
    text = path.read_text()
    return [
        (f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1))
        for m in re.finditer(r"```ya?ml\n(.*?)```", text, re.S)
    ]
