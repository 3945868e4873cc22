"""docs/performance.md stays one table per bench, each row a figure (issue 46).

The page drifted back into a diary: the same figure measured on three days, each cell a story of
1,000-2,200 characters. Superseded rows and their narration belong in
docs/performance-history.md; these checks keep the main page's shape."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "performance.md"
HEADER = ["figure", "goal", "date", "host", "command"]
MAX_CELL_CHARS = 400
DATE = re.compile(r"\d{4}-\d{2}-\d{2}\b")


def cells(line: str) -> list[str]:
    """The cells of one Markdown table row (no `|` inside a cell on this page)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(text: str) -> list[list[list[str]]]:
    """Each table of the page as its rows of cells, the header first, the `|---|` rule dropped."""
    found: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
                current.append(cells(line))
        elif current:
            found.append(current)
            current = []
    return found


PAGE_TABLES = tables(PAGE.read_text())


def test_the_page_has_one_table_per_bench() -> None:
    headings = [line for line in PAGE.read_text().splitlines() if line.startswith("### ")]
    assert len(PAGE_TABLES) >= 20
    assert len(PAGE_TABLES) == len(headings)


def test_every_table_is_figure_goal_date_host_command() -> None:
    headers = [table[0] for table in PAGE_TABLES]
    assert [header for header in headers if header != HEADER] == []
    short = [row for table in PAGE_TABLES for row in table[1:] if len(row) != len(HEADER)]
    assert short == []


def test_no_cell_is_a_story() -> None:
    """A cell holds a figure, its configuration and a short clause; history holds the rest."""
    long = [
        (len(cell), cell[:80])
        for table in PAGE_TABLES
        for row in table[1:]
        for cell in row
        if len(cell) > MAX_CELL_CHARS
    ]
    assert long == []


def test_every_row_is_dated() -> None:
    undated = [row[2] for table in PAGE_TABLES for row in table[1:] if not DATE.match(row[2])]
    assert undated == []


def test_the_readme_performance_table_is_a_summary() -> None:
    """README's table names each bench's latest figure in a line; docs/performance.md has the
    rest (its 741-character fleet cell said what the page's table says)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    [table] = tables(section)
    assert table[0] == ["bench", "latest figure", "goal", "date"]
    long = [cell[:80] for row in table[1:] for cell in row if len(cell) > 200]
    assert long == []
    assert "(docs/performance.md)" in section
