"""No module of the product grows past ~500 lines without saying why (issue 25): a long module
usually holds two things, and its docstring is where a reader learns whether it does."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("api", "core", "workers", "trainer", "jobspec", "dataformat", "torchyard")
LIMIT = 500
REASON = "on purpose:"


def test_every_module_over_the_limit_says_why_in_its_docstring() -> None:
    long = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            if text.count("\n") > LIMIT:
                long[path.relative_to(ROOT)] = ast.get_docstring(ast.parse(text)) or ""
    assert long  # the scan saw the known long modules
    unexplained = [str(p) for p, doc in long.items() if REASON not in doc]
    assert not unexplained, f"over {LIMIT} lines without a reason ('{REASON}'): {unexplained}"


FOLDER_LIMIT = 25  # modules in one folder: past it, a newcomer no longer finds a home by name


def test_no_package_folder_is_flat_past_the_limit() -> None:
    """Issue 25: folders by domain, so that any behaviour's home is found from folder names in
    one step (`workers/` had grown to 33 modules side by side)."""
    flat = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(ROOT / package).rglob("*/")]:
            if "__pycache__" in folder.parts or "static" in folder.parts:
                continue
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > FOLDER_LIMIT:
                flat[str(folder.relative_to(ROOT))] = len(modules)
    assert not flat, f"folders with more than {FOLDER_LIMIT} modules: {flat}"
