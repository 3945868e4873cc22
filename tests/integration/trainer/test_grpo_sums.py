"""Issue 48's toy verifiable task, through the real service: SDK -> uvicorn API -> Redis ->
Celery worker -> torchrun (2 ranks, DDP) -> Postgres -> REST.

The reinforcement fine-tuning example as `torchyard quickstart --example grpo` runs it: a small
Llama (from a config, locally trained ChatML BPE) is fine-tuned (`sums_sft.yaml`) on sums of two
numbers from a careless labeler (7 answers in 10 are one too many), then GRPO with LoRA
(`grpo.yaml`) starts from that checkpoint and is rewarded by a `string_check` of each prompt
record's true sum. The held-out questions (pairs never trained on) are answered greedily at
step 0, which is the SFT model's score, and every 10 steps: GRPO raises it well above.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from demos.sums import write_sums_data
from tests.conftest import make_project
from tests.integration.workers.helpers import Worker, start_worker, unique_queue
from tests.integration.workers.sdk_waits import example_spec, run_to_success
from torchyard.client import Client

JOB_TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(2 * JOB_TIMEOUT_S + 120)


@pytest.fixture
def sums_worker(
    settings: Settings, celery_client: Celery, tmp_path: Path
) -> Iterator[tuple[str, Worker]]:
    queue = unique_queue("sums")
    worker = start_worker(settings=settings, client=celery_client, queue=queue, log_dir=tmp_path)
    yield queue, worker
    worker.stop()


def test_grpo_with_lora_from_a_noisy_sft_raises_the_held_out_accuracy_of_sums(
    live_api: str,
    engine: Engine,
    sums_worker: tuple[str, Worker],
    models_root: Path,
    tmp_path: Path,
) -> None:
    from demos.offline_llama import build_model_dir

    queue, worker = sums_worker
    model_dir = build_model_dir(models_root / "sums-llama")
    data = write_sums_data(tmp_path / "sums")
    project = make_project(engine)
    with Client(live_api, project.api_key) as client:
        messages = client.datasets.upload("sums", data.messages)
        sft = run_to_success(
            client,
            example_spec("sums_sft", **_where(model_dir, messages.id, queue)),
            worker,
            JOB_TIMEOUT_S,
        )
        prompts = client.datasets.upload("sums-prompts", data.prompts)
        heldout = client.datasets.upload("sums-heldout", data.heldout)
        assert (prompts.format, heldout.format) == ("prompt", "prompt")
        spec = example_spec("grpo", **_where(model_dir, prompts.id, queue))
        spec["data"]["eval_dataset"] = heldout.id
        spec["model"]["init_from"] = {"job": sft.id}
        grpo = run_to_success(client, spec, worker, JOB_TIMEOUT_S)
        series = {
            s.name: dict(zip(s.steps, s.values, strict=True)) for s in client.jobs.metrics(grpo.id)
        }
        said = [e.message or "" for e in client.jobs.iter_events(grpo.id)]
    assert grpo.spec["lora"] is not None and grpo.spec["model"]["init_from"]["job"] == sft.id
    held, reward = series["eval_reward"], series["reward"]
    assert sorted(held) == [0, 10, 20, 30, 40]
    # step 0 is the SFT model's greedy accuracy on the 20 held-out questions (about 0.3: the
    # labeler's habit wins); GRPO takes it to about 0.7-0.85
    assert held[40] >= held[0] + 0.25, held
    assert series["reward/exact"] == reward, "one grader at weight 1: its reward is the reward"
    first, last = reward[min(reward)], reward[max(reward)]
    assert last > first, reward
    assert any("80 training and 20 evaluation prompts" in m for m in said), said


def _where(model_dir: Path, dataset_id: str, queue: str) -> dict[str, Any]:
    return {"model_dir": model_dir, "dataset_id": dataset_id, "pool": queue}
