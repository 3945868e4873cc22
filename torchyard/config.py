"""Where the SDK finds the API and its key.

Each setting comes from the first place that has it: the explicit argument, the environment
(`TORCHYARD_URL`, `TORCHYARD_API_KEY`), the config file written by ``torchyard login``, then the
default URL. The file is TOML at ``$TORCHYARD_CONFIG``, else
``$XDG_CONFIG_HOME/torchyard/config.toml``, else ``~/.config/torchyard/config.toml``.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from torchyard.errors import TorchyardError

DEFAULT_URL = "http://127.0.0.1:8000"


class ConfigError(TorchyardError, ValueError):
    """The config file exists but cannot be read."""


@dataclass(frozen=True)
class Config:
    """Resolved connection settings. `api_key` is None when none was found anywhere."""

    url: str
    api_key: str | None


def config_path() -> Path:
    """The config file's location (it may not exist)."""
    if explicit := os.environ.get("TORCHYARD_CONFIG"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "torchyard" / "config.toml"


def read_config_file(path: Path | None = None) -> dict[str, str]:
    """The file's string settings; empty when it does not exist.

    Raises `ConfigError` when the file exists but is not valid TOML.
    """
    path = path or config_path()
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return {k: v for k, v in raw.items() if isinstance(v, str)}


def load_config(url: str | None = None, api_key: str | None = None) -> Config:
    """Resolve URL and key: argument, then environment, then config file, then default."""
    file = read_config_file()
    resolved_url = url or os.environ.get("TORCHYARD_URL") or file.get("url") or DEFAULT_URL
    resolved_key = api_key or os.environ.get("TORCHYARD_API_KEY") or file.get("api_key")
    return Config(url=resolved_url.rstrip("/"), api_key=resolved_key or None)


def save_config(url: str, api_key: str, path: Path | None = None) -> Path:
    """Write URL and key to the config file, readable by the owner only. Returns its path."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # JSON string escapes are valid TOML basic-string escapes.
    text = f"url = {json.dumps(url)}\napi_key = {json.dumps(api_key)}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path
