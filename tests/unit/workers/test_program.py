"""What a node runs for each kind of job (workers/program.py): one branch, exact commands."""

from __future__ import annotations

from pathlib import Path

from core.platform.settings import Settings
from core.platform.tables import Job
from jobspec.job import JobSpec, ScriptJobSpec
from workers import launcher, lone_rank, program
from workers.devices import Lease

PATHS = launcher.RunPaths(
    run_dir=Path("/srv/ty/jobs/7/runs/attempt_1"),
    checkpoint_dir="/srv/ty/jobs/7/checkpoints",
    python="/venvs/k/bin/python",
)


def _job(command: list[str], procs: int = 2) -> Job:
    spec = ScriptJobSpec.model_validate(
        {
            "name": "s",
            "entrypoint": {"code": "code_0123456789abcdef", "command": command},
            "resources": {"procs_per_node": procs},
        }
    )
    return Job(id=7, attempt=1, spec=spec)


def test_a_script_job_runs_in_its_code_dir_with_the_jobs_python() -> None:
    launch = program.command(_job(["python", "train.py"]), PATHS, 29500, None, Lease((0,), 1))
    assert launch.cwd == Path("/srv/ty/jobs/7/runs/attempt_1/code")
    after = launch.argv[launch.argv.index("--no-python") + 1 :]
    assert after == ["/venvs/k/bin/python", "-m", "torchyard.train", "train.py"]
    assert launch.env["TORCHYARD_JOB_ID"] == "7"
    assert launch.env["PATH"].startswith("/venvs/k/bin:")
    assert not launch.plain_command  # the runner records the program's own failures


def test_a_command_the_runner_does_not_wrap_is_plain() -> None:
    for command in (["bash", "run.sh"], ["python", "-c", "print(1)"]):
        launch = program.command(_job(command), PATHS, 29500, None, Lease((0,), 1))
        assert launch.plain_command, command
        assert launch.argv[launch.argv.index("--no-python") + 1 :] == command


def test_a_one_process_script_job_runs_its_command_without_torchrun() -> None:
    wrapped = program.command(_job(["python", "train.py"], 1), PATHS, 29500, None, Lease((0,), 1))
    assert wrapped.argv == ["/venvs/k/bin/python", "-m", "torchyard.train", "train.py"]
    assert not wrapped.plain_command and wrapped.cwd == PATHS.code_dir
    assert (wrapped.env["RANK"], wrapped.env["WORLD_SIZE"]) == ("0", "1")
    assert wrapped.env["TORCHYARD_JOB_ID"] == "7"
    assert wrapped.rank_dir == lone_rank.rank_dir(PATHS, 7, 1)
    plain = program.command(_job(["bash", "run.sh"], 1), PATHS, 29500, None, Lease((0,), 1))
    assert plain.argv == ["bash", "run.sh"] and plain.plain_command


def _mounts(tmp_path: Path, **paths: str) -> program.sandbox.Mounts:
    settings = Settings(home=tmp_path / "home", storage_url=str(tmp_path / "storage"))
    run = launcher.RunPaths(run_dir=tmp_path / "run", checkpoint_dir=str(tmp_path / "ck"), **paths)
    return program.sandbox_mounts(settings, _job(["python", "t.py"]), run, None, Lease((0,), 1))


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


def _trainer_job(procs: int = 1, **retries: int) -> Job:
    spec = JobSpec.model_validate(
        {
            "name": "t",
            "data": {"dataset": "corpus"},
            "resources": {"procs_per_node": procs},
            "retries": retries,
        }
    )
    return Job(id=7, attempt=1, spec=spec)


def test_a_one_process_trainer_runs_without_torchrun_with_torchrun_s_environment() -> None:
    launch = program.command(_trainer_job(), PATHS, 29500, None, Lease((0,), 1))
    assert launch.argv[1:3] == ["-m", "trainer"]  # no `torch.distributed.run` in front
    assert launch.argv[1:] == launcher.trainer_program(PATHS)
    rank_dir = Path("/srv/ty/jobs/7/runs/attempt_1/logs/job7-a1_single/attempt_0/0")
    assert launch.rank_dir == rank_dir
    env = launch.env
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == (
        "0",
        "0",
        "1",
        "29500",
    )
    assert env["TORCHELASTIC_ERROR_FILE"] == str(rank_dir / "error.json")
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert env["TORCHYARD_ATTEMPT"] == "1" and "OMP_NUM_THREADS" in env  # as under torchrun


def test_several_processes_a_gang_or_in_place_restarts_keep_torchrun() -> None:
    gang = launcher.GangNode(nnodes=2, node_rank=1, host="h0", port=29400, local_addr="h1")
    for job, node in (
        (_trainer_job(procs=2), None),
        (_trainer_job(), gang),
        (_trainer_job(max_inplace_restarts=1), None),
    ):
        launch = program.command(job, PATHS, 29500, node, Lease((0, 1), 2))
        assert launch.argv[1:3] == ["-m", "torch.distributed.run"], launch.argv
        assert launch.rank_dir is None and "RANK" not in launch.env


def test_a_grpo_jobs_code_dir_is_read_only_over_its_writable_run_dir(tmp_path: Path) -> None:
    """Graders read the job's code (`method.grpo.code`) and cannot change it: the directory is
    bound read-only after the run dir (`placed` comes last), where the trainer's argv names it."""
    settings = Settings(home=tmp_path / "home", storage_url=str(tmp_path / "storage"))
    run = launcher.RunPaths(
        run_dir=tmp_path / "run", checkpoint_dir=str(tmp_path / "ck"), grader_code=True
    )
    mounts = program.sandbox_mounts(settings, _trainer_job(), run, None, Lease((0,), 1))
    assert str(run.run_dir) in mounts.writable
    assert (str(run.code_dir), str(run.code_dir)) in mounts.placed
    without = launcher.RunPaths(run_dir=tmp_path / "run", checkpoint_dir=str(tmp_path / "ck"))
    assert (
        program.sandbox_mounts(settings, _trainer_job(), without, None, Lease((0,), 1)).placed == ()
    )
