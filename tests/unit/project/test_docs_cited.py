"""Every document the code and the docs cite exists in the repository, with the section named.

A docstring or comment that sends its reader to a Markdown file kept outside the repository (a
design note on someone's disk) leads nowhere. Cited `*.md` paths resolve from the repository
root or from `docs/`; a citation that names a section (the file, then a quoted heading, or
"section N") must find that heading in the file.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BASES = (ROOT, ROOT / "docs")
SKIP_DIRS = {"__pycache__", "build", "dist", "runs", "node_modules"}
# A path ending in `.md`: word characters, dots, dashes and slashes, a word character before
# `.md` (so a glob such as `*.md` is no citation), not glued to a longer word.
CITATION = re.compile(r"(?<![\w/.-])((?:\.{1,2}/)?\w(?:[\w./-]*\w)?\.md)\b")
# `<doc>.md, 'Section'` / `<doc>.md "Section"`: a named section of the cited file.
NAMED_SECTION = re.compile(r"(?<![\w/.-])(\w(?:[\w./-]*\w)?\.md),? ['\"]([^'\"\n]+)['\"]")
# `<doc>.md section 5` / `<doc>.md, section 5` / `section 5 of <doc>.md`: a numbered section
# (a heading `## 5.`).
NUMBERED_SECTION = re.compile(
    r"(?<![\w/.-])(\w(?:[\w./-]*\w)?\.md),? section (\d+)|section (\d+) of (\w(?:[\w./-]*\w)?\.md)"
)
URL = re.compile(r"\w+://\S+")


def python_files() -> list[Path]:
    """The project's Python files: everything under the root but hidden and build folders."""
    return sorted(
        path
        for path in ROOT.rglob("*.py")
        if not any(
            part.startswith(".") or part in SKIP_DIRS or part.endswith(".egg-info")
            for part in path.relative_to(ROOT).parts[:-1]
        )
    )


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_of_python(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python module; other strings (file
    names a program opens, test data) are code, not citations."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def citations(text: str) -> list[str]:
    """The `*.md` paths `text` cites (URLs left out: they point outside the repository)."""
    return CITATION.findall(URL.sub(" ", text))


def section_citations(text: str) -> list[tuple[str, str]]:
    """(path, heading wanted) of each citation of `text` that names a section."""
    text = " ".join(URL.sub(" ", text).split())  # a citation may wrap across lines
    found = [(path, f"'{name}'") for path, name in NAMED_SECTION.findall(text)]
    for path, number, number_before, path_after in NUMBERED_SECTION.findall(text):
        found.append((path or path_after, number or number_before))
    return found


def resolve(cited: str, near: Path | None = None) -> Path | None:
    """`cited` from the root, from `docs/`, or (a docs page's relative link, `../<page>.md`)
    from the folder of the document `near` that cites it."""
    for base in (*BASES, *([near.parent] if near is not None else [])):
        if (base / cited).is_file():
            return (base / cited).resolve()
    return None


def has_section(document: Path, wanted: str) -> bool:
    """`wanted` is a quoted name (a heading contains it) or a number (a heading `## N.`)."""
    headings = [line.lstrip("#").strip() for line in document.read_text().splitlines()
                if line.startswith("#")]  # fmt: skip
    if wanted.startswith("'"):
        return any(wanted.strip("'") in heading for heading in headings)
    return any(heading.startswith(f"{wanted}.") for heading in headings)


def cited_texts() -> Iterator[tuple[str, str]]:
    """(where, text) of every docstring, comment and Markdown document that may cite."""
    for path in python_files():
        for line, text in prose_of_python(path.read_text()):
            yield f"{path.relative_to(ROOT)}:{line}", text
    for path in markdown_files():
        yield str(path.relative_to(ROOT)), path.read_text()


def located_citations() -> Iterator[tuple[str, str]]:
    """(file:line, cited path) of every citation."""
    for where, text in cited_texts():
        path, _, first = where.partition(":")
        for offset, line in enumerate(text.splitlines()):
            for cited in citations(line):
                yield f"{path}:{int(first or 1) + offset}", cited


def test_every_cited_document_exists_in_the_repository() -> None:
    missing = [
        f"{where}: {cited}"
        for where, cited in located_citations()
        if resolve(cited, ROOT / where.partition(":")[0]) is None
    ]
    assert not missing, "cited documents that are not in the repository:\n" + "\n".join(missing)


def test_every_cited_section_is_a_heading_of_its_document() -> None:
    missing = []
    for where, text in cited_texts():
        for cited, wanted in section_citations(text):
            document = resolve(cited, ROOT / where.partition(":")[0])
            if document is not None and not has_section(document, wanted):
                missing.append(f"{where}: {cited}, section {wanted}")
    assert not missing, "cited sections that are not headings:\n" + "\n".join(missing)


_SAMPLE = '''"""Module docstring citing (NOTES.md) and docs/CONTRACTS.md section 5."""
import glob
README = "README.md"  # a comment citing sub/DIR.md, 'Some part'
FILES = glob.glob("*.md")


def f():
    """See https://example.com/x/ELSEWHERE.md and `section 2 of A.md`."""
'''


def test_the_scan_reads_docstrings_and_comments_but_not_code_strings_or_urls() -> None:
    found = [cited for _, text in prose_of_python(_SAMPLE) for cited in citations(text)]
    assert sorted(found) == ["A.md", "NOTES.md", "docs/CONTRACTS.md", "sub/DIR.md"]
    sections = [s for _, text in prose_of_python(_SAMPLE) for s in section_citations(text)]
    assert sorted(sections) == [
        ("A.md", "2"),
        ("docs/CONTRACTS.md", "5"),
        ("sub/DIR.md", "'Some part'"),
    ]


def test_the_scan_covers_every_package_and_the_docs() -> None:
    """The checks above run over what these find: an empty scan would pass vacuously."""
    scanned = {path.relative_to(ROOT).parts[0] for path in python_files()}
    assert scanned >= {"api", "core", "workers", "trainer", "jobspec", "dataformat", "tests"}
    assert {p.name for p in markdown_files()} >= {"README.md", "CONTRACTS.md"}
    assert resolve("CONTRACTS.md") == resolve("docs/CONTRACTS.md") == ROOT / "docs/CONTRACTS.md"
