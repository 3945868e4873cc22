"""The server's directories are hidden from text the API answers (core.platform.server_paths)."""

from __future__ import annotations

from pathlib import Path

from core.platform.server_paths import ServerPaths
from core.platform.settings import Settings


def _paths(tmp_path: Path) -> ServerPaths:
    home = tmp_path / "home"
    return ServerPaths.of(Settings(env="test", home=home, storage_url=str(home / "storage")))


def test_a_path_under_storage_reads_relative_to_it_and_one_under_home_relative_to_home(
    tmp_path: Path,
) -> None:
    paths = _paths(tmp_path)
    home = tmp_path / "home"
    assert paths.hide(f"{home}/storage/jobs/7/checkpoints/step_00000010") == (
        "jobs/7/checkpoints/step_00000010"
    )
    assert paths.hide(f"file://{home}/storage/datasets/ds_1/a.jsonl") == "datasets/ds_1/a.jsonl"
    assert paths.hide(f"--cache-dir={home}/cache/rows") == "--cache-dir=cache/rows"
    assert paths.hide(f"checkpoint {home}/storage: full.") == "checkpoint .: full."
    assert paths.hide(f"wrote {home}/storage.") == "wrote .."


def test_other_paths_and_look_alike_siblings_are_left_as_they_are(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    home = tmp_path / "home"
    for text in (f"{home}-old/x", f"{home}2/storage/x", "/srv/corpus/a.txt", "org/model", ""):
        assert paths.hide(text) == text
    assert ServerPaths(()).hide(f"{home}/storage/x") == f"{home}/storage/x"


def test_json_like_values_are_hidden_throughout_and_other_values_kept(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    storage = tmp_path / "home" / "storage"
    value = {
        "argv": ["torchrun", "--spec", f"{storage}/jobs/1/runs/attempt_1/spec.json"],
        "data": {f"{storage}/k": (f"{storage}/a", 3, None, 1.5, True)},
    }
    assert paths.hide(value) == {
        "argv": ["torchrun", "--spec", "jobs/1/runs/attempt_1/spec.json"],
        "data": {"k": ("a", 3, None, 1.5, True)},
    }
    assert paths.hide(None) is None and paths.hide(7) == 7


def test_located_gives_the_full_location_to_admins_only(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    full = str(tmp_path / "home" / "storage" / "jobs" / "3" / "exports" / "step_00000004")
    assert paths.located(full, admin=True) == {
        "uri": "jobs/3/exports/step_00000004",
        "server_uri": full,
    }
    assert paths.located(full, admin=False) == {
        "uri": "jobs/3/exports/step_00000004",
        "server_uri": None,
    }
    assert paths.located("/srv/corpus", admin=False) == {"uri": "/srv/corpus", "server_uri": None}
