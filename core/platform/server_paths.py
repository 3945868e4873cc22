"""The server's own directories, kept out of what the API answers (docs/CONTRACTS.md, section 4).

A path under the storage root or the server's home is shown relative to it:
`STORAGE/jobs/7/checkpoints/step_00000010` reads `jobs/7/checkpoints/step_00000010`, and the
root itself reads `.`. Paths anywhere else (a dataset registered from a data root, a hub id)
are shown as they are: the caller named them. Admin callers get the full location of a file
the API describes in a separate `server_uri` field (`located`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from core.platform.settings import Settings

T = TypeVar("T")

# What continues a path's last component: a root followed by it is another path (a full stop
# that ends a sentence does not).
_MORE_PATH = r"[\w~-]|\.[\w.~-]"


@dataclass(frozen=True)
class ServerPaths:
    """Hides the server's directories (`roots`, as absolute paths or fsspec URIs) in text."""

    roots: tuple[str, ...]
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Longest first: the storage root inside the home is matched as itself.
        ordered = sorted({r.rstrip("/") for r in self.roots if len(r.rstrip("/")) > 1}, key=len)
        alternatives = "|".join(re.escape(r) for r in reversed(ordered))
        pattern = rf"(?:{alternatives})(?:/|(?!{_MORE_PATH}))" if alternatives else r"(?!)"
        object.__setattr__(self, "_pattern", re.compile(pattern))

    @classmethod
    def of(cls, settings: Settings) -> ServerPaths:
        """The storage root (as configured, resolved, and as a `file://` URI when local) and
        the home directory (`settings.home`, resolved: it holds the workers' row cache and,
        with remote storage, their run dirs)."""
        roots = [settings.storage_url, str(settings.home.resolve())]
        if settings.home.is_absolute():
            roots.append(str(settings.home))
        if settings.is_local_storage:
            local = str(settings.storage_path)
            roots += [local, f"file://{local}"]
        return cls(tuple(dict.fromkeys(roots)))

    def hide(self, value: T) -> T:
        """`value` with every path under a root made relative to it: a string, or the strings
        of a JSON-like structure of dicts, lists and tuples (keys included); other values as
        they are."""
        return self._hide(value)

    def _hide(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._pattern.sub(_relative, value)
        if isinstance(value, dict):
            return {self._hide(k): self._hide(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._hide(v) for v in value)
        return value

    def located(self, uri: str, *, admin: bool) -> dict[str, str | None]:
        """`{"uri": ..., "server_uri": ...}` for a file the API describes: `uri` relative to
        the server's directories, `server_uri` the full location for `admin` callers only
        (else None)."""
        return {"uri": self.hide(uri), "server_uri": uri if admin else None}


def _relative(match: re.Match[str]) -> str:
    return "" if match.group(0).endswith("/") else "."
