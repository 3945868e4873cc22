"""The import rules hold (docs/ARCHITECTURE.md, 'Import rules'): each package imports only what
it may."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVER = {"api", "core", "workers", "torchyard"}
FORBIDDEN = {
    "trainer": {"api", "core", "workers", "torchyard", "celery", "sqlalchemy", "fastapi", "redis"},
    "core": {"api", "workers", "torchyard", "fastapi", "celery", "torch"},
    "api": {"workers", "torchyard", "torch"},
    "workers": {"api", "torchyard", "fastapi"},
    "torchyard": {"api", "core", "workers", "torch", "sqlalchemy", "celery", "fastapi"},
    # the torch-free vocabularies both sides share import neither side
    "dataformat": {
        *SERVER,
        "trainer",
        "jobspec",
        "torch",
        "celery",
        "sqlalchemy",
        "fastapi",
        "redis",
    },
    # the job spec: pydantic models every side validates with, importing only `dataformat`
    "jobspec": {*SERVER, "trainer", "torch", "numpy", "celery", "sqlalchemy", "fastapi", "redis"},
    # builders of the examples' model and tokenizer: torch and transformers, no service
    "demos": {*SERVER, "trainer", "celery", "sqlalchemy", "fastapi", "redis"},
}

# The API, core, the workers and the client share the job spec with the trainer through
# `jobspec` (pure pydantic), and record formats, JSONL, YAML 1.2, failure classes, masks and
# readers through `dataformat`: neither imports the trainer, and none of them import the
# trainer at all (no exception).
SPEC_MODULES = tuple(sorted(f"jobspec.{p.stem}" for p in (ROOT / "jobspec").glob("[!_]*.py")))
# What a user's training script imports (`torchyard.train`, section 5 of CONTRACTS.md) writes
# the events file with the trainer's own torch-free writer rather than a copy of it.
TRAIN_API_TRAINER = ("trainer.events",)
TRAIN_API_DATAFORMAT = ("dataformat.failures",)
DATAFORMAT = tuple(sorted(f"dataformat.{p.stem}" for p in (ROOT / "dataformat").glob("[!_]*.py")))
# The spec, the record formats, the JSONL reader, YAML 1.2, failure classes and exit errors
# import neither torch nor numpy; what the mask preview renders with (chat templates, masks,
# readers) uses numpy, jinja2 and `transformers`' fast tokenizer classes, but never torch.
NUMPY_USERS = ("dataformat.chat", "dataformat.masks", "dataformat.readers")


def _imports(path: Path) -> list[str]:
    """Every module `path` imports, at any depth (lazy imports in functions too); `from pkg
    import name` of a package counts as `pkg.name`."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in ("trainer", "dataformat", "core"):
                names += [f"{node.module}.{a.name}" for a in node.names]
            else:
                names.append(node.module)
    return names


def _trainer_allowed(path: Path) -> tuple[str, ...]:
    if path.is_relative_to(ROOT / "torchyard" / "train"):
        return TRAIN_API_TRAINER
    return ()


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            crosses = top in FORBIDDEN[package]
            trainer_internals = (
                package != "trainer" and top == "trainer" and name not in _trainer_allowed(path)
            )
            if crosses or trainer_internals:
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "imports crossing the layers of docs/ARCHITECTURE.md:\n" + "\n".join(bad)


# `core`'s domain packages as a one-way stack (docs/ARCHITECTURE.md): each imports only the
# packages listed before it; `core.admin` (the server's command line) sits on top of them all.
CORE_STACK = (
    "platform",
    "access",
    "webhooks",
    "datasets",
    "jobs",
    "usage",
    "scheduling",
    "submission",
    "attempts",
    "sweeps",
    "sessions",
    "openai",
)


def _core_package(path: Path) -> str | None:
    parts = path.relative_to(ROOT / "core").parts
    return parts[0] if len(parts) > 1 else None


def test_core_packages_form_a_one_way_stack() -> None:
    """No `core` domain package imports one above it in `CORE_STACK`, nor leaves the stack
    (every package of `core/` is listed; `core/` holds no flat module but `admin`)."""
    on_disk = {p.name for p in (ROOT / "core").iterdir() if (p / "__init__.py").exists()}
    assert on_disk == set(CORE_STACK)
    assert {p.stem for p in (ROOT / "core").glob("*.py")} == {"__init__", "admin"}
    bad = []
    for path in sorted((ROOT / "core").rglob("*.py")):
        package = _core_package(path)
        if package is None:
            continue
        below = set(CORE_STACK[: CORE_STACK.index(package) + 1])
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "core" and len(parts) > 1 and parts[1] not in below:
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, "core packages importing one above them:\n" + "\n".join(bad)


def test_the_layer_check_sees_a_server_module_importing_the_trainer(tmp_path: Path) -> None:
    """The check above fails on a server module importing the trainer, in any form:
    `import trainer.x`, `from trainer import x`, lazily inside a function."""
    source = tmp_path / "m.py"
    source.write_text(
        "import trainer.masks\n"
        "from trainer import records\n"
        "from trainer.spec import JobSpec\n"
        "def f():\n    from trainer.failures import classify\n"
    )
    names = _imports(source)
    assert names == ["trainer.masks", "trainer.records", "trainer.spec", "trainer.failures"]
    allowed = _trainer_allowed(ROOT / "core" / "x.py")
    assert [n for n in names if n not in allowed] == names
    assert _trainer_allowed(ROOT / "dataformat" / "x.py") == ()


# Renders a preview with a saved fast tokenizer, the way core.datasets.preview does, then says
# which torch modules the interpreter holds. Imports are lazy in transformers, so the preview
# must run, not just import.
_PREVIEW_WITHOUT_TORCH = """
import sys
import api.main
from core.datasets import preview as dataset_preview
from core.platform.settings import Settings
from dataformat import chat, errors, masks, readers, records
from jobspec import checks, job as spec
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
    from tests.support.sft_data import bpe_tokenizer

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


@pytest.mark.parametrize("module", [*SPEC_MODULES, *DATAFORMAT])
def test_shared_modules_import_no_tensor_library_and_dataformat_no_trainer(module: str) -> None:
    """What the API shares with the trainer (`jobspec`, `dataformat`) loads no torch, most of it
    not even numpy, and no trainer module (checked in a fresh interpreter: the modules'
    transitive imports, not only their own lines)."""
    banned = ("torch",) if module in NUMPY_USERS else ("torch", "numpy")
    banned = (*banned, "trainer")
    code = f"import sys, {module}; print(sorted(m for m in {banned!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_dataformat_holds_the_modules_the_server_shares_with_the_trainer() -> None:
    """The parametrized check above runs over every module the package holds (a glob): an empty
    or misplaced package would make it pass vacuously."""
    assert set(DATAFORMAT) >= {
        f"dataformat.{m}"
        for m in ("records", "jsonl", "yaml12", "failures", "masks", "readers", "chat", "errors")
    }
    assert set(NUMPY_USERS) <= set(DATAFORMAT)


_TRAIN_API_IMPORTS = """
import sys
import torchyard.train, torchyard.train.__main__
top = {m.split(".")[0] for m in sys.modules}  # less site's hooks (`_distutils_hack`, ...)
print(sorted(m for m in top - {"torchyard", "trainer", "dataformat"} - sys.stdlib_module_names
             if not m.startswith("_")))
print(sorted(m for m in sys.modules if m.startswith("trainer")))
print(sorted(m for m in sys.modules if m.startswith("dataformat")))
"""


def test_the_train_api_imports_only_the_standard_library_and_the_events_writer() -> None:
    """A user's script imports `torchyard.train` wherever it runs: no third-party package (not
    even the SDK's httpx or pydantic) and of the trainer and `dataformat` only the torch-free
    events writer and failure classes."""
    out = subprocess.run(
        [sys.executable, "-c", _TRAIN_API_IMPORTS], cwd=ROOT, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    third_party, trainer, dataformat = out.stdout.strip().splitlines()
    assert third_party == "[]"
    assert set(eval(trainer)) <= {"trainer", *TRAIN_API_TRAINER}
    assert set(eval(dataformat)) <= {"dataformat", *TRAIN_API_DATAFORMAT}


# httpx imports its own optional command line (`httpx._main`: click, rich) when they are
# installed; blocked here, what is left is what the SDK itself loads.
_SDK_IMPORTS = """
import sys
sys.modules["httpx._main"] = None
from torchyard import Client
Client  # the lazy name resolves: torchyard.client and every resource module it uses
print(sorted(m for m in ("typer", "rich", "click") if m in sys.modules))
"""


def test_the_sdk_client_imports_neither_typer_nor_rich() -> None:
    """`from torchyard import Client` is the SDK: no command-line framework, no terminal
    rendering (those live in `torchyard.cli`)."""
    out = subprocess.run(
        [sys.executable, "-c", _SDK_IMPORTS], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
