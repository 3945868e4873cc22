"""How a node's ranks ended, from what they recorded: the trainer's classification of its own
exception, torchrun's per-rank error files (written by a real `@record` under real torchrun),
and the cgroup's OOM-kill counter for a rank that left nothing behind."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed

from core.attempts.lifecycle_policy import Failure, NodeEnd, Stop
from dataformat.errors import CheckpointWriteError, InvalidJobError
from dataformat.failures import FailureClass, classify_exception, error_type_names
from workers import exits, lone_rank
from workers.ingest import Reported
from workers.launcher import RunPaths
from workers.processes import spawn
from workers.supervisor import Exit

C = FailureClass


def _raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """`exc` as raised (with `cause` as its `__cause__`), so its chain is real."""
    try:
        if cause is None:
            raise exc
        raise exc from cause
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), C.OOM),
        (MemoryError(), C.OOM),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB"), C.OOM),
        (RuntimeError("Got the following error when running the callback: MemoryError: "), C.OOM),
        (torch.distributed.DistNetworkError("Connection reset by peer"), C.INFRA),
        (torch.distributed.DistBackendError("gloo: connection closed"), C.INFRA),
        (torch.distributed.DistStoreError("wait timeout"), C.INFRA),
        (RuntimeError("[Rank 0] Watchdog caught collective operation timeout"), C.INFRA),
        # what gloo on CPU raises in the survivor when its peer rank died (torch 2.13)
        (RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"), C.INFRA),
        (ConnectionResetError("peer gone"), C.INFRA),
        (OSError(errno.ENOSPC, "No space left on device"), C.INFRA),
        (OSError(errno.EROFS, "Read-only file system"), C.INFRA),
        (OSError(errno.EIO, "Input/output error"), C.INFRA),
        (FileNotFoundError(errno.ENOENT, "no such file"), C.USER_ERROR),
        (ValueError("bad token id"), C.USER_ERROR),
        (InvalidJobError("the corpus is empty"), C.USER_ERROR),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else str(x),
)
def test_the_trainer_classifies_its_own_exception(exc: BaseException, expected: C) -> None:
    assert classify_exception(_raised(exc)) is expected


def test_a_chain_is_classified_by_its_most_telling_cause() -> None:
    write = _raised(CheckpointWriteError("checkpoint at step 4"), PermissionError(13, "denied"))
    assert classify_exception(write) is C.INFRA  # storage, whatever the OSError
    wrapped_oom = _raised(ValueError("forward failed"), MemoryError())
    assert classify_exception(wrapped_oom) is C.OOM
    assert classify_exception(_raised(InvalidJobError("bad data"), OSError(5, "EIO"))) is (
        C.USER_ERROR
    )  # the trainer's own verdict on the spec or data wins


def test_error_type_names_reads_the_type_and_errno_of_an_error_file_message() -> None:
    assert error_type_names("OutOfMemoryError: CUDA out of memory") == (["OutOfMemoryError"], None)
    assert error_type_names("torch.distributed.DistNetworkError: reset") == (
        ["DistNetworkError"],
        None,
    )
    assert error_type_names("OSError: [Errno 28] No space left on device") == (["OSError"], 28)
    assert error_type_names("Signal 9 (SIGKILL) received by PID 7") == ([], None)


SCRIPT = """
import os, sys, time
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    rank = int(os.environ["LOCAL_RANK"])
    print(f"rank {rank} starting", file=sys.stderr, flush=True)
    if sys.argv[1] == "raise" and rank == 1:
        raise MemoryError("could not allocate the activations")
    if sys.argv[1] == "exit":
        os._exit(1)
    if sys.argv[1] == "peer" and rank == 0:  # as if rank 1 had been SIGKILLed: no error file
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234")
    time.sleep(30)  # torchrun stops this rank when its peer fails

if __name__ == "__main__":
    main()
"""


def _torchrun(tmp_path: Path, mode: str) -> tuple[RunPaths, int]:
    """Run SCRIPT on 2 local ranks under torchrun, its logs where the worker puts them."""
    paths = RunPaths(run_dir=tmp_path / "run", checkpoint_dir="", data="")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", "t",
        "--log-dir", str(paths.log_dir), "--redirects", "3", str(script), mode,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, timeout=120)
    return paths, done.returncode


def test_the_first_failed_rank_and_its_exception_come_from_torchruns_error_file(
    tmp_path: Path,
) -> None:
    paths, returncode = _torchrun(tmp_path, "raise")
    assert returncode == 1
    (error,) = exits.rank_errors(paths, exits.last_restart(paths))
    assert error.local_rank == 1 and error.message.startswith("MemoryError: could not")
    assert "raise MemoryError" in error.callstack

    failure = exits.node_failure(
        paths=paths, returncode=returncode, node_rank=1, nproc=2, host="h1"
    )
    assert failure.failure_class is C.OOM
    assert failure.reason == "MemoryError: could not allocate the activations"
    assert (failure.rank, failure.node_rank, failure.host) == (3, 1, "h1")  # 1 * 2 + 1
    assert failure.exit_code == 1
    assert "rank 1 starting" in failure.log_tail  # rank 1's own stderr, not rank 0's
    assert any("MemoryError" in line for line in failure.log_tail)


def test_a_rank_gone_without_an_exception_is_infra_unless_the_oom_killer_struck(
    tmp_path: Path,
) -> None:
    paths, returncode = _torchrun(tmp_path, "exit")
    assert returncode == 1
    assert exits.rank_errors(paths, 0) == []
    hard_exit = exits.node_failure(
        paths=paths,
        returncode=returncode,
        node_rank=0,
        nproc=2,
        host="h",
        oom_kills_before=3,
        oom_kills_after=3,
    )
    assert hard_exit.failure_class is C.INFRA and hard_exit.rank is None
    assert hard_exit.exit_code == 1 and hard_exit.log_tail  # some rank's last lines
    killed = exits.node_failure(
        paths=paths,
        returncode=returncode,
        node_rank=0,
        nproc=2,
        host="h",
        oom_kills_before=3,
        oom_kills_after=4,
    )
    assert killed.failure_class is C.OOM and "OOM killer" in killed.reason


def test_a_survivor_s_echo_of_a_killed_peer_is_infra_or_oom_by_the_cgroup(
    tmp_path: Path,
) -> None:
    """A SIGKILLed rank 1 leaves no error file; rank 0's lost connection is the only one. It is
    not the survivor's own error (`user_error`, never retried) but the platform's: `infra`,
    and `oom` when the cgroup says the OOM killer struck."""
    paths, returncode = _torchrun(tmp_path, "peer")
    assert returncode == 1
    (echo,) = exits.rank_errors(paths, 0)
    assert echo.local_rank == 0 and "Connection closed by peer" in echo.message

    def failure(kills_after: int) -> Failure:
        return exits.node_failure(
            paths=paths,
            returncode=returncode,
            node_rank=0,
            nproc=2,
            host="h",
            oom_kills_before=3,
            oom_kills_after=kills_after,
        )

    lost = failure(3)
    assert (lost.failure_class, lost.rank) == (C.INFRA, 0)
    killed = failure(4)
    assert (killed.failure_class, killed.rank) == (C.OOM, None)  # the killed rank is unknown
    assert "OOM killer" in killed.reason and "rank 0: RuntimeError" in killed.reason


def _event(run_dir: Path, **fields: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "events.jsonl").open("a") as f:
        f.write(json.dumps({"type": "error", "time": 1.0, "attempt": 1, **fields}) + "\n")


def test_an_invalid_spec_or_data_exit_is_the_trainers_own_event(tmp_path: Path) -> None:
    """Exit 2 is a SystemExit: no error file, only the trainer's `error` event says why."""
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="", data="")
    stderr = paths.log_dir / "job1-a1_x" / "attempt_0" / "0" / "stderr.log"
    stderr.parent.mkdir(parents=True)
    stderr.write_text("trainer: invalid job, not retrying: InvalidJobError: no rows\n")
    _event(tmp_path, message="InvalidJobError: no rows", exit_code=2, failure_class="user_error",
           rank=0, restart=0)  # fmt: skip
    failure = exits.node_failure(paths=paths, returncode=1, node_rank=0, nproc=1, host="h")
    assert (failure.failure_class, failure.exit_code, failure.rank) == (C.USER_ERROR, 2, 0)
    assert failure.reason == "InvalidJobError: no rows"
    assert failure.log_tail == ("trainer: invalid job, not retrying: InvalidJobError: no rows",)


def test_an_event_of_an_earlier_in_place_restart_does_not_explain_the_last_one(
    tmp_path: Path,
) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="", data="")
    for restart in (0, 1):
        (paths.log_dir / "job1-a1_x" / f"attempt_{restart}" / "0").mkdir(parents=True)
    _event(tmp_path, message="MemoryError: x", exit_code=1, failure_class="oom", rank=0, restart=0)
    assert exits.trainer_error(paths, 0) is not None
    assert exits.last_restart(paths) == 1 and exits.trainer_error(paths, 1) is None
    failure = exits.node_failure(paths=paths, returncode=1, node_rank=0, nproc=1, host="h")
    assert failure.failure_class is C.INFRA  # restart 1 died without a word


def test_the_trainers_class_wins_over_the_type_name_for_the_same_exception(
    tmp_path: Path,
) -> None:
    paths = RunPaths(run_dir=tmp_path, checkpoint_dir="", data="")
    rank_dir = paths.log_dir / "job1-a1_x" / "attempt_0" / "0"
    rank_dir.mkdir(parents=True)
    message = "CheckpointError: write failed"  # a name the worker cannot judge by itself
    body = {"message": message, "extraInfo": {"py_callstack": "tb", "timestamp": "1"}}
    (rank_dir / "error.json").write_text(json.dumps({"message": body}))

    def judged() -> C:
        return exits.node_failure(
            paths=paths, returncode=1, node_rank=0, nproc=1, host="h"
        ).failure_class

    assert judged() is C.USER_ERROR
    _event(tmp_path, message=message, exit_code=1, failure_class="infra", rank=0, restart=0)
    assert judged() is C.INFRA


def test_oom_kills_reads_the_counter_of_the_processs_cgroup(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "work.slice").mkdir(parents=True)
    (v2 / "work.slice" / "memory.events").write_text("low 0\nhigh 0\nmax 2\noom 2\noom_kill 1\n")
    (tmp_path / "cgroup2").write_text("0::/work.slice\n")
    assert exits.oom_kills(tmp_path / "cgroup2", v2) == 1
    v1 = tmp_path / "v1"
    (v1 / "memory" / "w").mkdir(parents=True)
    (v1 / "memory" / "w" / "memory.oom_control").write_text("under_oom 0\noom_kill 5\n")
    (tmp_path / "cgroup1").write_text("5:cpu:/\n4:memory:/w\n")
    assert exits.oom_kills(tmp_path / "cgroup1", v1) == 5
    assert exits.oom_kills(tmp_path / "absent", v1) is None


def _exit(
    returncode: int,
    stop: Stop | None = None,
    *,
    completed: dict[str, int] | None = None,
    runtime_s: float = 0.0,
    stop_reason: str | None = None,
) -> Exit:
    reported = Reported(completed=completed)
    return Exit(returncode, stop, reported, True, runtime_s, stop_reason)


def test_node_end_says_failed_only_for_an_unasked_non_zero_exit_or_a_hang(tmp_path: Path) -> None:
    run = exits.NodeRun(
        paths=RunPaths(run_dir=tmp_path, checkpoint_dir="", data=""),
        node_rank=0,
        nproc=1,
        oom_kills=None,
    )
    done = exits.node_end(_exit(0, completed={"steps": 3}, runtime_s=4.0), run)
    assert done == NodeEnd(node_rank=0, exit_code=0, completed=True, runtime_s=4.0)
    cancelled = exits.node_end(_exit(1, Stop.CANCEL), run)  # the ranks died of the stop
    assert cancelled.failure is None and cancelled.stop is Stop.CANCEL
    hung = exits.node_end(_exit(-9, Stop.HANG, stop_reason="no step progress for 61 s"), run)
    assert hung.failure is not None and hung.failure.failure_class is C.HANG
    assert hung.failure.reason == "no step progress for 61 s"
    crashed = exits.node_end(_exit(1), run)
    assert crashed.failure is not None and crashed.failure.failure_class is C.INFRA


def test_a_plain_command_rank_that_exits_non_zero_without_an_exception_is_user_error(
    tmp_path: Path,
) -> None:
    paths, returncode = _torchrun(tmp_path, "exit")
    assert returncode == 1 and exits.rank_errors(paths, 0) == []

    def failure(oom_kills_after: int) -> Failure:
        return exits.node_failure(
            paths=paths,
            returncode=returncode,
            node_rank=0,
            nproc=2,
            host="h",
            oom_kills_before=3,
            oom_kills_after=oom_kills_after,
            plain_command=True,
        )

    exited = failure(3)
    assert exited.failure_class is C.USER_ERROR and "without recording" in exited.reason
    assert exited.log_tail
    assert failure(4).failure_class is C.OOM


SINGLE_RANK = """
import os, signal, sys
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} starting", file=sys.stderr)
    if sys.argv[1] == "raise":
        raise MemoryError("could not allocate the activations")
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    main()
"""


def _single_rank(tmp_path: Path, mode: str) -> tuple[RunPaths, int]:
    """Run SINGLE_RANK as the worker runs a node's one rank without torchrun
    (`workers.lone_rank`): its environment, its output and error files."""
    paths = RunPaths(run_dir=tmp_path / "run", checkpoint_dir="", data="")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SINGLE_RANK))
    env = {**os.environ, **lone_rank.env(job_id=7, attempt=2, rdzv_port=29500, paths=paths)}
    rank_dir = lone_rank.rank_dir(paths, 7, 2)
    proc = spawn([sys.executable, str(script), mode], env, paths, rank_dir=rank_dir)
    return paths, proc.wait(timeout=120)


def test_a_single_rank_s_exception_comes_from_its_error_file_as_under_torchrun(
    tmp_path: Path,
) -> None:
    paths, returncode = _single_rank(tmp_path, "raise")
    assert returncode == 1
    assert exits.last_restart(paths) == 0
    (error,) = exits.rank_errors(paths, 0)
    assert error.local_rank == 0 and error.message.startswith("MemoryError: could not")
    failure = exits.node_failure(
        paths=paths, returncode=returncode, node_rank=0, nproc=1, host="h", single_rank=True
    )
    assert failure.failure_class is C.OOM and failure.rank == 0
    assert "rank 0 of 1 starting" in failure.log_tail  # its stderr, in torchrun's layout
    assert not paths.launcher_log("stderr").exists()  # no launcher: nothing of rank -1


def test_a_single_rank_killed_by_a_signal_is_infra_and_names_the_signal(tmp_path: Path) -> None:
    paths, returncode = _single_rank(tmp_path, "kill")
    assert returncode == -signal.SIGKILL
    failure = exits.node_failure(
        paths=paths, returncode=returncode, node_rank=0, nproc=1, host="h", single_rank=True
    )
    assert failure.failure_class is C.INFRA and failure.exit_code == -9
    assert failure.reason.endswith("the rank was killed by SIGKILL"), failure.reason
    assert failure.log_tail == ("rank 0 of 1 starting",)
