"""What Torchyard says to Slurm and how it reads Slurm's answers; pure, no Slurm needed.

- `script`: the `sbatch` script of one job on a Slurm pool (`core.platform.settings.SlurmPool`):
  one task per node (`--ntasks-per-node=1`), the node's devices (`--gres=gpu:K` or
  `--cpus-per-task=K`, K = `resources.procs_per_node`), `--requeue`, and `--signal=TERM@<s>` so
  the node agents hand the job back (checkpointed) before the time limit; its one step is
  `srun <python> -m workers slurm-node --job <id>` (`workers.slurm.agent`), which launches
  torchrun on every node exactly as a Celery worker does (the same argv, environment
  allow-list, sandbox and cgroup), so the trainer and a team's program cannot tell the
  executors apart.
- `parse_squeue`: Slurm's `squeue --json` (openapi v0.0.38 of Slurm 22.05, and the
  `{"set", "number"}` / state-list forms of 23.02 and later) read into `SlurmState`s.
- `end_failure`: what an allocation that ended before its node agents recorded the attempt's
  end means for the attempt: Slurm's `job_state` to a failure class (`OUT_OF_MEMORY` -> `oom`,
  `NODE_FAIL` -> `node_lost`, `PREEMPTED` -> `preempted`, `TIMEOUT` and the rest -> `infra`).

Slurm's job states and reasons: https://slurm.schedmd.com/job_state_codes.html and
https://slurm.schedmd.com/squeue.html#SECTION_JOB-REASON-CODES .
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.attempts.lifecycle_policy import Failure
from core.platform.settings import SlurmPool
from dataformat.failures import FailureClass

# A requeued job is PENDING again (REQUEUED and the holds are its transient and held forms).
REQUEUED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
# Slurm job states after which the job never runs again (a requeued job goes back to PENDING).
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)

_CLASSES = {
    "OUT_OF_MEMORY": FailureClass.OOM,
    "NODE_FAIL": FailureClass.NODE_LOST,
    "BOOT_FAIL": FailureClass.NODE_LOST,
    "PREEMPTED": FailureClass.PREEMPTED,
}
_WORDS = {
    "OUT_OF_MEMORY": "the allocation ran out of memory (Slurm: OUT_OF_MEMORY)",
    "NODE_FAIL": "a node of the allocation failed (Slurm: NODE_FAIL)",
    "BOOT_FAIL": "a node of the allocation failed to boot (Slurm: BOOT_FAIL)",
    "PREEMPTED": "Slurm preempted the allocation (PREEMPTED)",
    "TIMEOUT": "the allocation reached its Slurm time limit (TIMEOUT)",
    "DEADLINE": "the allocation reached its Slurm deadline (DEADLINE)",
    "CANCELLED": "the allocation was cancelled in Slurm (CANCELLED), not through Torchyard",
}


class BadPool(ValueError):
    """A Slurm pool setting that cannot go into an `#SBATCH` line (a newline in it)."""


@dataclass(frozen=True)
class SlurmState:
    """One Slurm job as `squeue --json` shows it. `state`: Slurm's `job_state` (PENDING,
    RUNNING, COMPLETED, OUT_OF_MEMORY, ...); `reason`: its `state_reason` (`Resources`,
    `Priority`; None for `None`); `start_at`: the start, or the expected start of a pending job
    (None: Slurm has no estimate); `exit_code`: the batch script's exit status (None: not
    ended); `restarts`: Slurm's `restart_cnt` (requeues)."""

    slurm_job_id: int
    state: str
    reason: str | None
    start_at: datetime | None
    end_at: datetime | None
    exit_code: int | None
    restarts: int
    nodes: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def queue_reason(self) -> str:
        """The job's queue reason while Slurm holds it: `slurm PENDING (Resources)`."""
        why = f" ({self.reason})" if self.reason else ""
        return f"slurm {self.state}{why}"


def script(
    pool: SlurmPool,
    *,
    job_id: int,
    nodes: int,
    slots: int,
    python: str,
    workdir: str,
    output: str,
) -> str:
    """The `sbatch` script of job `job_id`: `nodes` nodes of `slots` devices each (GPUs when
    `pool.gpus`, else CPUs), its output to `output` (`%j` is the Slurm job id), the node agent
    run by `python` from `workdir` (the source tree of the submitter's Torchyard).

    Raises `BadPool` when a setting holds a newline (it would end the `#SBATCH` line)."""
    lines = [
        f"--job-name=torchyard-{job_id}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--gres=gpu:{slots}" if pool.gpus else f"--cpus-per-task={slots}",
        "--requeue",
        f"--signal=TERM@{pool.signal_s}",
        f"--output={output}",
        "--open-mode=append",
    ]
    if pool.memory_mb_per_slot is not None:
        lines.append(f"--mem={pool.memory_mb_per_slot * slots}")
    for flag, value in (
        ("partition", pool.partition),
        ("account", pool.account),
        ("qos", pool.qos),
        ("time", pool.time_limit),
    ):
        if value:
            lines.append(f"--{flag}={value}")
    lines += pool.sbatch_args
    for line in lines:
        if "\n" in line or "\r" in line:
            raise BadPool(f"a Slurm pool setting holds a newline: {line!r}")
    agent = [python, "-m", "workers", "slurm-node", "--job", str(job_id)]
    body = [
        "#!/bin/bash",
        *(f"#SBATCH {line}" for line in lines),
        "set -u",
        # The agent sizes its device allocator from this, as a worker from TORCHYARD_WORKER_SLOTS.
        f"export TORCHYARD_WORKER_SLOTS={slots}",
        f"cd {shlex.quote(workdir)}",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=0 " + shlex.join(agent),
        "",
    ]
    return "\n".join(body)


def _number(value: Any) -> int | None:
    """A number of `squeue --json`: a plain int (22.05) or `{"set", "infinite", "number"}`."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    return int(value) if isinstance(value, int | float) else None


def _time(value: Any) -> datetime | None:
    seconds = _number(value)
    return datetime.fromtimestamp(seconds, UTC) if seconds else None


def _state(value: Any) -> str:
    """`job_state`: a string (22.05) or a list of flags, the base state first (23.02+)."""
    if isinstance(value, list):
        return str(value[0]) if value else "UNKNOWN"
    return str(value or "UNKNOWN")


def _exit_code(record: Mapping[str, Any], state: str) -> int | None:
    if state not in ENDED:
        return None
    value = record.get("exit_code")
    if isinstance(value, Mapping):  # 23.02+: {"status", "return_code", "signal"}
        return _number(value.get("return_code"))
    return _number(value)


def parse_squeue(text: str | bytes) -> dict[int, SlurmState]:
    """{Slurm job id: state} of `squeue --json` output. Raises ValueError on text that is not
    `squeue --json`'s object."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise ValueError("not squeue --json output: no 'jobs' list")
    out: dict[int, SlurmState] = {}
    for record in data["jobs"]:
        job_id = _number(record.get("job_id"))
        if job_id is None:
            continue
        state = _state(record.get("job_state"))
        reason = record.get("state_reason")
        out[job_id] = SlurmState(
            slurm_job_id=job_id,
            state=state,
            reason=None if reason in (None, "", "None") else str(reason),
            start_at=_time(record.get("start_time")),
            end_at=_time(record.get("end_time")) if state in ENDED else None,
            exit_code=_exit_code(record, state),
            restarts=_number(record.get("restart_cnt")) or 0,
            nodes=str(record.get("nodes") or ""),
        )
    return out


def end_failure(state: SlurmState, *, host: str | None = None) -> Failure:
    """The failure of an attempt whose allocation ended (`state.ended`) while the attempt was
    still active: its node agents never recorded its end (killed with the allocation, or never
    started). `PREEMPTED` is `preempted` (requeued without using the restart budget)."""
    cls = _CLASSES.get(state.state, FailureClass.INFRA)
    words = _WORDS.get(state.state) or (
        f"the Slurm job ended {state.state} (exit {state.exit_code}) before its node agents "
        "recorded the attempt's end"
    )
    return Failure(
        cls, f"{words}; Slurm job {state.slurm_job_id}", host=host, exit_code=state.exit_code
    )


def requeued_failure(state: SlurmState, *, host: str | None = None) -> Failure:
    """The failure of an attempt whose allocation Slurm requeued (back to PENDING) while the
    attempt was still active: its node agents were gone without recording an end, as when a node
    dies (Slurm's `NODE_FAIL` requeues a `--requeue` job). An orderly requeue or preemption
    SIGTERMs live agents, which hand the job back themselves first. `node_lost`."""
    why = f" ({state.reason})" if state.reason else ""
    return Failure(
        FailureClass.NODE_LOST,
        f"Slurm requeued the allocation{why} after its node agents vanished without recording "
        f"the attempt's end: a node failed; Slurm job {state.slurm_job_id}",
        host=host,
    )


def squeue_argv(slurm_job_ids: Sequence[int]) -> list[str]:
    """`squeue` for these jobs in any state (ended ones stay listed for `MinJobAge` seconds)."""
    return ["squeue", "--json", "--states=all", "--jobs=" + ",".join(map(str, slurm_job_ids))]
