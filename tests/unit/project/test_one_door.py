"""Issue 46: a job is made in one place. Every job row is inserted by
`core.jobs.service.add_queued` (called by `create` or by the one door,
`core.submission.service.submit`, and nothing else), and no API route imports another route
(the submission checks once lived in a route module four others imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("api", "core", "workers", "torchyard")
# (module, function) pairs allowed to make a job row or call the insert functions
INSERTS_A_ROW = {("core/jobs/service.py", "add_queued")}
CALLS_THE_INSERT = {
    ("core/jobs/service.py", "create"),  # add_queued, committed, with the key race replayed
    ("core/submission/service.py", "submit"),
}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _calls(tree: ast.AST) -> list[tuple[str, str]]:
    """(enclosing top-level function, called name) of every call in `tree`: the name is the
    last part of a dotted callee (`jobs.create` -> `create`, `Job` -> `Job`)."""
    found = []
    for top in ast.iter_child_nodes(tree):
        where = top.name if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef) else ""
        for node in ast.walk(top):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                found.append((where, name))
    return found


def _job_constructors(tree: ast.AST, path: str) -> list[tuple[str, str]]:
    """Calls of the ORM `Job` class (imported from core.platform.tables) in `tree`."""
    imports_job = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "core.platform.tables"
        and any(a.name == "Job" for a in n.names)
        for n in ast.walk(tree)
    )
    if not imports_job:
        return []
    return [(path, where) for where, name in _calls(tree) if name == "Job"]


def test_only_add_queued_makes_a_job_row_and_only_the_one_door_calls_it() -> None:
    makers, callers = [], []
    for source in _sources():
        rel = source.relative_to(ROOT).as_posix()
        tree = ast.parse(source.read_text(), filename=rel)
        makers += _job_constructors(tree, rel)
        imports_service = rel.startswith("core/jobs/") or any(
            isinstance(n, ast.ImportFrom)
            and n.module in ("core.jobs", "core.jobs.service")
            and any(a.name in ("service", "add_queued", "create") for a in n.names)
            for n in ast.walk(tree)
        )
        if imports_service:
            callers += [
                (rel, where)
                for where, name in _calls(tree)
                if name == "add_queued" or (name == "create" and _names_service_create(tree))
            ]
    assert set(makers) == INSERTS_A_ROW, makers
    assert set(callers) <= CALLS_THE_INSERT, sorted(set(callers) - CALLS_THE_INSERT)
    assert ("core/submission/service.py", "submit") in callers


def _names_service_create(tree: ast.AST) -> bool:
    """Whether `tree` calls `create` on the jobs service (`jobs.create(`, `service.create(`)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "create"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("jobs", "service")
        ):
            return True
    return False


def test_no_api_route_imports_another_route() -> None:
    offenders = []
    for source in sorted((ROOT / "api" / "routes").glob("[!_]*.py")):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("api.routes"):
                offenders.append((source.name, node.module))
    assert offenders == []
