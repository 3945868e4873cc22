"""Issue 48's toy verifiable task through the official `openai` client only: a supervised
fine-tune of a registered small Llama on a careless labeler's sums of two numbers (7 answers in
10 one too many, `demos.sums`), then reinforcement fine-tuning of that fine-tuned
model (`model: ft:...`, as OpenAI continues a fine-tune) with a team's `python` grader of the
true sum. The held-out questions' reward in the result file (`valid_reward_mean`) starts at the
SFT model's greedy accuracy and ends well above it.

The registry's entry trains every weight (`lora: null`): adapters on a randomly initialised
model learn the task too slowly for the suite (`grpo.yaml` shows GRPO with LoRA on the same
task, from a full SFT)."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import Engine

from core.platform.settings import Settings
from demos.sums import SumsData, write_sums_data
from tests.conftest import make_project, settings_env
from tests.integration.conftest import serve_api
from tests.integration.workers.helpers import Worker, own_worker, unique_queue

JOB_TIMEOUT_S = 300
pytestmark = pytest.mark.timeout(2 * JOB_TIMEOUT_S + 120)
BASE = "sums-llama"
EXACT = """
def grade(sample, item):
    return float(sample["output_text"].strip() == item["answer"])
"""


@pytest.fixture(scope="module")
def queue() -> str:
    return unique_queue("sums")


@pytest.fixture(scope="module")
def server(
    settings: Settings, models_root: Path, queue: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`/openai/v1` of an API whose registry offers `BASE`, fine-tuned in full on `queue`."""
    from demos.offline_llama import build_model_dir

    entry = {
        "path": str(build_model_dir(models_root / "sums-openai-llama")),
        "pool": queue,
        "lora": None,
        "seq_len": 32,
        "learning_rate": 0.003,
        "resources": {"procs_per_node": 1, "device": "cpu"},
        "spec": {
            "optim": {"warmup_steps": 0, "schedule": "constant", "weight_decay": 0.0},
            "train": {"log_interval_steps": 5, "precision": "fp32"},
            "eval": {"num_batches": 2},
            "checkpoint": {"interval_steps": 1000, "keep_last": 1},
            "sample": {"max_new_tokens": 0},
        },
        "grpo": {"max_new_tokens": 4, "temperature": 1.0},
    }
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps({BASE: entry})}
    with serve_api(env, tmp_path_factory.mktemp("openai_sums")) as base_url:
        yield f"{base_url}/openai/v1"


@pytest.fixture(scope="module")
def worker(
    settings: Settings, queue: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    with own_worker(
        settings, queue, tmp_path_factory.mktemp("sums"), app_name="torchyard-openai-sums"
    ) as started:
        yield started


def _wait(client: Any, job_id: str, worker: Worker) -> Any:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            assert job.status == "succeeded", (job.error, worker.log[-4000:])
            return job
        time.sleep(0.5)
    pytest.fail(f"{job_id} not done in {JOB_TIMEOUT_S}s: {worker.log[-4000:]}")


def _upload(client: Any, path: Path) -> Any:
    return client.files.create(file=(path.name, path.read_bytes()), purpose="fine-tune")


def test_reinforcement_after_supervised_raises_the_held_out_accuracy_of_sums(
    server: str, engine: Engine, worker: Worker, tmp_path: Path
) -> None:
    project = make_project(engine)
    client = openai.OpenAI(base_url=server, api_key=project.api_key, max_retries=0)
    data: SumsData = write_sums_data(tmp_path)
    # 720 training records after the held-out tenth, 16 a step: 45 steps an epoch
    sft = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=_upload(client, data.messages).id,
        suffix="sums-sft",
        seed=0,
        method={
            "type": "supervised",
            "supervised": {"hyperparameters": {"n_epochs": 6, "batch_size": 16}},
        },
    )
    model = _wait(client, sft.id, worker).fine_tuned_model
    assert model == f"ft:{BASE}:{project.project_id}:sums-sft:{sft.id[6:]}"
    assert model in {m.id for m in client.models.list()}
    other = openai.OpenAI(base_url=server, api_key=make_project(engine).api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        other.fine_tuning.jobs.create(model=model, training_file=_upload(other, data.prompts).id)
    assert refused.value.body["param"] == "model", "another project's model is not its to tune"

    grader = {"type": "python", "name": "exact", "source": EXACT}
    # 80 prompts, 8 a step: 10 steps an epoch, 40 in all; the 20 held-out ones every 10 steps
    hyper = {
        "n_epochs": 4,
        "batch_size": 8,
        "learning_rate_multiplier": 0.1,
        "eval_interval": 10,
        "eval_samples": 20,
    }
    rft = client.fine_tuning.jobs.create(
        model=model,
        training_file=_upload(client, data.prompts).id,
        validation_file=_upload(client, data.heldout).id,
        suffix="sums-rft",
        seed=0,
        method={
            "type": "reinforcement",
            "reinforcement": {"grader": grader, "hyperparameters": hyper},
        },
    )
    assert rft.model == model, "the job says which model it fine-tunes: the SFT's"
    done = _wait(client, rft.id, worker)
    assert done.fine_tuned_model == f"ft:{BASE}:{project.project_id}:sums-rft:{rft.id[6:]}"
    text = client.files.content(done.result_files[0]).text
    rows = list(csv.DictReader(io.StringIO(text)))
    held = {int(r["step"]): float(r["valid_reward_mean"]) for r in rows if r["valid_reward_mean"]}
    assert sorted(held) == [0, 10, 20, 30, 40], rows
    # step 0 is the SFT model's greedy accuracy on the 20 questions (0.2: the labeler's habit
    # wins); the last two evaluations were 0.45-0.6 each with seeds 0, 1 and 2
    assert (held[30] + held[40]) / 2 >= held[0] + 0.25, held
