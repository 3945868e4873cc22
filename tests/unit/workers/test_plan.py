"""What a node runs for each kind of job (workers/plan.py): one branch, exact commands."""

from __future__ import annotations

from pathlib import Path

from core.platform.models import Job
from jobspec.job import ScriptJobSpec
from workers import launcher, plan
from workers.devices import Lease

PATHS = launcher.RunPaths(
    run_dir=Path("/srv/ty/jobs/7/runs/attempt_1"),
    checkpoint_dir="/srv/ty/jobs/7/checkpoints",
    python="/venvs/k/bin/python",
)


def _job(command: list[str]) -> Job:
    spec = ScriptJobSpec.model_validate(
        {
            "name": "s",
            "entrypoint": {"code": "code_0123456789abcdef", "command": command},
            "resources": {"procs_per_node": 1},
        }
    )
    return Job(id=7, attempt=1, spec=spec)


def test_a_script_job_runs_in_its_code_dir_with_the_jobs_python() -> None:
    launch = plan.command(_job(["python", "train.py"]), PATHS, 29500, None, Lease((0,), 1))
    assert launch.cwd == Path("/srv/ty/jobs/7/runs/attempt_1/code")
    after = launch.argv[launch.argv.index("--no-python") + 1 :]
    assert after == ["/venvs/k/bin/python", "-m", "torchyard.train", "train.py"]
    assert launch.env["TORCHYARD_JOB_ID"] == "7"
    assert launch.env["PATH"].startswith("/venvs/k/bin:")
    assert not launch.plain_command  # the runner records the program's own failures


def test_a_command_the_runner_does_not_wrap_is_plain() -> None:
    for command in (["bash", "run.sh"], ["python", "-c", "print(1)"]):
        launch = plan.command(_job(command), PATHS, 29500, None, Lease((0,), 1))
        assert launch.plain_command, command
        assert launch.argv[launch.argv.index("--no-python") + 1 :] == command
