"""The reference pages of the docs site are generated, and the committed pages are what the
generators print today: the job spec from its JSON Schema, the CLI from the typer app, the REST
API from the OpenAPI document. A changed field, option or route without its regenerated page
fails here, with the command that fixes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "docs" / "reference"


def generated(script: str) -> str:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout


def test_spec_reference_is_generated_from_the_current_schema() -> None:
    page = (REFERENCE / "spec.md").read_text()
    block = page.split("<!-- spec-reference -->")[1].split("<!-- /spec-reference -->")[0]
    assert block.strip() == generated("spec_reference.py").strip(), (
        "run: python scripts/spec_reference.py --write"
    )


@pytest.mark.parametrize(("page", "script"), [("cli.md", "cli_reference.py"),
                                              ("api.md", "api_reference.py")])  # fmt: skip
def test_reference_page_is_what_its_generator_prints_today(page: str, script: str) -> None:
    assert (REFERENCE / page).read_text() == generated(script), (
        f"run: python scripts/{script} --write"
    )


def test_the_cli_reference_has_every_command_of_the_app() -> None:
    """The walk reaches nested groups: a command two levels down is on the page."""
    page = (REFERENCE / "cli.md").read_text()
    for command in ("torchyard submit", "torchyard datasets register", "torchyard sweep best"):
        assert f"`{command}`" in page
    assert "No such option" not in page
