"""CLI failures that need no server: bad input and an unreachable API exit 1 with a message."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from torchyard.cli import app
from torchyard.quickstart import free_port


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("TORCHYARD_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("TORCHYARD_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("TORCHYARD_API_KEY", "ty_unused")
    return CliRunner()


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text("name: t\ndata: {uri: /tmp}\n")
    return path


def test_malformed_set_exits_1_before_any_request(runner: CliRunner, spec_file: Path) -> None:
    result = runner.invoke(app, ["submit", str(spec_file), "--set", "train.max_steps"])
    assert result.exit_code == 1
    assert "expected KEY.PATH=VALUE" in result.output


def test_missing_spec_file_exits_1(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["submit", str(tmp_path / "absent.yaml")])
    assert result.exit_code == 1
    assert "absent.yaml" in result.output


def test_unreachable_api_exits_1_naming_the_url(runner: CliRunner, spec_file: Path) -> None:
    result = runner.invoke(app, ["submit", str(spec_file)])
    assert result.exit_code == 1
    assert "cannot reach the API at http://127.0.0.1:" in result.output


def test_broken_config_file_exits_1(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("url = [")
    result = runner.invoke(app, ["jobs"])
    assert result.exit_code == 1
    assert "not valid TOML" in result.output


def _commands(command: Any, path: list[str]) -> Any:
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _commands(sub, [*path, name])


def test_every_bracketed_text_of_a_commands_help_reaches_its_rendered_help() -> None:
    """Rich reads `[...]` as markup and drops it: `torchyard logs --help` printed "one ``
    prefix each" for "one `[rank N]` prefix each" (issue 28). Each such text must be escaped."""
    runner = CliRunner()
    checked = 0
    for path, command in _commands(get_command(app), []):
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        bracketed = [b.replace("\\", "") for t in texts for b in re.findall(r"\\?\[[^\]]*\]", t)]
        if not bracketed:
            continue
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, shown.output
        flat = " ".join(shown.output.split())
        for text in bracketed:
            assert text in flat, f"{' '.join(path)} --help lost {text!r}"
            checked += 1
    assert checked >= 1  # `logs`' `[rank N]`
