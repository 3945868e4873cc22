"""README.md keeps its promises: the two commands come first, it stays a front page, and what
it links to exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
# A Markdown link or image to a path of the repository (not a URL, not an in-page anchor).
LINK = re.compile(r"\]\((?!\w+://|#)([^)\s#]+)(?:#[^)\s]*)?\)")


def test_readme_starts_with_the_quickstart_and_test_commands() -> None:
    first_block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["bash scripts/quickstart.sh", "bash scripts/test.sh"]
    for script in ("scripts/quickstart.sh", "scripts/test.sh"):
        assert (ROOT / script).is_file()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    assert "exec bash scripts/test.sh" in (ROOT / ".ci/run").read_text()


def test_readme_is_a_front_page_and_the_rest_is_in_the_docs_site() -> None:
    """Issue 46: at 1,490 lines the README was read by no one; its guides are docs/ pages."""
    assert README.count("\n") < 300
    assert "<!-- spec-reference -->" not in README  # docs/reference/spec.md holds it


def test_every_path_the_readme_links_to_exists() -> None:
    """GitHub renders the README's relative links; the site's own links are checked by
    `mkdocs build --strict` (test_docs_site.py), which does not read the README."""
    linked = LINK.findall(README)
    assert "docs/getting-started.md" in linked
    missing = [path for path in linked if not (ROOT / path).exists()]
    assert not missing, f"README links to paths that do not exist: {missing}"
