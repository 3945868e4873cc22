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

# The trainer modules the API and core may import. The job spec (and its sections), the record
# formats and the JSONL reader import neither torch nor numpy; what the mask preview renders
# with (chat templates, masks, readers) uses numpy, jinja2 and `transformers`' fast tokenizer
# classes, but never torch.
NUMPY_FREE = (
    "trainer.spec",
    "trainer.spec_base",
    "dataformat.failures",
    "dataformat.yaml12",
    "trainer.spec_data",
    "trainer.spec_method",
    "dataformat.records",
    "dataformat.jsonl",
)
PURE_TRAINER = (
    *NUMPY_FREE,
    "trainer.spec_checks",
    "dataformat.errors",
    "dataformat.chat",
    "dataformat.masks",
    "dataformat.readers",
)
# What a user's training script imports (`torchyard.train`, section 5 of CONTRACTS.md) writes
# the events file with the trainer's own torch-free writer rather than a copy of it.
TRAIN_API_TRAINER = ("trainer.events", "dataformat.failures")


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
            allowed = PURE_TRAINER
            if path.is_relative_to(ROOT / "torchyard" / "train"):
                allowed = (*PURE_TRAINER, *TRAIN_API_TRAINER)
            trainer_internals = package != "trainer" and top == "trainer" and name not in allowed
            if crosses or trainer_internals:
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "imports crossing the layers of DESIGN.md:\n" + "\n".join(bad)


# Renders a preview with a saved fast tokenizer, the way core.dataset_preview does, then says
# which torch modules the interpreter holds. Imports are lazy in transformers, so the preview
# must run, not just import.
_PREVIEW_WITHOUT_TORCH = """
import sys
import api.main
from core import dataset_preview
from core.settings import Settings
from dataformat import chat, errors, masks, readers, records
from trainer import spec, spec_checks
model = spec.ModelSpec(kind="hf", hf={"path_or_id": sys.argv[1]})
tokenizer = dataset_preview.load_tokenizer(model, Settings(data_roots=[sys.argv[1]]))
template = dataset_preview._template(chat.CHATML, tokenizer)  # compiled, as a custom one
record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
shown = masks.preview(
    [("x.jsonl:1", record)], format="messages", tokenizer=tokenizer,
    template=template, loss_on=None, seq_len=64, truncation="drop", max_truncated_share=0.1,
)
assert shown["refused"] is None, shown["refused"]
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_the_preview_modules_run_without_importing_torch(tmp_path: Path) -> None:
    from tests.unit.sft_data import bpe_tokenizer

    bpe_tokenizer().save_pretrained(tmp_path / "tok")
    done = subprocess.run(
        [sys.executable, "-c", _PREVIEW_WITHOUT_TORCH, str(tmp_path / "tok")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("module", PURE_TRAINER)
def test_pure_trainer_modules_import_no_tensor_library(module: str) -> None:
    """What the API imports of the trainer loads no torch, and the spec/record modules not
    even numpy (checked in a fresh interpreter: the modules' transitive imports, not only
    their own lines)."""
    banned = ("torch", "numpy") if module in NUMPY_FREE else ("torch",)
    code = f"import sys, {module}; print(sorted(m for m in {banned!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


_TRAIN_API_IMPORTS = """
import sys
import torchyard.train, torchyard.train.__main__
top = {m.split(".")[0] for m in sys.modules}  # less site's hooks (`_distutils_hack`, ...)
print(sorted(m for m in top - {"torchyard", "trainer", "dataformat"} - sys.stdlib_module_names
             if not m.startswith("_")))
print(sorted(m for m in sys.modules if m.startswith("trainer")))
"""


def test_the_train_api_imports_only_the_standard_library_and_the_events_writer() -> None:
    """A user's script imports `torchyard.train` wherever it runs: no third-party package (not
    even the SDK's httpx or pydantic) and of the trainer only its torch-free modules."""
    out = subprocess.run(
        [sys.executable, "-c", _TRAIN_API_IMPORTS], cwd=ROOT, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    third_party, trainer = out.stdout.strip().splitlines()
    assert third_party == "[]"
    assert set(eval(trainer)) <= {"trainer", *TRAIN_API_TRAINER}
