"""README.md keeps its promises: the two commands exist and the spec reference is current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def test_readme_starts_with_the_quickstart_and_test_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    for script in ("scripts/quickstart.sh", "scripts/test.sh"):
        assert (ROOT / script).is_file()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    assert "exec bash scripts/test.sh" in (ROOT / ".ci/run").read_text()


def test_spec_reference_in_readme_is_generated_from_the_current_schema() -> None:
    rendered = subprocess.run(
        [sys.executable, str(ROOT / "scripts/spec_reference.py")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    block = README.split("<!-- spec-reference -->")[1].split("<!-- /spec-reference -->")[0]
    assert block.strip() == rendered, "run: python scripts/spec_reference.py --write"
