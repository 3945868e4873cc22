"""The docs site builds with `mkdocs build --strict`: a broken link, a missing anchor or a page
left out of the nav is a warning (mkdocs.yml's `validation`), and strict turns any warning into
a failed build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
         "--site-dir", str(site)],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
    )  # fmt: skip


def test_the_docs_site_builds_strict_without_a_warning(tmp_path: Path) -> None:
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert result.returncode == 0 and not warnings, result.stderr
    for page in ("index.html", "reference/cli/index.html", "performance-history/index.html"):
        assert (tmp_path / "site" / page).is_file()


def test_every_docs_page_is_in_the_nav() -> None:
    """A page outside the nav is a warning too (`omitted_files`); this names it directly."""
    config = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert {page for page in pages if f" {page}\n" not in config} == set()


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    """The check above can fail: the same configuration refuses a link to a missing heading."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    docs = tmp_path / "docs"
    docs.mkdir()
    nav = [line.split(": ", 1)[1] for line in (ROOT / "mkdocs.yml").read_text().splitlines()
           if line.strip().startswith("- ") and line.strip().endswith(".md")]  # fmt: skip
    for page in nav:
        (docs / page).parent.mkdir(parents=True, exist_ok=True)
        (docs / page).write_text("# A page\n")
    (docs / "index.md").write_text("# Home\n\n[gone](concepts.md#no-such-heading)\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-heading" in result.stderr
