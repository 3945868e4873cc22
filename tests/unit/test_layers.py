"""The import directions of DESIGN.md hold: each package imports only what it may."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "trainer": {"api", "core", "workers", "torchyard", "celery", "sqlalchemy", "fastapi", "redis"},
    "core": {"api", "workers", "torchyard", "fastapi", "celery", "torch"},
    "api": {"workers", "torchyard", "torch"},
    "workers": {"api", "torchyard", "fastapi"},
    "torchyard": {"api", "core", "workers", "torch", "sqlalchemy", "celery", "fastapi"},
}

# The trainer modules that import nothing heavier than pydantic: the job spec and the dataset
# record formats, which the API validates with.
PURE_TRAINER = ("trainer.spec", "trainer.records")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            if node.module == "trainer":
                names += [f"trainer.{a.name}" for a in node.names]
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            crosses = top in FORBIDDEN[package]
            # outside the trainer, only its pure pydantic modules may be imported
            trainer_internals = (
                package != "trainer" and top == "trainer" and name not in PURE_TRAINER
            )
            if crosses or trainer_internals:
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "imports crossing the layers of DESIGN.md:\n" + "\n".join(bad)
