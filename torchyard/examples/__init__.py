"""The quickstart's example job specs (`*.yaml` next to this module), as `torchyard quickstart
--example` runs them; the offline data they train on is built by `demos.docstrings` and
`demos.sums`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

#: The directory of the example specs (package data, found next to this module).
SPECS_DIR = Path(__file__).resolve().parent


def load_example(name: str) -> dict[str, Any]:
    """The example spec `name` (`quickstart`, `chat_sft`, `dpo`) as a dict. Raises
    `FileNotFoundError` for an unknown name."""
    spec: dict[str, Any] = yaml.safe_load((SPECS_DIR / f"{name}.yaml").read_text())
    return spec
