"""No import circle among the project's modules (issue 25): a circle makes import order matter,
hides which layer owns what, and was how `trainer/` grew four of them. Every import counts,
at module level or inside a function (a lazy import is still a dependency); only imports
under `if TYPE_CHECKING:` are left out, as they never run. The stdlib's `graphlib` finds a
circle."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGES = (
    "api",
    "core",
    "workers",
    "trainer",
    "jobspec",
    "dataformat",
    "torchyard",
    "migrations",
    "demos",
)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported_names(tree: ast.Module, type_only: bool = False) -> list[str]:
    """Dotted names each import statement may load (a `from a import b` may load `a.b`); with
    `type_only`, those under `if TYPE_CHECKING:` too."""
    type_checking = {
        id(inner)
        for node in ast.walk(tree)
        if not type_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    return names


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """module -> the project modules it imports (the longest project prefix of each name);
    with `type_only`, counting the imports made for type checking only."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for imported in _imported_names(ast.parse(path.read_text()), type_only):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_the_project_has_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 200  # the scan found the project's modules
    assert "trainer.loop" in graph["trainer.train"]  # and their imports, lazy ones too
    assert "trainer.models.init_from" in graph["trainer.models.network"]
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_the_loop_imports_no_training_method() -> None:
    """The loop runs whatever `trainer.loop.Method` the run holds (issue 25): it imports
    no method module, so it cannot branch on DPO or SFT; `trainer.train` picks the method."""
    graph = import_graph()
    assert "trainer.methods.dpo_train" in graph["trainer.train"]  # the scan sees the builder's
    assert not {m for m in graph["trainer.loop"] if m.startswith("trainer.methods")}


# Circles closed only by imports under `if TYPE_CHECKING:` (a type names its user). Issue 46
# removed the last six: the SDK client and its resources (`torchyard.transport.Transport`),
# `core.datasets` formats and tokens (`problems`), the trainer's loop and its methods (the loop
# owns the `Method` protocol), the checkpoint package and the models (starting weights live with
# the models, end-of-run exports in `trainer.exports`), and `JobSpec` and the cross-field checks
# its validator runs (they read `jobspec.sections.TrainerSections`). A new one fails here.
TYPE_ONLY_CIRCLES: set[frozenset[str]] = set()


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.add(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_type_only_imports_close_no_circle_but_the_known_ones() -> None:
    graph = import_graph(type_only=True)
    assert "torchyard.client" not in graph["torchyard.sweeps"]  # the resources' Transport
    assert _circles(graph) == TYPE_ONLY_CIRCLES


def test_the_checkpoint_package_imports_no_model() -> None:
    """Checkpoints are weights and state in and out of DCP (issue 46): the models load their
    starting weights from them (`trainer.models.init_from`) and the end-of-run exports read
    them (`trainer.exports`), never the other way round."""
    graph = import_graph(type_only=True)
    checkpoint = {m for m in graph if m.startswith("trainer.checkpoint")}
    assert {"trainer.checkpoint.checkpointer", "trainer.checkpoint.state"} <= checkpoint
    assert "trainer.checkpoint.checkpointer" in graph["trainer.models.network"]
    reached = {t for m in checkpoint for t in graph[m]}
    assert not {t for t in reached if t.startswith(("trainer.models", "trainer.exports"))}
