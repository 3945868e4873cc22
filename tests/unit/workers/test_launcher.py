"""The torchrun command and environment a worker launches, exactly."""

from __future__ import annotations

import socket
from pathlib import Path

from workers import launcher
from workers.launcher import (
    GangNode,
    RunPaths,
    ScriptJob,
    script_argv,
    script_command,
    script_env,
    torchrun_argv,
    trainer_env,
)

PATHS = RunPaths(
    run_dir=Path("/srv/ty/jobs/7/runs/attempt_2"),
    checkpoint_dir="s3://bucket/jobs/7/checkpoints",
    data="/data/corpus",
)


def test_torchrun_argv_is_exactly_the_contract_command() -> None:
    argv = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=29555, paths=PATHS, python="/py"
    )
    assert argv == [
        "/py", "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc-per-node", "4",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "127.0.0.1:29555",
        "--rdzv-id", "job7-a2",
        "--max-restarts", "0",
        "--log-dir", "/srv/ty/jobs/7/runs/attempt_2/logs",
        "--redirects", "3",
        "-m", "trainer",
        "--spec", "/srv/ty/jobs/7/runs/attempt_2/spec.json",
        "--run-dir", "/srv/ty/jobs/7/runs/attempt_2",
        "--checkpoint-dir", "s3://bucket/jobs/7/checkpoints",
        "--data", "/data/corpus",
    ]  # fmt: skip


def test_inplace_restarts_become_torchruns_max_restarts() -> None:
    argv = torchrun_argv(
        job_id=7,
        attempt=2,
        nproc_per_node=4,
        rdzv_port=29555,
        paths=PATHS,
        python="/py",
        max_restarts=3,
    )
    plain = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=29555, paths=PATHS, python="/py"
    )
    at = plain.index("--max-restarts") + 1
    assert argv == [*plain[:at], "3", *plain[at + 1 :]]


def test_a_fine_tune_passes_its_resolved_checkpoint_as_init_from_last() -> None:
    paths = RunPaths(
        run_dir=PATHS.run_dir,
        checkpoint_dir=PATHS.checkpoint_dir,
        data=PATHS.data,
        init_from="s3://bucket/jobs/3/checkpoints/step_00000100",
    )
    argv = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=29555, paths=paths, python="/py"
    )
    plain = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=29555, paths=PATHS, python="/py"
    )
    assert argv == [*plain, "--init-from", "s3://bucket/jobs/3/checkpoints/step_00000100"]


def test_a_grpo_job_with_grader_code_gets_its_code_dir_last() -> None:
    """`method.grpo.code` unpacked in the run dir: the trainer reads its graders' files there."""
    paths = RunPaths(
        run_dir=PATHS.run_dir,
        checkpoint_dir=PATHS.checkpoint_dir,
        data=PATHS.data,
        grader_code=True,
    )
    argv = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=29555, paths=paths, python="/py"
    )
    plain = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=29555, paths=PATHS, python="/py"
    )
    assert argv == [*plain, "--code-dir", "/srv/ty/jobs/7/runs/attempt_2/code"]


BASE_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/w",
    "AWS_ACCESS_KEY_ID": "storage-key",
    "TORCHYARD_DATABASE_URL": "postgresql://u:secret@db/ty",
    "TORCHYARD_BROKER_URL": "redis://:secret@redis/0",
    "TORCHYARD_STORAGE_URL": "s3://bucket",
    "OMP_NUM_THREADS": "16",
}


def test_cpu_env_splits_threads_strips_secrets_and_sets_trainer_knobs() -> None:
    env = trainer_env(base=BASE_ENV, attempt=3, nproc_per_node=2, device="cpu", cpu_count=8)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/w",
        "AWS_ACCESS_KEY_ID": "storage-key",
        "TORCHYARD_ATTEMPT": "3",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "4",
    }


def test_cpu_env_threads_are_capped_by_the_workers_own_setting() -> None:
    base = {"OMP_NUM_THREADS": "1"}
    env = trainer_env(base=base, attempt=1, nproc_per_node=1, device="cpu", cpu_count=8)
    assert env["OMP_NUM_THREADS"] == "1"


def test_cpu_env_gives_each_rank_at_least_one_thread() -> None:
    env = trainer_env(base={}, attempt=1, nproc_per_node=4, device="cpu", cpu_count=2)
    assert env["OMP_NUM_THREADS"] == "1"
    env = trainer_env(base={}, attempt=1, nproc_per_node=1, device="cpu", cpu_count=None)
    assert env["OMP_NUM_THREADS"] == "1"


def test_cuda_env_leaves_thread_count_to_the_base_environment() -> None:
    env = trainer_env(base=BASE_ENV, attempt=1, nproc_per_node=8, device="cuda", cpu_count=64)
    assert env["OMP_NUM_THREADS"] == "16"
    assert not any(k in env for k in ("TORCHYARD_DATABASE_URL", "TORCHYARD_BROKER_URL"))


def test_rank_logs_follow_torchrun_log_dir_layout_across_inplace_restarts(tmp_path: Path) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="c", data="d")
    for restart in ("0", "1"):
        for rank in ("0", "1"):
            folder = tmp_path / "logs" / "job7-a2_x1y2z3" / f"attempt_{restart}" / rank
            folder.mkdir(parents=True)
            for stream in ("stdout", "stderr"):
                (folder / f"{stream}.log").touch()
            (folder / "error.json").touch()
    assert paths.rank_logs() == {
        (restart, rank, stream): tmp_path
        / f"logs/job7-a2_x1y2z3/attempt_{restart}/{rank}/{stream}.log"
        for restart in (0, 1)
        for rank in (0, 1)
        for stream in ("stderr", "stdout")
    }
    assert list(paths.rank_logs())[:2] == [(0, 0, "stderr"), (0, 0, "stdout")]
    assert paths.launcher_log("stderr") == tmp_path / "launcher.stderr.log"


def test_gang_node_argv_joins_node_0_s_c10d_rendezvous() -> None:
    node = GangNode(
        nnodes=2, node_rank=1, host="10.0.0.5", port=29400, local_addr="10.0.0.7", join_timeout_s=90
    )
    argv = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=0, paths=PATHS, python="/py", gang=node
    )
    assert argv[:21] == [
        "/py", "-m", "torch.distributed.run",
        "--nnodes", "2",
        "--node-rank", "1",
        "--rdzv-conf", "is_host=0,join_timeout=90,read_timeout=90",
        "--local-addr", "10.0.0.7",
        "--nproc-per-node", "4",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "10.0.0.5:29400",
        "--rdzv-id", "job7-a2",
        "--max-restarts", "0",
    ]  # fmt: skip
    leader = GangNode(nnodes=2, node_rank=0, host="10.0.0.5", port=29400, local_addr="10.0.0.5")
    lead_argv = torchrun_argv(
        job_id=7, attempt=2, nproc_per_node=4, rdzv_port=0, paths=PATHS, python="/py", gang=leader
    )
    assert (
        lead_argv[lead_argv.index("--rdzv-conf") + 1]
        == "is_host=1,join_timeout=120,read_timeout=120"
    )
    assert argv[21:] == lead_argv[21:]  # the same trainer command on every node


def test_cuda_env_shows_each_job_only_its_leased_gpus_in_nvml_order() -> None:
    env = trainer_env(
        base=BASE_ENV, attempt=1, nproc_per_node=2, device="cuda", cpu_count=64,
        devices=[2, 3], host_devices=4,
    )  # fmt: skip
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_cpu_env_gives_a_lease_its_share_of_the_cores_and_no_gpus() -> None:
    env = trainer_env(
        base={}, attempt=1, nproc_per_node=2, device="cpu", cpu_count=16,
        devices=[0, 1], host_devices=4,
    )  # fmt: skip
    assert env["OMP_NUM_THREADS"] == "4"  # 2 of 4 slots: 8 of 16 cores, over 2 ranks
    assert "CUDA_VISIBLE_DEVICES" not in env
    env = trainer_env(
        base={}, attempt=1, nproc_per_node=1, device="cpu", cpu_count=2,
        devices=[3], host_devices=4,
    )  # fmt: skip
    assert env["OMP_NUM_THREADS"] == "1"


# --- entrypoint jobs (docs/CONTRACTS.md section 5) ---

SCRIPT_PATHS = RunPaths(
    run_dir=Path("/srv/ty/jobs/7/runs/attempt_2"),
    checkpoint_dir="/srv/ty/jobs/7/checkpoints",
)
VENV_PY = "/venvs/abc/bin/python"


def _script_argv(command: list[str], **kw: object) -> list[str]:
    return script_argv(
        job_id=7,
        attempt=2,
        nproc_per_node=4,
        rdzv_port=29555,
        paths=SCRIPT_PATHS,
        command=command,
        python=VENV_PY,
        torchrun_python="/py",
        **kw,  # type: ignore[arg-type]
    )


def test_script_argv_is_torchruns_head_then_no_python_and_the_runner() -> None:
    argv = _script_argv(["python", "-u", "train.py", "--lr", "3e-4"])
    assert argv == [
        "/py", "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc-per-node", "4",
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "127.0.0.1:29555",
        "--rdzv-id", "job7-a2",
        "--max-restarts", "0",
        "--log-dir", "/srv/ty/jobs/7/runs/attempt_2/logs",
        "--redirects", "3",
        "--no-python",
        VENV_PY, "-u", "-m", "torchyard.train", "train.py", "--lr", "3e-4",
    ]  # fmt: skip


def test_script_argv_shares_the_trainers_head_including_gang_and_restarts() -> None:
    gang = GangNode(nnodes=2, node_rank=1, host="10.0.0.1", port=29400, local_addr="10.0.0.2")
    trainer = torchrun_argv(
        job_id=7,
        attempt=2,
        nproc_per_node=4,
        rdzv_port=29555,
        paths=SCRIPT_PATHS,
        python="/py",
        gang=gang,
        max_restarts=0,
    )
    script = _script_argv(["bash", "run.sh"], gang=gang)
    head = trainer[: trainer.index("-m", 3)]
    assert script == [*head, "--no-python", "bash", "run.sh"]


def test_python_targets_go_through_the_runner_and_other_commands_run_as_they_are() -> None:
    runner = [VENV_PY, "-m", "torchyard.train"]
    cases = {
        ("python", "train.py"): [*runner, "train.py"],
        ("python3", "-W", "ignore", "-X", "dev", "t.py", "-x"): [
            VENV_PY, "-W", "ignore", "-X", "dev", "-m", "torchyard.train", "t.py", "-x",
        ],
        ("python", "-m", "pkg.train", "--epochs", "2"): [*runner, "-m", "pkg.train", "--epochs",
                                                         "2"],
        ("python", "-O", "-m", "pkg"): [VENV_PY, "-O", "-m", "torchyard.train", "-m", "pkg"],
        ("python", "-c", "print(1)"): ["python", "-c", "print(1)"],
        ("python",): ["python"],
        ("bash", "-c", "python x.py"): ["bash", "-c", "python x.py"],
        ("./run.sh", "a"): ["./run.sh", "a"],
    }  # fmt: skip
    for command, expected in cases.items():
        assert script_command(list(command), VENV_PY) == expected, command


WORKER_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/w",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONPATH": "/src/torchyard",
    "NCCL_DEBUG": "INFO",
    "TORCH_HOME": "/cache/torch",
    "TORCH_HUB_TOKEN": "hub-secret",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    "TORCHYARD_DATABASE_URL": "postgresql://u:pw@db/ty",
    "TORCHYARD_BROKER_URL": "redis://:pw@redis/0",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "OPENAI_API_KEY": "sk-secret",
    "HF_TOKEN": "hf-secret",
    "OMP_NUM_THREADS": "64",
}


def test_script_env_is_the_allow_list_then_spec_env_then_the_platforms() -> None:
    job = ScriptJob(
        job_id=7,
        job_name="sweep",
        attempt=2,
        env={"LR": "3e-4"},
        keep_last_checkpoints=3,
        params={"lr": 3e-4, "layers": 4},
    )
    env = script_env(
        base=WORKER_ENV,
        job=job,
        paths=SCRIPT_PATHS,
        python=VENV_PY,
        nproc_per_node=2,
        device="cpu",
        cpu_count=8,
        inputs={"corpus": "/inputs/corpus", "base_model": "/inputs/base_model"},
    )
    assert env == {
        "PATH": "/venvs/abc/bin:/usr/bin:/bin",
        "HOME": "/home/w",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src/torchyard",
        "NCCL_DEBUG": "INFO",
        "TORCH_HOME": "/cache/torch",
        "OMP_NUM_THREADS": "4",
        "LR": "3e-4",
        "TORCHYARD_JOB_ID": "7",
        "TORCHYARD_JOB_NAME": "sweep",
        "TORCHYARD_ATTEMPT": "2",
        "TORCHYARD_RUN_DIR": "/srv/ty/jobs/7/runs/attempt_2",
        "TORCHYARD_CHECKPOINT_DIR": "/srv/ty/jobs/7/checkpoints",
        "TORCHYARD_KEEP_LAST_CHECKPOINTS": "3",
        "TORCHYARD_PARAMS": '{"lr": 0.0003, "layers": 4}',
        "TORCHYARD_INPUT_CORPUS": "/inputs/corpus",
        "TORCHYARD_INPUT_BASE_MODEL": "/inputs/base_model",
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }


def test_script_env_on_cuda_sees_only_the_leased_devices() -> None:
    job = ScriptJob(job_id=7, job_name="j", attempt=1, env={})
    env = script_env(
        base=WORKER_ENV,
        job=job,
        paths=SCRIPT_PATHS,
        python=VENV_PY,
        nproc_per_node=2,
        device="cuda",
        cpu_count=8,
        devices=[2, 3],
        host_devices=4,
    )
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "OMP_NUM_THREADS" not in env
    assert "TORCHYARD_KEEP_LAST_CHECKPOINTS" not in env
    secrets = ("pw", "secret", "sk-")
    assert not [k for k, v in env.items() if any(s in v for s in secrets)]


def test_a_free_port_is_drawn_below_the_kernels_ephemeral_range_and_is_bindable() -> None:
    """Outgoing connections take their local port from the ephemeral range: a rendezvous port
    drawn there could be taken before torchrun binds it (a busy CI host, exit 1)."""
    low = int(launcher.EPHEMERAL_RANGE.read_text().split()[0])
    ports = {launcher.free_port() for _ in range(20)}
    assert all(launcher.LISTEN_PORTS_FROM <= p < low for p in ports), ports
    assert len(ports) > 1, "drawn at random, so that two workers rarely meet"
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
