"""GRPO through the real service (issue 48): SDK -> uvicorn API -> Redis -> Celery worker ->
torchrun (2 ranks, DDP) -> Postgres -> REST. A `prompt` dataset is uploaded (its format
detected from its records), a `method.kind: grpo` job with a team's `python` grader (run in
its own child process inside the job's sandbox) and a `string_check` logged at weight 0 trains
on it, and its rewards, per grader and held out, are read back over REST."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import make_project
from tests.integration.workers.helpers import Worker, start_worker, unique_queue
from torchyard.client import Client

JOB_TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(JOB_TIMEOUT_S + 120)
LOWER = """
def grade(sample, item):
    text = sample["output_text"]
    return sum(c.islower() for c in text) / max(len(text), 1)
"""


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
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"] * 8
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": f"{w} {i}: ", "answer": w}) for i, w in enumerate(words)]
    path.write_text("\n".join(lines) + "\n")
    spec = {
        "name": "grpo-lower",
        "seed": 7,
        "data": {"dataset": "prompts"},
        "model": {"n_layers": 2, "n_heads": 4, "d_model": 64, "seq_len": 48},
        "method": {
            "kind": "grpo",
            "grpo": {
                "group_size": 8,
                "max_new_tokens": 8,
                "graders": [
                    {"type": "python", "name": "lower", "source": LOWER},
                    {
                        "type": "string_check",
                        "name": "exact",
                        "input": "{{ sample.output_text | trim }}",
                        "reference": "{{ item.answer }}",
                        "operation": "eq",
                        "weight": 0,
                    },
                ],
            },
        },
        "parallelism": {"strategy": "ddp"},
        "resources": {"procs_per_node": 2, "device": "cpu", "pool": queue},
        "optim": {"lr": 1e-2, "warmup_steps": 0, "schedule": "constant"},
        "train": {"micro_batch_size": 2, "max_steps": 20, "log_interval_steps": 5},
        "eval": {"interval_steps": 10, "num_batches": 2, "at_start": True},
        "checkpoint": {"interval_steps": 10},
    }
    with Client(live_api, project.api_key) as client:
        dataset = client.datasets.upload("prompts", path)
        assert dataset.format == "prompt"
        job = client.jobs.create(spec)
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
