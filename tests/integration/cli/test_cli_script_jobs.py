"""`torchyard jobs` and `show` of a script job (`entrypoint`, issue 13) against a real API
server: its kind, its command as a shell line, its code archive, env and requirements, and the
metrics it reported; `--json` is the API's job as it is. The archive is a row written into the
test database and the run's traces go through core services (`tests.integration.script_jobs`):
no worker serves its pool."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from sqlalchemy import Engine
from typer.testing import CliRunner, Result

from tests.conftest import ProjectKey
from tests.integration.script_jobs import (
    COMMAND,
    COMMAND_LINE,
    insert_archive,
    run_script_job,
    script_spec,
)
from tests.integration.workers.helpers import unique_queue
from torchyard.cli import app


def _cli(live_api: str, project: ProjectKey, tmp_path: Path, *args: str) -> Result:
    env = {
        "TORCHYARD_URL": live_api,
        "TORCHYARD_API_KEY": project.api_key,
        "TORCHYARD_CONFIG": str(tmp_path / "no-config.toml"),
    }
    return CliRunner().invoke(app, list(args), env=env)


def _fields(output: str) -> dict[str, str]:
    """`show`'s key/value lines as a dict (a key's first line only)."""
    rows = (line.split(maxsplit=1) for line in output.splitlines())
    return {row[0]: row[1].strip() for row in rows if len(row) == 2}


def test_show_and_jobs_print_a_script_jobs_kind_command_and_code(
    live_api: str, project: ProjectKey, engine: Engine, tmp_path: Path
) -> None:
    code_id = insert_archive(engine, project.project_id)
    spec = script_spec(code_id, unique_queue("nowhere"))
    answer = httpx.post(f"{live_api}/v1/jobs", json=spec, headers=project.headers, timeout=30)
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]

    queued = _cli(live_api, project, tmp_path, "show", str(job_id))
    assert queued.exit_code == 0, queued.output
    assert _fields(queued.stdout)["step"] == "-", "no 0/0 for a job whose end is its own"

    run_script_job(engine, job_id, steps=12)
    shown = _cli(live_api, project, tmp_path, "show", str(job_id))
    assert shown.exit_code == 0, shown.output
    fields = _fields(shown.stdout)
    assert fields["kind"] == "script"
    assert fields["command"] == COMMAND_LINE
    assert fields["code"] == code_id
    assert fields["requirements"] == "numpy>=1.26"
    assert "GREETING='hi there'" in shown.stdout and "WANDB_MODE=offline" in shown.stdout
    assert fields["step"] == "12"
    assert fields["accuracy"] == f"{1 - 1 / 13:.4g}"
    assert "model" not in fields and "dataset" not in fields

    listed = _cli(live_api, project, tmp_path, "jobs")
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    row = rows[str(job_id)]
    assert row[1:6] == ["mnist-script", "running", "12", "0.1667", "script"]

    as_json = json.loads(_cli(live_api, project, tmp_path, "show", str(job_id), "--json").stdout)
    assert as_json["spec"]["entrypoint"]["command"] == COMMAND
    assert "kind" not in as_json and "entrypoint" not in as_json, "--json is the API's job"


def test_submit_warns_of_a_local_path_on_the_command_line_and_sends_the_job(
    live_api: str, project: ProjectKey, engine: Engine, tmp_path: Path
) -> None:
    """A path that exists on the submitting machine is most likely meant as an input: the job
    will not see it. `submit` says so (stderr) before sending, and sends the job all the same
    (the path may exist on the workers too)."""
    code_id = insert_archive(engine, project.project_id)
    spec = script_spec(code_id, unique_queue("nowhere"))
    model = tmp_path / "llama"
    model.mkdir()
    spec["entrypoint"]["command"] = ["python", "train.py", "--model", str(model), "--lr=1"]
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    result = _cli(live_api, project, tmp_path, "submit", str(tmp_path / "spec.json"))
    assert result.exit_code == 0, result.output
    assert f"warning: `{model}` exists on this machine" in result.stderr
    assert "entrypoint.inputs" in result.stderr and "/inputs/<name>" in result.stderr
    assert "submitted job" in result.stdout
