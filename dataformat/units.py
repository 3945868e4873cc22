"""Sizes in words, the same in the CLI, the worker's event lines and the trainer's reports."""

from __future__ import annotations


def format_bytes(n: int | None) -> str:
    """Decimal units: ``812 B``, ``13.1 kB``, ``8.0 MB``, ``1.2 GB``; ``-`` when unknown."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")
