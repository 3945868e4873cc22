"""The Slurm executor's pure parts (`workers.slurm.batch`): the sbatch script, `squeue --json`
of Slurm 22.05 and of 23.02+, and what an allocation's end means for the attempt."""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime

import pytest

from core.platform.settings import SlurmPool
from dataformat.failures import FailureClass
from workers.slurm import batch


def _script(pool: SlurmPool, **kwargs: object) -> str:
    args = {"job_id": 7, "nodes": 2, "slots": 4, "python": "/opt/venv/bin/python",
            "workdir": "/srv/torch yard",
            "output": "/home/ty/slurm/job-7/slurm-%j.out"}  # fmt: skip
    return batch.script(pool, **{**args, **kwargs})  # type: ignore[arg-type]


def _directives(text: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")
    ]


def test_the_script_asks_one_task_per_node_the_devices_requeue_and_the_early_signal() -> None:
    text = _script(
        SlurmPool(partition="gpu", account="ml", qos="high", time_limit="04:00:00", gpus=True,
                  memory_mb_per_slot=1000, signal_s=90, sbatch_args=["--exclusive"])
    )  # fmt: skip
    assert text.startswith("#!/bin/bash\n")
    assert _directives(text) == [
        "--job-name=torchyard-7",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gres=gpu:4",
        "--requeue",
        "--signal=TERM@90",
        "--output=/home/ty/slurm/job-7/slurm-%j.out",
        "--open-mode=append",
        "--mem=4000",
        "--partition=gpu",
        "--account=ml",
        "--qos=high",
        "--time=04:00:00",
        "--exclusive",
    ]
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert shlex.split(srun)[-6:] == ["/opt/venv/bin/python", "-m", "workers", "slurm-node",
                                      "--job", "7"]  # fmt: skip
    assert "cd '/srv/torch yard'" in text  # quoted: a path with a space stays one word
    assert "export TORCHYARD_WORKER_SLOTS=4" in text


def test_a_cpu_pool_asks_cpus_per_task_and_leaves_unset_settings_to_slurm() -> None:
    directives = _directives(_script(SlurmPool(), slots=3, nodes=1))
    assert "--cpus-per-task=3" in directives
    assert not any(d.startswith(("--gres", "--mem", "--partition", "--time")) for d in directives)


def test_a_setting_with_a_newline_cannot_smuggle_a_command_into_the_script() -> None:
    with pytest.raises(batch.BadPool, match="newline"):
        _script(SlurmPool(sbatch_args=["--comment=x\nrm -rf /"]))


def test_squeue_of_slurm_22_05_reads_states_reasons_times_and_exit_codes() -> None:
    text = json.dumps({"jobs": [
        {"job_id": 5, "job_state": "PENDING", "state_reason": "Resources",
         "start_time": 1795879300, "end_time": 0, "exit_code": 0, "restart_cnt": 0, "nodes": ""},
        {"job_id": 6, "job_state": "OUT_OF_MEMORY", "state_reason": "None",
         "start_time": 1795879236, "end_time": 1795879239, "exit_code": 137, "restart_cnt": 1,
         "nodes": "vm"},
    ]})  # fmt: skip
    states = batch.parse_squeue(text)
    pending, oom = states[5], states[6]
    assert (pending.state, pending.reason, pending.ended, pending.exit_code) == (
        "PENDING", "Resources", False, None)  # fmt: skip
    assert pending.start_at == datetime.fromtimestamp(1795879300, UTC)
    assert pending.queue_reason() == "slurm PENDING (Resources)"
    assert (oom.ended, oom.reason, oom.exit_code, oom.restarts, oom.nodes) == (
        True, None, 137, 1, "vm")  # fmt: skip


def test_squeue_of_slurm_23_reads_state_lists_and_set_numbers() -> None:
    text = json.dumps({"jobs": [
        {"job_id": {"set": True, "number": 9}, "job_state": ["NODE_FAIL", "REQUEUED"],
         "state_reason": "NodeDown", "start_time": {"set": True, "infinite": False, "number": 100},
         "end_time": {"set": True, "number": 200},
         "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0}}},
        {"job_id": 10, "job_state": ["PENDING"], "start_time": {"set": False, "number": 0}},
    ]})  # fmt: skip
    states = batch.parse_squeue(text)
    assert states[9].state == "NODE_FAIL" and states[9].ended
    assert states[9].end_at == datetime.fromtimestamp(200, UTC)
    assert states[10].start_at is None and not states[10].ended


def test_text_that_is_not_squeue_json_is_refused() -> None:
    with pytest.raises(ValueError):
        batch.parse_squeue('{"errors": []}')
    with pytest.raises(ValueError):
        batch.parse_squeue("squeue: error: Unable to contact slurm controller")


@pytest.mark.parametrize(
    ("state", "cls"),
    [
        ("OUT_OF_MEMORY", FailureClass.OOM),
        ("NODE_FAIL", FailureClass.NODE_LOST),
        ("PREEMPTED", FailureClass.PREEMPTED),
        ("TIMEOUT", FailureClass.INFRA),
        ("CANCELLED", FailureClass.INFRA),
        ("FAILED", FailureClass.INFRA),
    ],
)
def test_an_allocation_that_ended_under_a_live_attempt_fails_it_with_slurms_class(
    state: str, cls: FailureClass
) -> None:
    ended = batch.SlurmState(41, state, None, None, None, 1, 0, "vm")
    failure = batch.end_failure(ended, host="vm")
    assert failure.failure_class is cls
    assert "Slurm job 41" in failure.reason and failure.host == "vm"
    assert (state in failure.reason) or state == "FAILED"
