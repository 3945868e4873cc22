"""What a node runs for each kind of job (workers/plan.py): one branch, exact commands."""

from __future__ import annotations

from pathlib import Path

from core.platform.models import Job
from core.platform.settings import Settings
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


def _mounts(tmp_path: Path, **paths: str) -> plan.sandbox.Mounts:
    settings = Settings(home=tmp_path / "home", storage_url=str(tmp_path / "storage"))
    run = launcher.RunPaths(run_dir=tmp_path / "run", checkpoint_dir=str(tmp_path / "ck"), **paths)
    return plan.sandbox_mounts(settings, _job(["python", "t.py"]), run, None, Lease((0,), 1))


def test_a_single_node_on_local_storage_with_local_inputs_has_no_network(tmp_path: Path) -> None:
    mounts = _mounts(tmp_path, data=str(tmp_path / "corpus"), init_from="file:///srv/ck/step_1")
    assert not mounts.network
    assert mounts.read_only == (str(tmp_path / "corpus"), "/srv/ck/step_1")


def test_an_input_in_an_object_store_keeps_the_network_even_on_local_storage(
    tmp_path: Path,
) -> None:
    """A dataset registered from `s3://` under a data root: the ranks read it over the network
    (they had none, and failed to reach the store, when only the storage URL decided)."""
    mounts = _mounts(tmp_path, data="s3://corpora/stdlib", eval_data=str(tmp_path / "held"))
    assert mounts.network
    assert mounts.read_only == (str(tmp_path / "held"),)  # the URI is no path to mount
