"""The examples under `examples/` as a user runs them, through REST against a real API
server and a real worker (issue 13): the directory uploaded with the SDK, its `spec.yaml`
submitted (2 CPU processes; fewer steps through the command's own flags), then paused at a
checkpoint, resumed, the worker SIGKILLed with its whole process tree and started again. The
job succeeds; every step's metrics are stored once; each attempt after an interruption starts
right after the checkpoint it resumed from, and the steps run again after the kill report the
values they reported before it (the examples resume model, optimizer and data order)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import REPO_ROOT, ProjectKey
from tests.integration.workers.helpers import (
    Worker,
    job_events,
    kill_tree,
    metric_series,
    start_worker,
    unique_queue,
)
from tests.integration.workers.sdk_waits import checkpoint_after, step_passed, wait_job
from torchyard import Client

EXAMPLES = REPO_ROOT / "examples"
# Each example's command, shortened: checkpoints often, and enough steps after a resume that
# the test can kill the worker between the resumed attempt's first checkpoint and the end (the
# kill lands a third of an interval past the second checkpoint; the end is more than one more
# interval further: every step there is CPU the suite spends only to finish).
COMMANDS = {
    "ddp": ["python", "train.py", "--max-steps", "500", "--checkpoint-every", "100"],
    "fsdp2": ["python", "train.py", "--max-steps", "250", "--checkpoint-every", "60"],
}
# The story is five waits of up to `TIMEOUT_S` (240 s) each: 37 s on a quiet host, past the
# suite's 300 s per test once on CI's loaded one (at 07cc4c3), which cut the last wait short
# without its account of the job and the worker. The bound is the waits', so they fail first.
pytestmark = pytest.mark.timeout(900)
# `hf_trainer` reads a registered base model and a dataset (`entrypoint.inputs`): the same story
# with its inputs in tests/integration/workers/test_inputs.py.


def example_spec(name: str, pool: str) -> dict[str, Any]:
    """`examples/NAME/spec.yaml` with the shortened command, on `pool`."""
    spec: dict[str, Any] = yaml.safe_load((EXAMPLES / name / "spec.yaml").read_text())
    assert spec["resources"]["procs_per_node"] == 2 and spec["resources"]["device"] == "cpu"
    spec["entrypoint"]["command"] = COMMANDS[name]
    spec["resources"]["pool"] = pool
    return spec


def first_step(points: list[Any], attempt: int) -> int:
    return min(p.step for p in points if p.attempt == attempt)


@pytest.mark.parametrize("example", sorted(COMMANDS))
def test_an_example_is_paused_resumed_and_survives_a_killed_worker_from_its_own_checkpoint(
    example: str,
    live_api: str,
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    project: ProjectKey,
    fleet: list[Worker],
) -> None:
    queue = unique_queue(f"example-{example}")
    # Two CPU slots on the threads pool, so that the restarted worker answers its start-up ping
    # while it already runs the requeued job (a solo pool would not until the job ended).
    fleet.append(
        start_worker(
            settings=settings, client=celery_client, queue=queue, log_dir=worker_logs, slots=2
        )
    )
    max_steps = int(COMMANDS[example][3])
    with Client(live_api, project.api_key) as client:
        archive = client.code.upload(EXAMPLES / example)
        spec = example_spec(example, queue)
        spec["entrypoint"]["code"] = archive.id
        job_id = client.jobs.create(spec).id

        # Pause once a first checkpoint is recorded: the script saves where it stops.
        checkpoint_after(client, job_id, 0)
        assert client.jobs.pause(job_id).state == "pausing"  # a running job checkpoints first
        paused = wait_job(client, job_id, ("paused",), fleet[0])
        paused_at = max(c.step for c in client.jobs.checkpoints(job_id))
        assert paused_at == paused.current_step, "the stop saved the step it stopped at"
        assert client.jobs.resume(job_id).state == "queued"

        # Kill the worker once the resumed run has checkpointed past the pause.
        # Mid-way to the next checkpoint, so that some steps are lost and run again.
        every = int(COMMANDS[example][5])
        past = checkpoint_after(client, job_id, paused_at) + every // 3
        resumed = step_passed(client, job_id, past)
        kill_tree(fleet[0], at_least=4)  # worker, torchrun, 2 ranks
        before_kill = {p.step: p.value for p in metric_series(engine, job_id, "loss")}
        recorded = max(c.step for c in client.jobs.checkpoints(job_id))
        assert recorded < max_steps, "the run ended before the kill: give it more steps"
        # The same worker started again requeues its predecessor's job at once.
        fleet.append(
            start_worker(
                settings=settings,
                client=celery_client,
                queue=queue,
                log_dir=worker_logs,
                name=fleet[0].name,
                slots=2,
            )
        )
        done = wait_job(client, job_id, ("succeeded",), fleet[1])
        checkpoints = sorted(c.step for c in client.jobs.checkpoints(job_id))

    killed = done.attempt
    assert killed == resumed.attempt + 1 and done.restarts_used == 1
    assert done.failure is not None and done.failure.failure_class == "node_lost", done.failure
    assert done.max_steps == max_steps  # declared by the program (`set_max_steps`)
    loss = metric_series(engine, job_id, "loss")
    assert [p.step for p in loss] == list(range(1, max_steps + 1)), "every step stored once"
    assert first_step(loss, resumed.attempt) == paused_at + 1
    assert first_step(loss, killed) == recorded + 1, "resumed from the latest recorded checkpoint"
    again = {p.step: p.value for p in loss if p.attempt == killed and p.step in before_kill}
    assert again, "the kill landed right at a checkpoint: nothing ran twice"
    assert again == pytest.approx({s: before_kill[s] for s in again}, rel=1e-4, abs=1e-6)
    started = [e for e in job_events(engine, job_id) if e.state_to == "running"]
    assert [e.data.get("start_step") for e in started][-2:] == [paused_at, recorded]
    assert checkpoints[-1] == max_steps and len(checkpoints) <= 2  # keep_last_checkpoints
    print(f"{example}: paused at {paused_at}, killed after checkpoint {recorded}")
