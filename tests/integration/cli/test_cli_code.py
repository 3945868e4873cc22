"""``torchyard code upload`` and ``torchyard submit --code DIR`` against a real API server: the
directory is archived without what `.gitignore` ignores, and the job runs the uploaded code."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from torchyard import Client, ValidationFailed


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    root = tmp_path / "my_trainer"
    for rel, text in {
        "train.py": "import torchyard.train\n",
        "lib/util.py": "X = 1\n",
        ".gitignore": "wandb/\n*.ckpt\n",
        "wandb/run.txt": "x",
        "last.ckpt": "x",
        "lib/__pycache__/util.cpython-311.pyc": "x",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_submit_with_code_uploads_the_directory_and_names_it_in_the_spec(
    cli: Any, code_dir: Path, tmp_path: Path, live_api: str, api_key: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: own\nentrypoint:\n  command: [python, train.py, --epochs, '1']\n")
    result = cli("submit", "--code", str(code_dir), str(spec), "--json")
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    code_id = job["spec"]["entrypoint"]["code"]
    with Client(live_api, api_key) as client:
        archive = client.code.get(code_id)
        assert archive.name == "my_trainer"
        assert archive.files == [".gitignore", "lib/util.py", "train.py"]
        # unchanged code, submitted again: the same archive
        again = cli("submit", "--code", str(code_dir), str(spec), "--json")
        assert again.exit_code == 0, again.output
        assert json.loads(again.stdout)["spec"]["entrypoint"]["code"] == code_id
        assert [a.id for a in client.code.list()] == [code_id]


def test_submit_with_code_whose_script_is_missing_names_the_command(
    cli: Any, code_dir: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: own\nentrypoint:\n  command: [python, wandb/run.py]\n")
    result = cli("submit", "--code", str(code_dir), str(spec))
    assert result.exit_code == 1
    assert "entrypoint.command" in result.output
    assert "'wandb/run.py' is not in code archive" in result.output


def test_code_upload_list_and_show(cli: Any, code_dir: Path, tmp_path: Path) -> None:
    uploaded = cli("code", "upload", str(code_dir), "--name", "v1", "--json")
    assert uploaded.exit_code == 0, uploaded.output
    archive = json.loads(uploaded.stdout)
    assert (archive["name"], archive["num_files"]) == ("v1", 3)
    listed = cli("code", "list")
    assert listed.exit_code == 0, listed.output
    assert archive["id"] in listed.stdout and "v1" in listed.stdout
    shown = cli("code", "show", archive["id"])
    assert shown.exit_code == 0, shown.output
    assert "lib/util.py" in shown.stdout


def test_uploading_an_unsafe_archive_file_names_the_member(
    cli: Any, tmp_path: Path, live_api: str, api_key: str
) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("../escape.py")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(buf.getvalue())
    result = cli("code", "upload", str(bad))
    assert result.exit_code == 1
    assert "'../escape.py'" in result.output
    with Client(live_api, api_key) as client:
        with pytest.raises(ValidationFailed) as caught:
            client.code.upload(bad)
        assert [d.loc for d in caught.value.details] == [("body", "file")]
        assert client.code.list() == []
