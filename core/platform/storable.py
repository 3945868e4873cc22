"""Strings the database cannot store: NUL and lone surrogates (Postgres text and JSONB refuse
both), found in any request value so they are answered with 422 naming where, never a 500."""

from __future__ import annotations

from typing import Any

from core.platform.errors import InvalidInput


def unstorable(value: Any, loc: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """Details for every string (or key) in `value` holding NUL or a lone surrogate.

    Postgres text and JSONB refuse both, so they are answered with 422 instead of reaching it.
    """
    found: list[dict[str, Any]] = []
    if isinstance(value, str):
        if not _storable(value):
            found.append(
                {
                    "loc": list(loc),
                    "msg": "contains NUL or invalid unicode",
                    "type": "string_unicode",
                }
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            # an unstorable key cannot be named in the answer either: point at its parent
            key_loc = (*loc, str(key)) if _storable(str(key)) else loc
            found += unstorable(str(key), key_loc)
            found += unstorable(item, key_loc)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found += unstorable(item, (*loc, i))
    return found


def require_storable(value: Any, loc: tuple[str | int, ...]) -> None:
    """Raise InvalidInput naming each unstorable string in `value`."""
    details = unstorable(value, loc)
    if details:
        where = ".".join(str(p) for p in details[0]["loc"])
        raise InvalidInput(f"{where}: {details[0]['msg']}", details=details)


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
