"""Issue 16: the official `openai` client, unchanged, drives Torchyard's `/openai/v1`.

A real API (uvicorn, with a registered base model: a Llama from a config and a locally trained
BPE under an allowed root) and a real worker; files are uploaded, a LoRA SFT and a DPO job
train to completion (their result file matches the stored metrics, `trained_tokens` the run's
data report), a reinforcement (GRPO) job on OpenAI's RFT records raises its python grader's
reward, a running job is paused at a checkpoint and resumed to completion, a job on a pool no
worker serves is paused, resumed and cancelled, files and jobs are paged.
Bodies are parsed by the client's own pydantic types.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import Engine

from core.platform.settings import Settings
from demos.docstrings import ExampleData, write_example_data
from tests.conftest import ProjectKey, make_project, settings_env
from tests.integration.conftest import serve_api
from tests.integration.workers.helpers import Worker, own_worker, unique_queue
from torchyard.client import Client

JOB_TIMEOUT_S = 400
BASE = "tiny-llama"
PARKED = "parked-llama"  # its pool has no worker: its jobs stay queued until paused/cancelled


@pytest.fixture(scope="module")
def queue() -> str:
    return unique_queue("openai")


@pytest.fixture(scope="module")
def model_dir(models_root: Path) -> Path:
    from demos.offline_llama import build_model_dir

    return build_model_dir(models_root / "openai-llama")


@pytest.fixture(scope="module")
def server(
    settings: Settings, model_dir: Path, queue: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`/openai/v1` of an API whose registry offers `BASE` (on `queue`) and `PARKED`."""
    small = {
        "lora": {"r": 4, "alpha": 8, "modules_to_save": ["lm_head"]},
        "seq_len": 384,
        "learning_rate": 0.01,
        "n_epochs": 1,
        "batch_size": 4,
        "resources": {"procs_per_node": 1, "device": "cpu"},
        "spec": {
            "optim": {"warmup_steps": 1, "weight_decay": 0.0},
            "train": {"log_interval_steps": 2},
            "eval": {"interval_steps": 1000, "num_batches": 1},
            "checkpoint": {"interval_steps": 1000, "keep_last": 1},
            "sample": {"max_new_tokens": 0},
        },
        # short completions: a reinforcement step samples group_size of them per prompt
        "grpo": {"max_new_tokens": 8},
    }
    registry = {
        BASE: {**small, "path": str(model_dir), "pool": queue},
        PARKED: {**small, "path": str(model_dir), "pool": unique_queue("parked")},
    }
    env = {**settings_env(settings), "TORCHYARD_BASE_MODELS": json.dumps(registry)}
    with serve_api(env, tmp_path_factory.mktemp("openai_api")) as base_url:
        yield f"{base_url}/openai/v1"


@pytest.fixture(scope="module")
def worker(
    settings: Settings, queue: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    with own_worker(
        settings, queue, tmp_path_factory.mktemp("oai"), app_name="torchyard-openai"
    ) as started:
        yield started


@pytest.fixture(scope="module")
def project(engine: Engine) -> ProjectKey:
    return make_project(engine)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ExampleData:
    return write_example_data(
        tmp_path_factory.mktemp("oai_data"), limit=24, preference_functions=16
    )


def _client(server: str, key: str) -> Any:
    return openai.OpenAI(base_url=server, api_key=key, max_retries=0)


def _wait(client: Any, job_id: str, worker: Worker) -> Any:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        job = client.fine_tuning.jobs.retrieve(job_id)
        if job.status in ("succeeded", "failed", "cancelled"):
            assert job.status == "succeeded", (job.error, worker.log[-4000:])
            return job
        time.sleep(0.5)
    pytest.fail(f"{job_id} not done in {JOB_TIMEOUT_S}s: {worker.log[-4000:]}")


def _native(server: str, project: ProjectKey, path: str) -> Any:
    url = server.replace("/openai/v1", path)
    answer = httpx.get(url, headers={"Authorization": f"Bearer {project.api_key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _check_result_file(client: Any, server: str, project: ProjectKey, done: Any) -> None:
    """The result file is the job's stored `loss` / `eval_loss` points as OpenAI's CSV."""
    assert done.result_files == [f"file-result-{done.id[6:]}"]
    meta = client.files.retrieve(done.result_files[0])
    assert meta.purpose == "fine-tune-results" and meta.id == done.result_files[0]
    text = client.files.content(done.result_files[0]).text
    assert meta.bytes == len(text.encode())
    reader = csv.DictReader(io.StringIO(text))
    assert reader.fieldnames == [
        "step", "train_loss", "train_accuracy", "valid_loss", "valid_mean_token_accuracy"
    ]  # fmt: skip
    rows = {int(r["step"]): r for r in reader}
    metrics = _native(server, project, f"/v1/jobs/{done.id[6:]}/metrics?names=loss,eval_loss")
    stored = {s["name"]: dict(zip(s["steps"], s["values"], strict=True)) for s in metrics["series"]}
    assert stored.get("loss"), metrics
    assert sorted(rows) == sorted(set(stored["loss"]) | set(stored.get("eval_loss", {})))
    for ours, theirs in (("loss", "train_loss"), ("eval_loss", "valid_loss")):
        for step, row in rows.items():
            want = stored.get(ours, {}).get(step)
            assert (float(row[theirs]) if row[theirs] else None) == want, (step, row, want)
    assert all(r["train_accuracy"] == r["valid_mean_token_accuracy"] == "" for r in rows.values())
    with pytest.raises(openai.ConflictError):
        client.files.delete(done.result_files[0])
    with pytest.raises(openai.NotFoundError):
        client.files.content(f"file-result-{done.id[6:]}0")


def _check_trained_tokens(server: str, project: ProjectKey, done: Any) -> None:
    """`trained_tokens` = the training split's tokens (the run's `data` report) x epochs."""
    events = _native(server, project, f"/v1/jobs/{done.id[6:]}/events?limit=1000")["items"]
    reports = [e["data"]["train"] for e in events if "train" in (e["data"] or {})]
    assert reports, events
    assert done.trained_tokens == reports[-1]["tokens"] * done.hyperparameters.n_epochs


def _full_valid_loss(server: str, project: ProjectKey, job_id: str, worker: Worker) -> float:
    """The loss the fine-tune's `eval_after` eval job found on the validation file, once it
    succeeded (it is queued when the fine-tune succeeds)."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        found = _native(server, project, f"/v1/jobs/{job_id}/evals")["items"]
        if found:
            (full,) = found
            assert full["name"] == "full_valid" and full["checkpoint_id"] is not None
            return float(full["metrics"]["loss"])
        time.sleep(0.5)
    pytest.fail(f"no eval of job {job_id} in {JOB_TIMEOUT_S}s: {worker.log[-4000:]}")


def _has_fields(obj: Any, *names: str) -> None:
    dumped = obj.model_dump()
    missing = [n for n in names if n not in dumped]
    assert not missing, (missing, dumped)


def test_files_roundtrip_and_errors_in_openai_shape(
    server: str, project: ProjectKey, data: ExampleData
) -> None:
    client = _client(server, project.api_key)
    created = client.files.create(file=data.messages.open("rb"), purpose="fine-tune")
    assert isinstance(created, openai.types.FileObject)
    _has_fields(created, "id", "bytes", "created_at", "filename", "object", "purpose")
    assert created.bytes == data.messages.stat().st_size and created.purpose == "fine-tune"
    assert client.files.retrieve(created.id).id == created.id
    assert created.id in [f.id for f in client.files.list()]
    assert client.files.content(created.id).content == data.messages.read_bytes()
    deleted = client.files.delete(created.id)
    assert deleted.deleted and deleted.id == created.id
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.retrieve(created.id)
    assert set(missing.value.body) >= {"message", "type", "param", "code"}

    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("bad.jsonl", b'{"messages": 3}\n'), purpose="fine-tune")
    body = bad.value.body
    assert body["type"] == "invalid_request_error", body
    assert body["param"] == "file.line.1.messages" and "line 1" in body["message"], body
    with pytest.raises(openai.BadRequestError) as unknown:
        client.fine_tuning.jobs.create(model="no-such-model", training_file="ds_x")
    assert unknown.value.body["param"] == "model"


def test_invalid_requests_raise_bad_request_naming_the_param(
    server: str, project: ProjectKey, data: ExampleData
) -> None:
    """Every refused input is OpenAI's 400 `invalid_request_error` (`openai.BadRequestError`,
    never the 422 of `/v1`), whether the request model, a parameter or a reference refuses it,
    and `param` names the field."""
    client = _client(server, project.api_key)
    training = client.files.create(file=data.messages.open("rb"), purpose="fine-tune")
    refused = {
        "hyperparameters.n_epochs": lambda: client.fine_tuning.jobs.create(
            model=BASE, training_file=training.id, hyperparameters={"n_epochs": 0}
        ),
        "method.type": lambda: client.fine_tuning.jobs.create(
            model=BASE, training_file=training.id, method={"type": "unsupervised"}
        ),
        "suffix": lambda: client.fine_tuning.jobs.create(
            model=BASE, training_file=training.id, suffix="no spaces"
        ),
        "limit": lambda: client.fine_tuning.jobs.list(limit=0),
        "order": lambda: client.files.list(order="sideways"),
        "model": lambda: client.fine_tuning.jobs.create(model="nope", training_file=training.id),
        "purpose": lambda: client.files.create(file=data.messages.open("rb"), purpose="batch"),
    }
    for param, call in refused.items():
        with pytest.raises(openai.BadRequestError) as bad:
            call()
        assert bad.value.status_code == 400, param
        body = bad.value.body
        assert body["type"] == "invalid_request_error" and body["param"] == param, body
        assert body["message"], body


def test_models_list_the_registry(server: str, project: ProjectKey) -> None:
    client = _client(server, project.api_key)
    ids = [m.id for m in client.models.list()]
    assert BASE in ids and PARKED in ids
    model = client.models.retrieve(BASE)
    assert isinstance(model, openai.types.Model) and model.owned_by == "torchyard"
    _has_fields(model, "id", "created", "object", "owned_by")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("ft:tiny-llama:nobody::1")
    with pytest.raises(openai.AuthenticationError) as anonymous:
        _client(server, "ty_not_a_key").models.list()
    assert anonymous.value.body["type"] == "authentication_error", anonymous.value.body


def test_supervised_fine_tune_trains_to_completion(
    server: str, project: ProjectKey, data: ExampleData, worker: Worker, engine: Engine
) -> None:
    client = _client(server, project.api_key)
    training = client.files.create(file=data.messages.open("rb"), purpose="fine-tune")
    validation = client.files.create(file=data.messages.open("rb"), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=training.id,
        validation_file=validation.id,
        suffix="docs",
        seed=7,
        metadata={"team": "ml"},
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": "auto"}}},
    )
    assert isinstance(job, openai.types.fine_tuning.FineTuningJob)
    assert job.id.startswith("ftjob-") and job.status == "queued" and job.seed == 7
    assert job.hyperparameters.n_epochs == 1 and job.hyperparameters.batch_size == 4
    assert job.metadata == {"team": "ml"} and job.method.type == "supervised"
    done = _wait(client, job.id, worker)
    _has_fields(done, "fine_tuned_model", "trained_tokens", "finished_at", "result_files", "error")
    assert done.fine_tuned_model == f"ft:{BASE}:{project.project_id}:docs:{job.id[6:]}"
    assert done.trained_tokens and done.trained_tokens > 0 and done.error is None
    assert client.models.retrieve(done.fine_tuned_model).id == done.fine_tuned_model
    assert done.fine_tuned_model in [m.id for m in client.models.list()]
    assert job.id in [j.id for j in client.fine_tuning.jobs.list(limit=5)]

    events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
    assert events and all(e.object == "fine_tuning.job.event" for e in events)
    assert any("succeeded" in e.message for e in events), [e.message for e in events]
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    assert checkpoints, "no checkpoint"
    assert checkpoints[0].fine_tuned_model_checkpoint.startswith(done.fine_tuned_model)
    assert checkpoints[0].step_number > 0 and checkpoints[0].fine_tuning_job_id == job.id
    # the final checkpoint's full_valid_loss: its eval job's loss on the whole validation file
    full = _full_valid_loss(server, project, job.id[6:], worker)
    final = client.fine_tuning.jobs.checkpoints.list(job.id).data[0]
    assert final.metrics.full_valid_loss == pytest.approx(full)

    # The same job in Torchyard's own view.
    native = _native(server, project, f"/v1/jobs/{job.id[6:]}")
    assert native["state"] == "succeeded" and native["spec"]["lora"]["r"] == 4
    _check_result_file(client, server, project, done)
    _check_trained_tokens(server, project, done)

    other = _client(server, make_project(engine).api_key)
    with pytest.raises(openai.NotFoundError) as hidden:
        other.fine_tuning.jobs.retrieve(job.id)
    assert hidden.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        other.models.retrieve(done.fine_tuned_model)


# Four passes over the 16 pairs at a fifth of the registry's lr: the policy sees each pair
# again, so its loss on them falls below the reference's ln 2 whatever the batches' order.
DPO_HYPERPARAMETERS = {"beta": 0.2, "batch_size": 4, "n_epochs": 4, "learning_rate_multiplier": 0.2}


def test_dpo_fine_tune_trains_to_completion(
    server: str, project: ProjectKey, data: ExampleData, worker: Worker
) -> None:
    client = _client(server, project.api_key)
    pairs = client.files.create(file=data.preference.open("rb"), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=pairs.id,
        method={"type": "dpo", "dpo": {"hyperparameters": DPO_HYPERPARAMETERS}},
    )
    assert job.method.type == "dpo" and job.method.dpo.hyperparameters.beta == 0.2
    done = _wait(client, job.id, worker)
    assert done.fine_tuned_model and done.fine_tuned_model.endswith(f"::{job.id[6:]}")
    # It trained DPO: the untrained policy is the reference (LoRA's B starts at zero), where
    # every pair's loss is -log sigmoid(0) = ln 2 and no reward is ahead; by its last logged
    # step (the fourth pass over the pairs) the loss is below that and the chosen answers'
    # rewards lead (margin, accuracy). One pass of two steps at the registry's lr proved
    # nothing: the second batch's pairs are others than the first's, and its loss went either
    # way (1.07 in one CI run, below ln 2 in the next).
    names = "loss,rewards/accuracy,rewards/margin"
    metrics = _native(server, project, f"/v1/jobs/{done.id[6:]}/metrics?names={names}")
    series = {s["name"]: dict(zip(s["steps"], s["values"], strict=True)) for s in metrics["series"]}
    loss, accuracy = series["loss"], series["rewards/accuracy"]
    last = max(loss)
    assert loss[last] < math.log(2) - 0.01, loss
    assert series["rewards/margin"][last] > 0 and 0.0 < accuracy[last] <= 1.0, series
    assert sorted(accuracy) == sorted(loss)  # reported at every logged step
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    assert checkpoints and max(c.step_number for c in checkpoints) >= max(loss), checkpoints


# The reward of tests/integration/trainer/test_grpo_job.py: the share of lower-case letters in
# a completion, which a random tiny model learns to raise within a few dozen steps.
LOWER = """
def grade(sample, item):
    text = sample["output_text"]
    return sum(c.islower() for c in text) / max(len(text), 1)
"""
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]


def _rft_records(count: int, start: int = 0) -> bytes:
    """OpenAI's reinforcement fine-tuning JSONL: a user turn to answer, and a reference field."""
    lines = [
        json.dumps(
            {
                "messages": [{"role": "user", "content": f"{WORDS[i % 8]} {i}: "}],
                "reference_answer": WORDS[i % 8],
            }
        )
        for i in range(start, start + count)
    ]
    return ("\n".join(lines) + "\n").encode()


def test_reinforcement_fine_tune_raises_its_python_graders_reward(
    server: str, project: ProjectKey, worker: Worker
) -> None:
    """`method.type: reinforcement` is a GRPO job: the grader and hyperparameters map onto its
    spec, it trains to completion on RFT-shaped files, and its result file is OpenAI's reward
    columns, the stored `reward` / `eval_reward` points, with the train reward rising."""
    client = _client(server, project.api_key)
    training = client.files.create(file=("rft.jsonl", _rft_records(80)), purpose="fine-tune")
    validation = client.files.create(
        file=("rft_valid.jsonl", _rft_records(8, start=80)), purpose="fine-tune"
    )
    for file in (training, validation):
        assert _native(server, project, f"/v1/datasets/{file.id}")["format"] == "prompt"
    grader = {"type": "python", "name": "lower", "source": LOWER, "image_tag": "2025-05-08"}
    hyper = {"n_epochs": 2, "batch_size": 4, "eval_interval": 10, "eval_samples": 8}
    settings = {"grader": grader, "hyperparameters": hyper}
    method = {"type": "reinforcement", "reinforcement": settings}
    job = client.fine_tuning.jobs.create(
        model=BASE,
        training_file=training.id,
        validation_file=validation.id,
        suffix="lower",
        seed=7,
        method=method,
    )
    assert job.method.type == "reinforcement" and job.method.supervised is None
    shown = job.method.reinforcement
    assert shown.grader.type == "python" and shown.grader.source == LOWER
    assert shown.grader.image_tag is None  # accepted, not kept: it names no image here
    assert shown.hyperparameters.model_dump() == {
        "n_epochs": 2,
        "batch_size": 4,
        "learning_rate_multiplier": 1.0,
        "compute_multiplier": 1.0,
        "eval_interval": 10,
        "eval_samples": 8,
        "reasoning_effort": "default",
    }
    assert job.hyperparameters.model_dump(exclude_none=True) == {
        "n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 1.0
    }  # fmt: skip
    spec = _native(server, project, f"/v1/jobs/{job.id[6:]}")["spec"]
    grpo = spec["method"]["grpo"]
    assert spec["method"]["kind"] == "grpo" and grpo["group_size"] == 8
    assert [g["name"] for g in grpo["graders"]] == ["lower"] and grpo["max_new_tokens"] == 8
    assert spec["eval"]["interval_steps"] == 10 and spec["eval"]["num_batches"] == 2
    assert spec["train"]["micro_batch_size"] == 4 and spec["train"]["epochs"] == 2
    assert spec["data"]["eval_dataset"] == validation.id and spec.get("eval_after") is None

    done = _wait(client, job.id, worker)
    assert done.fine_tuned_model == f"ft:{BASE}:{project.project_id}:lower:{job.id[6:]}"
    assert done.method.type == "reinforcement" and done.result_files
    text = client.files.content(done.result_files[0]).text
    reader = csv.DictReader(io.StringIO(text))
    assert reader.fieldnames == ["step", "train_reward_mean", "valid_reward_mean"]
    rows = {int(r["step"]): r for r in reader}
    metrics = _native(server, project, f"/v1/jobs/{job.id[6:]}/metrics?names=reward,eval_reward")
    stored = {s["name"]: dict(zip(s["steps"], s["values"], strict=True)) for s in metrics["series"]}
    for ours, theirs in (("reward", "train_reward_mean"), ("eval_reward", "valid_reward_mean")):
        column = {step: float(r[theirs]) for step, r in rows.items() if r[theirs]}
        assert column == stored[ours], (ours, column, stored)
    train = [float(rows[step]["train_reward_mean"]) for step in sorted(stored["reward"])]
    # 2 epochs of 80 prompts, 4 per step: 40 steps, logged every 2, evaluated every 10
    assert len(train) == 20 and sorted(stored["eval_reward"]) == [10, 20, 30, 40], rows
    # The grader's reward rises: the last three logged steps against the first three (0.68 ->
    # 0.98 with seed 7). Under 20 steps it rose by 0.15 only: the random model's completions
    # are already two-thirds lower-case letters.
    assert sum(train[-3:]) / 3 > sum(train[:3]) / 3 + 0.2, train


def test_reinforcement_requests_that_cannot_run_are_400_naming_the_param(
    server: str, project: ProjectKey, data: ExampleData, tmp_path: Path
) -> None:
    """A grader that cannot run, an unsupported or unknown hyperparameter and a file with no
    prompts are each OpenAI's 400 with `param` the field's path (no type tag in it)."""
    client = _client(server, project.api_key)
    prompts = client.files.create(file=("p.jsonl", _rft_records(8)), purpose="fine-tune")
    pairs = client.files.create(file=data.preference.open("rb"), purpose="fine-tune")
    plain_path = tmp_path / "plain.jsonl"
    plain_path.write_text(json.dumps({"text": "plain text, nothing to prompt with"}) + "\n")
    with Client(server.removesuffix("/openai/v1"), project.api_key) as native:
        plain = native.datasets.upload("plain-text", plain_path)
    assert plain.format == "jsonl_text"
    lower = {"type": "python", "name": "lower", "source": LOWER}

    def create(grader: Any = lower, file: str = prompts.id, **more: Any) -> Any:
        settings = {"grader": grader, **more.pop("settings", {})}
        return client.fine_tuning.jobs.create(
            model=BASE,
            training_file=file,
            method={"type": "reinforcement", "reinforcement": settings},
            **more,
        )

    score_model = {"type": "score_model", "name": "judge", "model": "gpt-4o", "input": []}
    exact = {"type": "string_check", "name": "exact", "input": "x", "reference": "x"}
    refused: dict[str, tuple[Callable[[], Any], str]] = {
        "method.reinforcement.grader": (lambda: create(score_model), "grader model"),
        "method.reinforcement.hyperparameters.reasoning_effort": (
            lambda: create(settings={"hyperparameters": {"reasoning_effort": "high"}}),
            "do not reason",
        ),
        "method.reinforcement.hyperparameters.n_samples": (
            lambda: create(settings={"hyperparameters": {"n_samples": 4}}),
            "Extra inputs",
        ),
        "training_file": (lambda: create(file=plain.id), "jsonl_text"),
        "validation_file": (lambda: create(validation_file=pairs.id), "preference"),
        "method.reinforcement.grader.pass_threshold": (
            lambda: create({**exact, "operation": "eq", "pass_threshold": 0.5}),
            "Extra inputs",
        ),
        "method.reinforcement.grader.operation": (lambda: create(exact), "Field required"),
        "method.reinforcement.grader.image_tag": (
            lambda: create({**lower, "image_tag": 3}),
            "valid string",
        ),
        "method.reinforcement": (
            lambda: client.fine_tuning.jobs.create(
                model=BASE, training_file=prompts.id, method={"type": "reinforcement"}
            ),
            "grader",
        ),
        "hyperparameters": (
            lambda: create(hyperparameters={"n_epochs": 1}),
            "method.reinforcement.hyperparameters",
        ),
    }
    for param, (call, words) in refused.items():
        with pytest.raises(openai.BadRequestError) as bad:
            call()
        body = bad.value.body
        assert body["type"] == "invalid_request_error" and body["param"] == param, body
        assert words in body["message"], (param, body)
    with pytest.raises(openai.BadRequestError) as wrong_file:
        create(file=pairs.id)
    assert wrong_file.value.body["param"] == "training_file"


def test_pause_resume_cancel_a_queued_job(
    server: str, project: ProjectKey, data: ExampleData
) -> None:
    client = _client(server, project.api_key)
    training = client.files.create(file=data.messages.open("rb"), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=PARKED, training_file=training.id, hyperparameters={"batch_size": 2}
    )
    assert job.status == "queued" and job.hyperparameters.batch_size == 2
    assert client.fine_tuning.jobs.pause(job.id).status == "paused"
    assert client.fine_tuning.jobs.resume(job.id).status == "queued"
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled"
    with pytest.raises(openai.ConflictError) as again:
        client.fine_tuning.jobs.cancel(job.id)
    assert again.value.body["code"] == "conflict"
    with pytest.raises(openai.BadRequestError) as wrong:
        client.fine_tuning.jobs.create(
            model=PARKED, training_file=training.id, method={"type": "dpo"}
        )
    assert wrong.value.body["param"] == "training_file"


def test_pause_and_resume_a_running_fine_tune(
    server: str, project: ProjectKey, data: ExampleData, worker: Worker
) -> None:
    client = _client(server, project.api_key)
    training = client.files.create(file=data.messages.open("rb"), purpose="fine-tune")
    job = client.fine_tuning.jobs.create(
        model=BASE, training_file=training.id, hyperparameters={"n_epochs": 8}
    )
    native_path = f"/v1/jobs/{job.id[6:]}"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while (_native(server, project, native_path)["current_step"] or 0) < 1:
        assert time.monotonic() < deadline, worker.log[-4000:]
        time.sleep(0.2)
    assert client.fine_tuning.jobs.pause(job.id).status == "running"  # pausing: checkpointing
    while (paused := client.fine_tuning.jobs.retrieve(job.id)).status != "paused":
        assert paused.status == "running" and time.monotonic() < deadline, worker.log[-4000:]
        time.sleep(0.3)
    checkpoints = list(client.fine_tuning.jobs.checkpoints.list(job.id))
    assert checkpoints, "paused without a checkpoint"
    step = checkpoints[0].step_number
    assert step > 0
    assert paused.result_files == [] and paused.trained_tokens is None

    resumed = client.fine_tuning.jobs.resume(job.id)
    assert resumed.status in ("queued", "running")
    done = _wait(client, job.id, worker)
    assert done.fine_tuned_model and done.trained_tokens
    events = _native(server, project, f"{native_path}/events?limit=1000")["items"]
    starts = [e["data"]["start_step"] for e in events if "start_step" in (e["data"] or {})]
    assert starts[0] == 0 and step in starts[1:], starts
    assert _native(server, project, native_path)["current_step"] > step  # it went on from there


def test_files_and_jobs_page_as_openai_pages_them(
    server: str, engine: Engine, data: ExampleData
) -> None:
    fresh = make_project(engine)
    client = _client(server, fresh.api_key)
    ids = [
        client.files.create(
            file=(f"f{i}.jsonl", data.messages.read_bytes()), purpose="fine-tune"
        ).id
        for i in range(3)
    ]
    assert [f.id for f in client.files.list()] == ids[::-1]  # newest first
    first = client.files.list(limit=2, order="asc")
    assert [f.id for f in first.data] == ids[:2] and first.has_more
    assert [f.id for f in client.files.list(limit=2, order="asc", after=ids[1]).data] == ids[2:]
    assert [f.id for f in client.files.list(limit=1, after=ids[2])] == ids[1::-1]  # auto-pages
    assert client.files.list(purpose="fine-tune-results").data == []
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.list(after="ds_nope")
    assert bad.value.body["param"] == "after"

    made = [
        client.fine_tuning.jobs.create(
            model=PARKED, training_file=ids[0], metadata={"run": str(i % 2)}
        ).id
        for i in range(3)
    ]
    assert [j.id for j in client.fine_tuning.jobs.list(limit=2)] == made[::-1]
    page = client.fine_tuning.jobs.list(limit=1, after=made[2])
    assert [j.id for j in page.data] == [made[1]] and page.has_more
    evens = client.fine_tuning.jobs.list(metadata={"run": "0"})
    assert [j.id for j in evens.data] == [made[2], made[0]]
    for job_id in made:
        client.fine_tuning.jobs.cancel(job_id)
