"""One test per failure class the worker tells apart, each fault injected from outside the
product on a real Celery worker running real torchrun on CPU: a memory limit on a running rank
(`oom`), a corrupt dataset (`user_error`), a checkpoint directory that turns read-only
(`infra`). `hang` (a SIGSTOPped rank) is tests/integration/workers/liveness/test_hang.py,
`node_lost` (a SIGKILLed worker) tests/integration/faults/test_worker_killed.py; `preempted` has no
producer yet (tests/unit/core/test_lifecycle.py covers its policy).

Each test checks what a user and an operator read: the job's `failure` (class, a reason
naming the cause, the failing rank, its last log lines), the state event's `failure_class`,
the restart counters, and that no process of the job is left.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil
import pytest
from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from core.datasets import service as datasets
from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from core.platform.tables import Job, JobEvent
from jobspec.job import JobSpec
from tests.conftest import ProjectKey
from tests.integration.faults.inject import (
    ALWAYS_MAPPED_BYTES,
    can_mount,
    cgroup_for,
    corrupt_jsonl_corpus,
    limit_address_space,
    paused,
    read_only,
)
from tests.integration.workers.helpers import (
    RANK_SPAWN_S,
    TERMINAL,
    Worker,
    create_job,
    group_gone,
    job_events,
    job_row,
    launches,
    left_running,
    metric_series,
    rank_process,
    send,
    start_worker,
    tiny_spec,
    unique_queue,
    wait_for,
    wait_state,
)

# Launch -> first step is 4-10 s on these two shared cores; a tiny step 1-6 s.
FIRST_STEP_S = 90.0
FAIL_S = 60.0
# A step of 512 x 64 tokens: its logits (x 256 byte values x 4 bytes) are one 32 MiB block.
OOM_MODEL = {"n_layers": 1, "n_heads": 2, "d_model": 32, "seq_len": 64}
OOM_MICRO_BATCH = 512
assert OOM_MICRO_BATCH * OOM_MODEL["seq_len"] * 256 * 4 >= ALWAYS_MAPPED_BYTES


def _oom_spec(pool: str, dataset_id: str, **sections: dict[str, Any]) -> JobSpec:
    """Trains until stopped; every step allocates (and frees) 32 MiB blocks."""
    return tiny_spec(
        pool=pool,
        dataset_id=dataset_id,
        model=OOM_MODEL,
        train={"max_steps": 100_000, "micro_batch_size": OOM_MICRO_BATCH},
        eval={"interval_steps": 100_000},
        checkpoint={"interval_steps": 100_000},
        **sections,
    )


def _state_events(engine: Engine, job_id: int, state: str) -> list[JobEvent]:
    return [e for e in job_events(engine, job_id) if e.kind == "state" and e.state_to == state]


def _processes(pgid: int) -> list[psutil.Process]:
    """torchrun (`pgid`) and every process under it."""
    torchrun = psutil.Process(pgid)
    return [torchrun, *torchrun.children(recursive=True)]


def _nothing_left(pgid: int, procs: list[psutil.Process]) -> None:
    wait_for("the trainer's process group to be gone", lambda: group_gone(pgid), 15)
    assert left_running(procs) == []


# Where the allocation that hits RLIMIT_AS happens decides the words: torch's CPU allocator, or
# Python's MemoryError (re-raised by torch from a future's callback as a RuntimeError).
OUT_OF_ADDRESS_SPACE = ("can't allocate memory", "MemoryError")


def _check_failure(
    job: Job, failure_class: str, *, rank: int | None, cause: str | tuple[str, ...]
) -> dict[str, Any]:
    """The job's failure record and its error text say `failure_class`, `cause` and `rank`,
    with the last log lines of the rank that explains it. Returns the record."""
    failure = job.failure
    assert failure is not None, job.error
    assert failure["class"] == failure_class, failure
    causes = (cause,) if isinstance(cause, str) else cause
    assert any(c in failure["reason"] for c in causes), failure
    assert (failure["rank"], failure["node_rank"]) == (rank, 0), failure
    assert failure["log_tail"], failure
    assert (job.error or "").startswith(f"[{failure_class}] "), job.error
    return failure


def _out_of_memory(
    engine: Engine,
    job_id: int,
    rank: int,
    attempt: int,
    limit: Callable[[psutil.Process, Callable[[], int]], object],
) -> list[psutil.Process]:
    """Once attempt `attempt` trains, `limit(rank's process, step)` the memory of rank `rank`
    to what it already uses (`step()`: the attempt's latest recorded step); returns the
    attempt's processes (torchrun and its ranks)."""

    def step() -> int:  # of this attempt (the job row's current_step spans attempts)
        points = metric_series(engine, job_id, "loss")
        return max((p.step for p in points if p.attempt == attempt), default=0)

    def launched() -> JobEvent | None:
        found = [e for e in launches(job_events(engine, job_id)) if e.attempt == attempt]
        return found[0] if found else None

    pgid = wait_for(f"attempt {attempt}'s launch", launched, FIRST_STEP_S).data["pgid"]
    wait_for(f"attempt {attempt}'s first step", lambda: step() > 0, FIRST_STEP_S)
    victim = wait_for(f"rank {rank}'s process", lambda: rank_process(pgid, rank), RANK_SPAWN_S)
    procs = _processes(pgid)
    limit(victim, step)
    return procs


def _address_space(proc: psutil.Process, step: Callable[[], int]) -> None:
    limit_address_space(proc, step, FAIL_S)


def test_a_rank_out_of_memory_fails_the_job_as_oom_without_a_restart_by_default(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    """Rank 1 of two runs out of address space; rank 0 then loses its peer. The failure is
    rank 1's `oom`, not rank 0's echo, and `oom` has no restart budget unless asked for,
    whatever `max_restarts` says."""
    spec = _oom_spec(
        worker.queue, dataset_id, resources={"procs_per_node": 2}, retries={"max_restarts": 1}
    )
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, worker.queue)
    procs = _out_of_memory(engine, job_id, 1, 1, _address_space)

    job = wait_state(engine, job_id, TERMINAL, FAIL_S, worker)
    assert (job.state, job.attempt, job.restarts_used) == ("failed", 1, 0), job.error
    failure = _check_failure(job, "oom", rank=1, cause=OUT_OF_ADDRESS_SPACE)
    assert any(c in line for line in failure["log_tail"] for c in OUT_OF_ADDRESS_SPACE)
    (failed,) = _state_events(engine, job_id, "failed")
    assert failed.data["failure_class"] == "oom"
    assert _state_events(engine, job_id, "restarting") == []
    _nothing_left(procs[0].pid, procs)


def test_an_oom_budget_restarts_the_job_once_then_it_fails(
    engine: Engine, celery_client: Celery, project: ProjectKey, dataset_id: str, worker: Worker
) -> None:
    """`retries.on: {oom: 1}`: the first OOM restarts the job, counted against `oom`; the
    second (the limit is injected again into the new attempt's rank) exhausts the budget."""
    spec = _oom_spec(worker.queue, dataset_id, retries={"max_restarts": 0, "on": {"oom": 1}})
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, worker.queue)
    first = _out_of_memory(engine, job_id, 0, 1, _address_space)

    (restarting,) = wait_for(
        "the restart", lambda: _state_events(engine, job_id, "restarting"), FAIL_S
    )
    assert restarting.data["failure_class"] == "oom", restarting.data
    assert "can't allocate memory" in restarting.data["reason"]
    _nothing_left(first[0].pid, first)
    second = _out_of_memory(engine, job_id, 0, 2, _address_space)

    job = wait_state(engine, job_id, TERMINAL, FAIL_S, worker)
    assert (job.state, job.attempt) == ("failed", 2), job.error
    assert (job.restarts_used, job.restarts_by_class) == (1, {"oom": 1})
    _check_failure(job, "oom", rank=0, cause=OUT_OF_ADDRESS_SPACE)
    (failed,) = _state_events(engine, job_id, "failed")
    assert failed.data["failure_class"] == "oom"
    _nothing_left(second[0].pid, second)


def test_a_rank_the_kernel_s_oom_killer_ends_is_oom(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    dataset_id: str,
) -> None:
    """A worker in a memory cgroup (as in a container with a memory limit) whose limit is
    lowered under the running job: the kernel SIGKILLs rank 1, which leaves no exception
    behind, and rank 0 raises gloo's lost-peer error. The job's cgroup (the worker's own below
    this one) counted the kill, so the failure is `oom`: neither rank 0's echo as its own error
    nor a bare `infra`."""
    with cgroup_for(f"torchyard-test-{secrets.token_hex(3)}") as group:
        worker = start_worker(
            settings=settings,
            client=celery_client,
            queue=unique_queue("oom-killer"),
            log_dir=worker_logs,
        )
        try:
            group.join(worker.proc.pid)  # before the launch: torchrun and its ranks are born in it
            spec = _oom_spec(
                worker.queue,
                dataset_id,
                resources={"procs_per_node": 2},
                retries={"max_restarts": 1},
            )
            job_id = create_job(engine, project, spec)
            send(celery_client, job_id, worker.queue)

            def cap(rank: psutil.Process, step: Callable[[], int]) -> None:
                Path(f"/proc/{rank.pid}/oom_score_adj").write_text("1000")  # the victim
                group.limit(step, FAIL_S)

            procs = _out_of_memory(engine, job_id, 1, 1, cap)
            job = wait_state(engine, job_id, TERMINAL, FAIL_S, worker)
            # The kill is counted in the job's own cgroup below this one (cgroup v1 charges
            # the event to the victim's group, and the worker removed it once the job ended):
            # `oom` below is the worker's reading of that counter.
        finally:
            worker.stop()
    assert (job.state, job.attempt, job.restarts_used) == ("failed", 1, 0), job.error
    # Which rank was killed nothing recorded. The survivor's echo is named in the reason when
    # rank 0 raised it before torchrun stopped it; on a loaded host torchrun may stop it
    # first (the last fresh-clone CI): then there is no echo, and still no other cause.
    failure = _check_failure(job, "oom", rank=None, cause="OOM killer")
    echo = failure["reason"].partition("OOM killer")[2]
    if "rank" in echo:
        # gloo words the dead peer's socket either way (the fresh-clone CI of 4dfdffa: "reset")
        peer_gone = "closed by peer" in echo or "reset by peer" in echo
        assert "rank 0: RuntimeError" in echo and peer_gone, failure["reason"]
    (failed,) = _state_events(engine, job_id, "failed")
    assert failed.data["failure_class"] == "oom"
    _nothing_left(procs[0].pid, procs)


def test_a_corrupt_dataset_is_a_user_error_never_retried(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    models_root: Path,
    worker: Worker,
) -> None:
    """A dataset directory whose JSONL ends in a truncated record: registered as a directory,
    the API cannot see it; the trainer's data preparation meets it, exits 2, and the job
    fails at once although `max_restarts` would allow two restarts."""
    bad_line = '{"text": "def g(x):\\n    return'
    corpus = corrupt_jsonl_corpus(
        models_root / f"corrupt-{secrets.token_hex(3)}", good_records=200, bad_line=bad_line
    )
    with Session(engine, expire_on_commit=False) as s:
        dataset = datasets.register(
            session=s,
            settings=settings,
            project_id=project.project_id,
            name=corpus.name,
            uri=str(corpus),
        )
    spec = tiny_spec(pool=worker.queue, dataset_id=dataset.id, retries={"max_restarts": 2})
    job_id = create_job(engine, project, spec)
    send(celery_client, job_id, worker.queue)

    job = wait_state(engine, job_id, TERMINAL, FIRST_STEP_S, worker)
    assert (job.state, job.attempt, job.restarts_used) == ("failed", 1, 0), job.error
    failure = _check_failure(job, "user_error", rank=0, cause="train.jsonl:201")
    assert failure["exit_code"] == 2 and job.exit_code == 2
    assert any("train.jsonl:201" in line for line in failure["log_tail"])
    (failed,) = _state_events(engine, job_id, "failed")
    assert failed.data["failure_class"] == "user_error"
    assert _state_events(engine, job_id, "restarting") == []
    (launch,) = launches(job_events(engine, job_id))
    wait_for("the trainer's process group to be gone", lambda: group_gone(launch.data["pgid"]), 15)


@pytest.fixture
def unsandboxed_worker(
    settings: Settings, celery_client: Celery, worker_logs: Path
) -> Iterator[Worker]:
    """A worker that runs ranks without the sandbox (`TORCHYARD_SANDBOX=none`): `read_only`
    mounts over a directory on the host while the ranks run, and a sandbox's mount namespace,
    private and made at launch, never sees a later host mount."""
    w = start_worker(
        settings=settings,
        client=celery_client,
        queue=unique_queue("unsandboxed"),
        log_dir=worker_logs,
        extra_env={"TORCHYARD_SANDBOX": "none"},
    )
    yield w
    w.stop()


@pytest.mark.skipif(can_mount() is not None, reason=str(can_mount()))
def test_a_read_only_checkpoint_directory_is_infra_and_the_restart_resumes(
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    project: ProjectKey,
    dataset_id: str,
    unsandboxed_worker: Worker,
) -> None:
    """The job's checkpoint directory turns read-only after the step-10 checkpoint: the
    step-20 save fails (EROFS), the attempt fails as `infra` and restarts; once the storage is
    writable again the next attempt resumes from step 10 and completes at step 20."""
    worker = unsandboxed_worker
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": 20},
        eval={"interval_steps": 20},
        checkpoint={"interval_steps": 10, "keep_last": 5},
        retries={"max_restarts": 1},
    )
    job_id = create_job(engine, project, spec)
    checkpoints = Path(job_checkpoint_uri(settings, job_id).removeprefix("file://"))
    send(celery_client, job_id, worker.queue)
    (launch,) = wait_for("the launch", lambda: launches(job_events(engine, job_id)), FIRST_STEP_S)
    pgid = launch.data["pgid"]
    rank = wait_for("rank 0's process", lambda: rank_process(pgid, 0), RANK_SPAWN_S)
    procs = _processes(pgid)

    # A tiny step takes 20 ms on an idle box: the rank is held while the storage turns, so
    # the fault lands between the step-10 checkpoint and the step-20 one.
    complete = checkpoints / "step_00000010" / ".metadata"
    wait_for("the step-10 checkpoint", complete.exists, FIRST_STEP_S, poll_s=0.005)
    with ExitStack() as fault:
        with paused(rank):
            assert not (checkpoints / "step_00000020").exists(), "too late: step 20 is saved"
            fault.enter_context(read_only(checkpoints))
        (restarting,) = wait_for(
            "the restart", lambda: _state_events(engine, job_id, "restarting"), FAIL_S
        )
    assert restarting.data["failure_class"] == "infra", restarting.data
    assert "Read-only file system" in restarting.data["reason"]
    failure = job_row(engine, job_id).failure
    assert failure is not None and failure["class"] == "infra", failure
    assert (failure["rank"], failure["node_rank"]) == (0, 0), failure
    assert failure["reason"].startswith("CheckpointWriteError: checkpoint at step 20")
    assert any("Read-only file system" in line for line in failure["log_tail"]), failure
    _nothing_left(pgid, procs)

    job = wait_state(engine, job_id, TERMINAL, FIRST_STEP_S, worker)
    assert (job.state, job.attempt) == ("succeeded", 2), job.error
    assert (job.restarts_used, job.restarts_by_class) == (1, {"infra": 1})
    resumed = next(e for e in _state_events(engine, job_id, "running") if e.attempt == 2)
    assert resumed.data["start_step"] == 10
