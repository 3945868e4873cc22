"""A team's own program reads what its job declares (`entrypoint.inputs`, issue 43), inside the
bwrap sandbox, through a real API (with a base-model registry) and a real worker: the
`transformers.Trainer` example fine-tunes a registered base model on a dataset of the project,
read at `/inputs/model` and `/inputs/corpus`, is paused and resumed, survives a SIGKILL of its
worker by resuming from its own checkpoint, and trains exactly as the same program with those
files in its code archive; a later job reads an earlier job's checkpoint and continues from it,
read-only. The same over S3 storage and two hosts: tests/integration/hosts/test_host_inputs.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from core.platform.storage import job_checkpoint_uri
from tests.conftest import REPO_ROOT, ProjectKey, settings_env
from tests.integration.conftest import serve_api
from tests.integration.workers.helpers import (
    Worker,
    kill_tree,
    metric_series,
    start_worker,
    unique_queue,
)
from tests.integration.workers.sdk_waits import checkpoint_after, step_passed, wait_job
from torchyard import Client

EXAMPLE = REPO_ROOT / "examples" / "hf_trainer"
BASE = "tiny-llama"
MAX_STEPS, SAVE_STEPS = 120, 30
COMMAND = ["python", "train.py", "--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS)]
COMMAND += ["--max-bytes", "200000"]


@pytest.fixture(scope="module")
def model_dir(models_root: Path) -> Path:
    """A small Llama and its tokenizer, trained here on the standard library (no download)."""
    from demos.offline_llama import build_model_dir

    return build_model_dir(models_root / "inputs-tiny-llama", vocab_size=512)


@pytest.fixture(scope="module")
def api(
    settings: Settings, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The API whose base-model registry offers `BASE`."""
    registry = {BASE: {"path": str(model_dir)}}
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    with serve_api(env, tmp_path_factory.mktemp("inputs_api")) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def worker(settings: Settings, celery_client: Celery, worker_logs: Path) -> Iterator[list[Worker]]:
    """A sandboxing worker of two CPU slots (the threads pool: a restarted one answers its ping
    while it runs the requeued job); a list, so a test can put its restart beside it."""
    started = [
        start_worker(
            settings=settings,
            client=celery_client,
            queue=unique_queue("inputs"),
            log_dir=worker_logs,
            slots=2,
            extra_env={"TORCHYARD_SANDBOX": "bwrap"},
        )
    ]
    yield started
    for w in started:
        w.stop()


def _spec(code: str, pool: str, command: list[str], inputs: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    spec["entrypoint"] |= {"code": code, "command": command, "inputs": inputs}
    spec["resources"] |= {"procs_per_node": 1, "pool": pool}
    return spec


@pytest.mark.timeout(900)  # four SDK waits of up to 240 s; 163 s from upload to success when quiet
def test_the_hf_trainer_example_reads_its_inputs_and_resumes_after_a_killed_worker(
    api: str,
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    worker_logs: Path,
    worker: list[Worker],
    project: ProjectKey,
    corpus_dir: Path,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    pool = worker[0].queue
    with Client(api, project.api_key) as client:
        client.datasets.register("stdlib", str(corpus_dir))
        code = client.code.upload(EXAMPLE).id
        job_id = client.jobs.create(_spec(code, pool, COMMAND, _example_inputs())).id
        pinned = client.jobs.get(job_id).spec["entrypoint"]["inputs"]
        assert pinned["model"] == {"base_model": BASE, "uri": str(model_dir)}

        # Pause once a first checkpoint is recorded: the Trainer saves where it stops.
        checkpoint_after(client, job_id, 0)
        assert client.jobs.pause(job_id).state == "pausing"  # a running job checkpoints first
        paused = wait_job(client, job_id, ("paused",), worker[0])
        paused_at = max(c.step for c in client.jobs.checkpoints(job_id))
        assert paused_at == paused.current_step, "the stop saved the step it stopped at"
        assert client.jobs.resume(job_id).state == "queued"

        # SIGKILL the worker a third of an interval past the resumed run's next checkpoint.
        past = checkpoint_after(client, job_id, paused_at) + SAVE_STEPS // 3
        step_passed(client, job_id, past)
        kill_tree(worker[0], at_least=2)
        before_kill = {p.step: p.value for p in metric_series(engine, job_id, "loss")}
        recorded = max(c.step for c in client.jobs.checkpoints(job_id))
        assert recorded < MAX_STEPS, "the run ended before the kill: give it more steps"
        worker.append(
            start_worker(
                settings=settings, client=celery_client, queue=pool, log_dir=worker_logs,
                name=worker[0].name, slots=2, extra_env={"TORCHYARD_SANDBOX": "bwrap"},
            )
        )  # fmt: skip
        done = wait_job(client, job_id, ("succeeded",), worker[-1])

        # The same program with the model and the corpus in its code archive, named on its
        # command line: what the inputs held is what it trained on.
        bundled = tmp_path / "bundled"
        shutil.copytree(EXAMPLE, bundled)
        shutil.copytree(model_dir, bundled / "model")
        shutil.copytree(corpus_dir, bundled / "corpus")
        archive = client.code.upload(bundled).id
        command = [*COMMAND, "--model", "model", "--corpus", "corpus"]
        reference_id = client.jobs.create(_spec(archive, pool, command, {})).id
        reference = wait_job(client, reference_id, ("succeeded",), worker[-1])

    assert done.attempt == 3 and done.failure is not None
    assert done.failure.failure_class == "node_lost", done.failure
    loss = metric_series(engine, job_id, "loss")
    assert [p.step for p in loss] == list(range(1, MAX_STEPS + 1)), "every step stored once"
    assert min(p.step for p in loss if p.attempt == 2) == paused_at + 1
    assert min(p.step for p in loss if p.attempt == 3) == recorded + 1, "resumed from its own"
    again = {p.step: p.value for p in loss if p.attempt == 3 and p.step in before_kill}
    assert again, "the kill landed right at a checkpoint: nothing ran twice"
    assert again == pytest.approx({s: before_kill[s] for s in again}, rel=1e-4, abs=1e-6)
    expected = {p.step: p.value for p in metric_series(engine, reference_id, "loss")}
    assert reference.attempt == 1 and sorted(expected) == list(range(1, MAX_STEPS + 1))
    assert {p.step: p.value for p in loss} == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert expected[MAX_STEPS] < expected[1] - 0.5, "the example shows learning"


def _example_inputs() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    inputs: dict[str, Any] = spec["entrypoint"]["inputs"]
    assert inputs == {"model": {"base_model": BASE}, "corpus": {"dataset": "stdlib"}}
    return inputs


# Checkpoints a number every 5 steps; reports it as `value`.
WRITER_PY = """
import json
import torchyard.train as ty
for step in range(1, 11):
    ty.report(step, loss=1.0 / step, value=step * 3)
    if step % 5 == 0:
        path = ty.checkpoint_dir(step)
        (path / "state.json").write_text(json.dumps({"step": step, "value": step * 3}))
        ty.completed_checkpoint(path)
"""

# Continues from the checkpoint it declared as `start`, and tries to write into it.
CONTINUER_PY = """
import json
import torchyard.train as ty
start = ty.input_path("start")
state = json.loads((start / "state.json").read_text())
try:
    (start / "state.json").write_text("overwritten")
    wrote = 1.0
except OSError:
    wrote = 0.0
for step in range(state["step"] + 1, state["step"] + 4):
    ty.report(step, loss=1.0 / step, value=state["value"] + (step - state["step"]) * 3,
              wrote_input=wrote)
"""


def test_a_checkpoint_of_an_earlier_job_is_read_only_and_continued(
    api: str,
    engine: Engine,
    settings: Settings,
    worker: list[Worker],
    project: ProjectKey,
    tmp_path: Path,
) -> None:
    pool = worker[-1].queue
    (tmp_path / "writer").mkdir()
    (tmp_path / "writer" / "writer.py").write_text(WRITER_PY)
    (tmp_path / "continuer").mkdir()
    (tmp_path / "continuer" / "continuer.py").write_text(CONTINUER_PY)
    with Client(api, project.api_key) as client:
        code = client.code.upload(tmp_path / "writer").id
        spec = _spec(code, pool, ["python", "writer.py"], {})
        writer = client.jobs.create(spec).id
        wait_job(client, writer, ("succeeded",), worker[-1])
        latest = client.jobs.checkpoints(writer)[-1]
        code = client.code.upload(tmp_path / "continuer").id
        spec = _spec(code, pool, ["python", "continuer.py"], {"start": {"job": writer}})
        continuer = client.jobs.create(spec).id
        assert client.jobs.get(continuer).spec["entrypoint"]["inputs"]["start"] == {
            "job": writer,
            "checkpoint": latest.id,
        }
        wait_job(client, continuer, ("succeeded",), worker[-1])
    values = {p.step: p.value for p in metric_series(engine, continuer, "value")}
    assert values == {11: 33.0, 12: 36.0, 13: 39.0}
    assert {p.value for p in metric_series(engine, continuer, "wrote_input")} == {0.0}
    written = Path(job_checkpoint_uri(settings, writer).removeprefix("file://")) / "step_00000010"
    assert json.loads((written / "state.json").read_text())["value"] == 30, "left as written"


READS_PY = """
import sys
from pathlib import Path
print((Path(sys.argv[1]) / "config.json").read_text()[:100])
"""


def test_a_host_path_on_the_command_line_that_the_job_cannot_see_is_named_in_its_failure(
    api: str,
    engine: Engine,
    worker: list[Worker],
    project: ProjectKey,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    """The model directory exists on the worker host, but the sandbox shows only what the job
    declares: the program fails, and its failure (and an event at launch) says what to do."""
    pool = worker[-1].queue
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "reads.py").write_text(READS_PY)
    with Client(api, project.api_key) as client:
        code = client.code.upload(tmp_path / "code").id
        spec = _spec(code, pool, ["python", "reads.py", str(model_dir)], {})
        job_id = client.jobs.create(spec).id
        failed = wait_job(client, job_id, ("failed",), worker[-1])
        events = client.jobs.events(job_id).items
    hint = (
        f"`{model_dir}` is not visible to the job: declare it in `entrypoint.inputs` "
        "(it is then at /inputs/<name>)"
    )
    assert failed.failure is not None and failed.failure.failure_class == "user_error"
    assert "FileNotFoundError" in failed.failure.reason, failed.failure
    assert failed.failure.hints == [hint]
    assert [e.message for e in events if e.kind == "warning"] == [hint]
