"""The import directions of DESIGN.md hold: each package imports only what it may."""

from __future__ import annotations

import ast
import subprocess
import sys
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

# The trainer modules that import neither torch nor numpy: the job spec (and its sections) and
# the dataset record formats, which the API validates with, and the JSONL reader upload
# validation shares with the trainer.
PURE_TRAINER = (
    "trainer.spec",
    "trainer.spec_base",
    "trainer.spec_data",
    "trainer.spec_method",
    "trainer.records",
    "trainer.jsonl",
)


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


@pytest.mark.parametrize("module", PURE_TRAINER)
def test_pure_trainer_modules_import_neither_torch_nor_numpy(module: str) -> None:
    """What the API imports of the trainer loads no tensor library (checked in a fresh
    interpreter: the modules' transitive imports, not only their own lines)."""
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
