"""URL and key come from the argument, then the environment, then the login file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from torchyard.config import DEFAULT_URL, load_config, read_config_file, save_config


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "torchyard" / "config.toml"
    monkeypatch.setenv("TORCHYARD_CONFIG", str(path))
    monkeypatch.delenv("TORCHYARD_URL", raising=False)
    monkeypatch.delenv("TORCHYARD_API_KEY", raising=False)
    return path


def test_defaults_without_any_configuration(config_file: Path) -> None:
    config = load_config()
    assert (config.url, config.api_key) == (DEFAULT_URL, None)


def test_saved_file_round_trips_and_is_private(config_file: Path) -> None:
    save_config("http://h:1", 'ty_"quoted"\\key')
    assert read_config_file() == {"url": "http://h:1", "api_key": 'ty_"quoted"\\key'}
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600


def test_precedence_argument_over_env_over_file(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_config("http://file:1", "file-key")
    assert load_config().api_key == "file-key"
    monkeypatch.setenv("TORCHYARD_API_KEY", "env-key")
    monkeypatch.setenv("TORCHYARD_URL", "http://env:2/")
    assert load_config() == load_config(None, None)
    assert (load_config().url, load_config().api_key) == ("http://env:2", "env-key")
    assert load_config("http://arg:3", "arg-key").api_key == "arg-key"


def test_broken_config_file_is_reported(config_file: Path) -> None:
    config_file.parent.mkdir(parents=True)
    config_file.write_text("url = [unclosed")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config()
