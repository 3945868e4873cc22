"""GRPO through the real service (issue 48): SDK -> uvicorn API -> Redis -> Celery worker ->
torchrun (2 ranks, DDP) -> Postgres -> REST. A `prompt` dataset is uploaded (its format
detected from its records), a `method.kind: grpo` job with a team's `python` grader (run in
its own child process inside the job's sandbox) and a `string_check` logged at weight 0 trains
on it (`tests.support.grpo`), and its rewards, per grader and held out, are read back over
REST; its `eval_after: [reward]` eval jobs score its final and starting weights with its own
prompts and graders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import make_project
from tests.integration.workers.helpers import Worker, start_worker, unique_queue
from tests.support.grpo import grpo_job, write_prompts
from torchyard.client import Client

JOB_TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(JOB_TIMEOUT_S + 120)


@pytest.fixture
def grpo_worker(
    settings: Settings, celery_client: Celery, tmp_path: Path
) -> Iterator[tuple[str, Worker]]:
    queue = unique_queue("grpo")
    worker = start_worker(settings=settings, client=celery_client, queue=queue, log_dir=tmp_path)
    yield queue, worker
    worker.stop()


def test_a_grpo_job_on_an_uploaded_prompt_dataset_raises_its_graders_reward(
    live_api: str, engine: Engine, grpo_worker: tuple[str, Worker], tmp_path: Path
) -> None:
    queue, worker = grpo_worker
    project = make_project(engine)
    with Client(live_api, project.api_key) as client:
        dataset = client.datasets.upload("prompts", write_prompts(tmp_path / "prompts.jsonl"))
        assert dataset.format == "prompt"
        job = client.jobs.create(grpo_job(dataset="prompts", pool=queue))
        done = client.jobs.wait(job.id, poll_s=0.5, timeout_s=JOB_TIMEOUT_S)
        assert done.state == "succeeded", (done.error, worker.log[-4000:])
        series = {
            s.name: dict(zip(s.steps, s.values, strict=True)) for s in client.jobs.metrics(job.id)
        }
    reward, held = series["reward"], series["eval_reward"]
    assert sorted(reward) == [5, 10, 15, 20] and sorted(held) == [0, 10, 20]
    assert reward[20] > reward[5] + 0.3, reward
    assert held[20] > held[0] + 0.3, held
    assert series["reward/lower"] == reward, "the weight-0 grader adds nothing to the reward"
    assert set(series["reward/exact"].values()) == {0.0}
    assert {"frac_reward_zero_std", "completion_length", "entropy", "clip_ratio/region"} <= set(
        series
    )


def test_eval_after_reward_scores_a_grpo_jobs_final_and_starting_weights_with_its_graders(
    live_api: str, engine: Engine, grpo_worker: tuple[str, Worker], tmp_path: Path
) -> None:
    """`eval_after: {evaluations: [reward]}` takes every setting from the job: its own
    held-out prompts, graders and `max_new_tokens`, greedy. Its eval jobs (the final
    checkpoint's and the starting weights') report the reward and store each completion with
    its reward and per-grader scores."""
    queue, worker = grpo_worker
    spec = grpo_job(dataset="prompts", pool=queue, max_steps=4)
    spec["parallelism"] = {"strategy": "single"}
    spec["resources"]["procs_per_node"] = 1
    spec["eval"] = {"interval_steps": 4, "num_batches": 2}
    spec["checkpoint"] = {"interval_steps": 4}
    spec["eval_after"] = {"evaluations": ["reward"]}
    with Client(live_api, make_project(engine).api_key) as client:
        client.datasets.upload("prompts", write_prompts(tmp_path / "prompts.jsonl"))
        job = client.jobs.create(spec)
        done = client.jobs.wait(job.id, poll_s=0.5, timeout_s=JOB_TIMEOUT_S)
        assert done.state == "succeeded", (done.error, worker.log[-4000:])
        made = {
            j.labels["eval_at"]: j
            for j in client.jobs.list().items
            if j.labels.get("eval_of") == str(job.id)
        }
        assert set(made) == {"4", "initial"}
        for made_job in made.values():
            ended = client.jobs.wait(made_job.id, poll_s=0.5, timeout_s=JOB_TIMEOUT_S)
            assert ended.state == "succeeded", (ended.error, worker.log[-4000:])
        found = {e.step: e for e in client.jobs.evals(job.id)}
    assert sorted(found) == [0, 4]
    for result in found.values():
        assert result.kind == "reward" and result.dataset is None
        assert 0.0 <= result.metrics["reward"] <= 1.0
        assert result.metrics["reward/lower"] == pytest.approx(result.metrics["reward"])
        assert result.metrics["answers"] == len(result.samples) > 0
        for sample in result.samples:
            text = sample["completion"]
            lower = sum(c.islower() for c in text) / max(len(text), 1)
            assert sample["reward"] == pytest.approx(lower), sample  # `exact` weighs 0
            assert set(sample["scores"]) == {"lower", "exact"}
        rewards = [s["reward"] for s in result.samples]
        assert result.metrics["reward"] == pytest.approx(sum(rewards) / len(rewards))


# Graders a careless or curious team might write, each logged at weight 0 beside `lower`: one
# that reads a file of the worker's (1.0 when it can), one that never returns and one that
# raises, each on its first call only (its HOME outlives a restart of its process): once per
# rank, whatever the prompts drawn.
PEEK = """
def grade(sample, item):
    try:
        open({path!r}, "rb").read(1)
        return 1.0
    except OSError:
        return 0.0
"""
STUCK = """
import os
def grade(sample, item):
    marker = os.path.join(os.environ["HOME"], "hung-once")
    if not os.path.exists(marker):
        open(marker, "w").close()
        while True:
            pass
    return 1.0
"""
RAISES = """
import os
def grade(sample, item):
    marker = os.path.join(os.environ["HOME"], "raised-once")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise ValueError("the first sample is never right")
    return 1.0
"""


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_graders_code_runs_in_the_jobs_sandbox_and_its_faults_do_not_stop_the_job(
    live_api: str,
    engine: Engine,
    settings: Settings,
    celery_client: Celery,
    tmp_path: Path,
    sandbox: str,
) -> None:
    """In the sandbox a grader cannot read the worker's files (without it, the same grader
    does: the probe can fail); a grader that hangs is stopped at its `timeout_s`, one that
    raises scores 0, both counted, and the job trains on to success."""
    secret = settings.home / f"grader-secret-{sandbox}.txt"
    secret.write_text("the worker's own")
    queue = unique_queue(f"grpo-{sandbox}")
    worker = start_worker(
        settings=settings,
        client=celery_client,
        queue=queue,
        log_dir=tmp_path,
        extra_env={"TORCHYARD_SANDBOX": sandbox},
    )
    spec = grpo_job(dataset="prompts", pool=queue, max_steps=4)
    spec["train"]["log_interval_steps"] = 2
    spec["eval"]["interval_steps"] = 2
    spec["method"]["grpo"]["graders"] += [
        {"type": "python", "name": "peek", "weight": 0, "source": PEEK.format(path=str(secret))},
        {"type": "python", "name": "stuck", "weight": 0, "source": STUCK, "timeout_s": 0.5},
        {"type": "python", "name": "raises", "weight": 0, "source": RAISES},
    ]
    try:
        with Client(live_api, make_project(engine).api_key) as client:
            client.datasets.upload("prompts", write_prompts(tmp_path / "prompts.jsonl"))
            job = client.jobs.create(spec)
            done = client.jobs.wait(job.id, poll_s=0.5, timeout_s=JOB_TIMEOUT_S)
            assert done.state == "succeeded", (done.error, worker.log[-4000:])
            series = {s.name: s.values[-1] for s in client.jobs.metrics(job.id)}
    finally:
        worker.stop()
        secret.unlink()
    assert series["reward/peek"] == (0.0 if sandbox == "bwrap" else 1.0), series
    ranks = spec["resources"]["procs_per_node"]
    assert series["grader_timeouts/stuck"] == ranks and series["grader_errors/stuck"] == 0
    assert series["grader_errors/raises"] == ranks and series["grader_timeouts/raises"] == 0
