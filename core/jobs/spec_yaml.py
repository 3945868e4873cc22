"""Read a job spec written as YAML (or JSON, which YAML reads too) and remember where each field
was written, so a validation error's JSON path can be shown next to the line it concerns.

PyYAML's composer (`yaml.SafeLoader`) gives every node its start mark; walking the node tree
records the (line, column) of every mapping key and sequence item by JSON path. Aliases and
anchors are refused: a spec has no use for them, and a graph of aliases ("billion laughs") would
cost exponential time to walk or serialise. Scalars follow YAML 1.2 (`dataformat.yaml12`): ``3e-4``
is a float and ``on`` a string, as in JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from core.platform.errors import InvalidInput
from dataformat.yaml12 import Loader as Yaml12Loader

Path = tuple[str | int, ...]


class _Loader(Yaml12Loader):
    """The specs' YAML 1.2 scalars (`dataformat.yaml12`), composed node by node here."""


@dataclass
class SpecDocument:
    """A parsed spec: `data` (plain JSON values) and `positions`: JSON path -> (line, column),
    both 1-based, of every key and list item written in the text (the root is `()`)."""

    data: Any
    positions: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def locate(self, loc: Sequence[str | int]) -> tuple[int, int]:
        """(line, column) of the deepest part of `loc` written in the text.

        Parts that name no written field are skipped (pydantic adds tags such as a union
        member's name), so a missing required field points at its parent mapping.
        """
        best = self.positions.get((), (1, 1))
        here: Path = ()
        for part in loc:
            candidate = (*here, part)
            if candidate in self.positions:
                here = candidate
                best = self.positions[candidate]
        return best


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _error(msg: str, line: int, column: int, kind: str) -> InvalidInput:
    return InvalidInput(
        f"body: line {line}: {msg}",
        details=[{"loc": ["body"], "msg": msg, "type": kind, "line": line, "column": column}],
    )


def _walk(
    node: yaml.Node, path: Path, positions: dict[Path, tuple[int, int]], seen: set[int]
) -> None:
    if id(node) in seen:  # an alias: point at where it is used, not at its anchor
        line, column = positions.get(path, _mark(node))
        raise _error("anchors and aliases are not supported in a spec", line, column, "yaml")
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                line, column = _mark(key)
                raise _error("mapping keys must be plain strings", line, column, "yaml")
            here = (*path, str(key.value))
            if here in positions:  # PyYAML keeps the last silently; a spec says each once
                line, column = _mark(key)
                first = positions[here][0]
                msg = f"{key.value!r} is given twice in this mapping (first on line {first})"
                raise _error(msg, line, column, "yaml")
            positions[here] = _mark(key)
            _walk(value, here, positions, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            positions.setdefault((*path, i), _mark(item))
            _walk(item, (*path, i), positions, seen)


def parse(text: str) -> SpecDocument:
    """Parse one YAML (or JSON) document holding a mapping.

    Raises InvalidInput (loc ``["body"]``, with `line` and `column`) for a syntax error, an
    empty document, several documents, anchors/aliases, or a root that is not a mapping.
    """
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise _error("the document is empty", 1, 1, "yaml")
        positions: dict[Path, tuple[int, int]] = {(): _mark(root)}
        _walk(root, (), positions, set())
        if not isinstance(root, yaml.MappingNode):
            line, column = _mark(root)
            raise _error("a spec is a mapping of fields (name: ..., data: ...)", line, column,
                         "model_type")  # fmt: skip
        data = _join_surrogates(loader.construct_document(root))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise _error(f"not YAML: {exc.problem or exc.context}", line, column, "yaml") from None
    except yaml.YAMLError as exc:  # e.g. a value PyYAML cannot construct
        raise _error(f"not YAML: {exc}", 1, 1, "yaml") from None
    finally:
        loader.dispose()
    doc = SpecDocument(data=None, positions=positions)
    doc.data = _plain(data, (), doc)
    return doc


def _plain(value: Any, path: Path, doc: SpecDocument) -> Any:
    """JSON values only: YAML dates and binary become strings, keys become strings; `.inf`
    and `.nan` (which JSON cannot carry) raise InvalidInput at their path."""
    if isinstance(value, dict):
        return {str(k): _plain(v, (*path, str(k)), doc) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, (*path, i), doc) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        line, column = doc.locate(path)
        raise InvalidInput(
            f"{'.'.join(map(str, path))}: not a finite number",
            details=[{"loc": ["body", *path], "msg": "should be a finite number",
                      "type": "finite_number", "line": line, "column": column}],
        )  # fmt: skip
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _text(value: str) -> str:
    try:
        return value.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:  # a lone surrogate: no text; validation refuses it later
        return value


def _join_surrogates(value: Any) -> Any:
    """`value` with each escaped UTF-16 pair (JSON's `"\\ud83d\\ude80"`) made the one character
    it means: PyYAML decodes the two escapes of a double-quoted scalar separately."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_join_surrogates(k): _join_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_join_surrogates(v) for v in value]
    return value
