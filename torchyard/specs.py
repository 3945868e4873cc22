"""Reading job specs from files and applying ``--set key.path=value`` overrides.

Pure functions, no network: the server validates the result and answers 422 with the JSON path
of each bad field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from dataformat.yaml12 import load as load_yaml


class SpecFileError(ValueError):
    """A spec file or an override that cannot be used (not a mapping, bad syntax, bad path)."""


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read a spec from a ``.json``, ``.yaml`` or ``.yml`` file (``-``: standard input).

    Other extensions are read as YAML, which also accepts JSON. Raises `SpecFileError` when
    the file is missing, does not parse, or is not a mapping.
    """
    if str(path) == "-":
        text, label = sys.stdin.read(), "<stdin>"
    else:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise SpecFileError(f"{path}: {exc.strerror or exc}") from exc
        label = str(path)
    try:
        data = json.loads(text) if label.endswith(".json") else load_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecFileError(f"{label}: not valid {_kind(label)}: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecFileError(f"{label}: a spec must be a mapping, got {type(data).__name__}")
    return data


def _kind(label: str) -> str:
    return "JSON" if label.endswith(".json") else "YAML"


def parse_value(raw: str) -> Any:
    """The value of an override: JSON when it parses (``100``, ``2e-3``, ``true``, ``null``,
    ``["a", "b"]``), a YAML flow collection (``[a, b]``, ``{k: v}``), else the raw string.

    Quote a string that looks like a number: ``name='"123"'``.
    """
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        pass
    if raw and raw[0] in "[{":
        try:
            return load_yaml(raw)
        except yaml.YAMLError as exc:
            raise SpecFileError(f"cannot parse {raw!r}: {exc}") from exc
    return raw


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """Split ``a.b.c=value`` into its path and parsed value. ``a.list.0=x`` indexes a list.

    Raises `SpecFileError` without ``=`` or with an empty path segment.
    """
    key, sep, raw = text.partition("=")
    if not sep:
        raise SpecFileError(f"--set {text!r}: expected KEY.PATH=VALUE")
    parts = key.strip().split(".")
    if any(not p for p in parts):
        raise SpecFileError(f"--set {text!r}: empty segment in {key!r}")
    path: list[str | int] = [int(p) if p.isdigit() else p for p in parts]
    return path, parse_value(raw)


def set_path(spec: dict[str, Any], path: list[str | int], value: Any) -> None:
    """Set `value` at `path` in `spec`, creating mappings on the way.

    Raises `SpecFileError` when the path runs through a value that is not a mapping (or a list,
    for an integer segment within its bounds).
    """
    node: Any = spec
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        where = ".".join(str(p) for p in path[: depth + 1])
        if isinstance(node, list) and isinstance(part, int):
            if part >= len(node):
                raise SpecFileError(f"{where}: index out of range (list has {len(node)})")
        elif isinstance(node, dict):
            part = str(part)
            if not last and part not in node:
                node[part] = {}
        else:
            raise SpecFileError(f"{where}: cannot set inside a {type(node).__name__}")
        if last:
            node[part] = value
        else:
            node = node[part]


def apply_overrides(spec: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of `spec` with every ``KEY.PATH=VALUE`` override applied in order."""
    result: dict[str, Any] = json.loads(json.dumps(spec, default=str))
    for text in overrides:
        path, value = parse_override(text)
        set_path(result, path, value)
    return result


def unseen_local_paths(spec: dict[str, Any]) -> list[str]:
    """Warnings for an `entrypoint` spec whose command names an absolute path (alone or as
    `--flag=/path`) that exists on this machine: the job sees only its code archive and its
    declared `entrypoint.inputs`, so such a path is most likely meant as an input."""
    entry = spec.get("entrypoint")
    command = entry.get("command") if isinstance(entry, dict) else None
    if not isinstance(command, list):
        return []
    found = []
    for arg in command[1:]:
        if not isinstance(arg, str):
            continue
        path = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if path.startswith("/") and Path(path).exists():
            found.append(
                f"`{path}` exists on this machine, but a job sees only its code and its declared "
                "inputs: declare it in `entrypoint.inputs` (e.g. a dataset or a path under the "
                "server's data roots) and read it at /inputs/<name>"
            )
    return list(dict.fromkeys(found))
