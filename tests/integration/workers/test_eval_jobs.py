"""Eval jobs through the service: the API (in this process), a real Celery worker, torchrun and
`trainer.evaluate`, Postgres and Redis. A small GPT trains; an eval job scores its checkpoint
(perplexity on its own evaluation split, answers to a prompt/completion dataset), and the
results are readable from both jobs, as results and as the eval job's metrics. Bad eval
specs, and `reward` evaluations a source cannot serve, are refused with the field's path and
lose nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from api.main import create_app
from core.platform.settings import Settings
from core.platform.tables import Checkpoint
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, submit
from tests.integration.workers.helpers import (
    Worker,
    job_row,
    metric_series,
    tiny_spec,
    wait_state,
)

RUN_S = 180.0
TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def client(settings: Settings) -> Any:
    with TestClient(create_app(settings), raise_server_exceptions=True) as test_client:
        yield test_client


def _qa_dataset(client: TestClient, project: ProjectKey) -> str:
    """A prompt/completion dataset of `project`, uploaded as a user does."""
    records = [{"prompt": f"def f{i}(", "completion": f"x{i}): return x{i}"} for i in range(4)]
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": "qa"},
        files={"file": ("qa.jsonl", body)},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _eval_spec(source: int, pool: str, *evaluations: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "eval",
        "evaluate": {"source": {"job": source}, "evaluations": list(evaluations)},
        "resources": {"pool": pool},
    }


def test_an_eval_job_scores_a_trained_checkpoint_and_both_jobs_show_the_results(
    client: TestClient,
    engine: Engine,
    session: Session,
    settings: Settings,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset_id: str,
    worker: Worker,
    tmp_path: Path,
) -> None:
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": 12},
        eval={"interval_steps": 12, "num_batches": 2},
        checkpoint={"interval_steps": 12},
    ).model_dump(mode="json")
    trained = submit(client, project, spec)
    done = wait_state(engine, trained["id"], TERMINAL, RUN_S, worker)
    assert done.state == "succeeded", done.error
    (eval_loss,) = [
        p.value for p in metric_series(engine, trained["id"], "eval_loss") if p.step == 12
    ]

    qa = _qa_dataset(client, project)
    evaluation = submit(
        client,
        project,
        _eval_spec(
            trained["id"],
            worker.queue,
            {"kind": "perplexity"},
            {
                "kind": "generate",
                "name": "qa",
                "dataset": qa,
                "max_prompts": 2,
                "max_new_tokens": 6,
            },
        ),
    )
    pinned = evaluation["spec"]["evaluate"]["source"]
    assert pinned["job"] == trained["id"] and pinned["checkpoint"] is not None
    ended = wait_state(engine, evaluation["id"], TERMINAL, RUN_S, worker)
    assert ended.state == "succeeded", ended.error

    for job_id in (trained["id"], evaluation["id"]):
        answer = client.get(f"/v1/jobs/{job_id}/evals", headers=project.headers)
        assert answer.status_code == 200, answer.text
        items = {e["name"]: e for e in answer.json()["items"]}
        assert set(items) == {"perplexity", "qa"}
        own = items["perplexity"]
        assert (own["job_id"], own["source_job_id"], own["step"]) == (
            evaluation["id"],
            trained["id"],
            12,
        )
        assert own["metrics"]["loss"] == pytest.approx(eval_loss, rel=1e-5)
        qa_result = items["qa"]
        assert qa_result["dataset"] == qa and len(qa_result["samples"]) == 2
        assert [s["reference"] for s in qa_result["samples"]] == [
            "x0): return x0",
            "x1): return x1",
        ]
    latest = job_row(engine, evaluation["id"]).latest_metrics or {}
    assert latest["perplexity.loss"] == pytest.approx(eval_loss, rel=1e-5)
    assert {"qa.chrf", "qa.rouge_l", "qa.exact_match"} <= set(latest)
    hidden = client.get(f"/v1/jobs/{evaluation['id']}/evals", headers=other_project.headers)
    assert_error(hidden, 404, "not_found")


def test_eval_after_scores_periodic_and_final_checkpoints_and_the_starting_weights(
    client: TestClient,
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
    worker: Worker,
) -> None:
    """`eval_after` makes one eval job per scored checkpoint (every checkpoint here: steps 6
    and 12, the final one once); each perplexity equals the trainer's own eval_loss at that
    step. (The starting weights' eval job, `baseline`, is tests/e2e/test_evals.py's: this host
    runs the suite 4 tests at a time, and each eval job is a torchrun of its own.)"""
    spec = tiny_spec(
        pool=worker.queue,
        dataset_id=dataset_id,
        train={"max_steps": 12},
        eval={"interval_steps": 6, "num_batches": 2},
        checkpoint={"interval_steps": 6},
    ).model_dump(mode="json", exclude_none=True)
    spec["eval_after"] = {"evaluations": ["perplexity"], "every_checkpoints": 1, "baseline": False}
    trained = submit(client, project, spec)
    done = wait_state(engine, trained["id"], TERMINAL, RUN_S, worker)
    assert done.state == "succeeded", done.error
    listed = client.get("/v1/jobs", headers=project.headers).json()["items"]
    mine = str(trained["id"])
    made = {j["labels"]["eval_at"]: j for j in listed if j["labels"].get("eval_of") == mine}
    assert set(made) == {"6", "12"}
    for job in made.values():
        ended = wait_state(engine, job["id"], TERMINAL, RUN_S, worker)
        assert ended.state == "succeeded", ended.error
    eval_loss = {p.step: p.value for p in metric_series(engine, trained["id"], "eval_loss")}
    assert set(eval_loss) >= {6, 12}
    answer = client.get(f"/v1/jobs/{trained['id']}/evals", headers=project.headers)
    assert answer.status_code == 200, answer.text
    by_step = {e["step"]: e for e in answer.json()["items"]}
    assert sorted(by_step) == [6, 12]
    for step, result in by_step.items():
        assert result["source_job_id"] == trained["id"] and result["checkpoint_id"] is not None
        assert result["metrics"]["loss"] == pytest.approx(eval_loss[step], rel=1e-5), step


def test_eval_specs_that_cannot_run_are_refused_with_the_fields_path(
    client: TestClient,
    engine: Engine,
    session: Session,
    settings: Settings,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset_id: str,
) -> None:
    queued = submit(
        client, project, tiny_spec(pool="nowhere", dataset_id=dataset_id).model_dump(mode="json")
    )
    perplexity = {"kind": "perplexity"}
    no_checkpoint = client.post(
        "/v1/jobs", json=_eval_spec(queued["id"], "nowhere", perplexity), headers=project.headers
    )
    assert_error(no_checkpoint, 409, "conflict", ["body", "evaluate", "source", "job"])
    elsewhere = client.post(
        "/v1/jobs",
        json=_eval_spec(queued["id"], "nowhere", perplexity),
        headers=other_project.headers,
    )
    assert_error(elsewhere, 404, "not_found", ["body", "evaluate", "source", "job"])
    session.add(Checkpoint(job_id=queued["id"], attempt=1, step=4, uri="file:///nowhere/step_4"))
    session.commit()
    for evaluation, status, code in (
        ({"kind": "generate", "dataset": dataset_id}, 422, "validation_error"),
        ({"kind": "perplexity", "dataset": "ds_nope"}, 404, "not_found"),
    ):
        answer = client.post(
            "/v1/jobs",
            json=_eval_spec(queued["id"], "nowhere", evaluation),
            headers=project.headers,
        )
        assert_error(answer, status, code, ["body", "evaluate", "evaluations", 0, "dataset"])
    after = tiny_spec(pool="nowhere", dataset_id=dataset_id).model_dump(
        mode="json", exclude_none=True
    )
    after["eval_after"] = [{"kind": "generate", "dataset": dataset_id}]
    assert_error(
        client.post("/v1/jobs", json=after, headers=project.headers),
        422,
        "validation_error",
        ["body", "eval_after", "evaluations", 0, "dataset"],
    )
    mixed = {**_eval_spec(queued["id"], "nowhere", perplexity), "model": {"kind": "gpt"}}
    refused = client.post("/v1/jobs", json=mixed, headers=project.headers)
    assert_error(refused, 422, "validation_error", ["body", "model"])
    twice = _eval_spec(queued["id"], "nowhere", perplexity, perplexity)
    assert_error(
        client.post("/v1/jobs", json=twice, headers=project.headers),
        422,
        "validation_error",
    )
    listed = client.get("/v1/jobs", headers=project.headers).json()["items"]
    assert [j["id"] for j in listed] == [queued["id"]]  # nothing refused was stored


def test_reward_evaluations_a_source_cannot_serve_are_refused_at_their_fields(
    client: TestClient, session: Session, project: ProjectKey, dataset_id: str
) -> None:
    """A `reward` evaluation of a supervised job has no prompts or graders to inherit (both
    paths in one answer) and cannot read prompts from plain text; a GRPO job's `eval_after`
    cannot score perplexity on its own split (prompts, no answers); a grader that reads a file
    needs the job's `method.grpo.code` (with it, `reward` reads the same archive:
    tests/integration/trainer/test_grpo_grader_code.py)."""
    sft = submit(
        client, project, tiny_spec(pool="nowhere", dataset_id=dataset_id).model_dump(mode="json")
    )
    session.add(Checkpoint(job_id=sft["id"], attempt=1, step=4, uri="file:///nowhere/step_4"))
    session.commit()
    bare = client.post(
        "/v1/jobs",
        json=_eval_spec(sft["id"], "nowhere", {"kind": "reward"}),
        headers=project.headers,
    )
    at = ["body", "evaluate", "evaluations", 0]
    error = assert_error(bare, 422, "validation_error", [*at, "dataset"])
    assert [*at, "graders"] in [d["loc"] for d in error["details"]]
    exact = {"type": "string_check", "name": "exact", "operation": "eq",
             "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}"}  # fmt: skip
    text = {"kind": "reward", "dataset": dataset_id, "graders": [exact]}
    refused = client.post(
        "/v1/jobs", json=_eval_spec(sft["id"], "nowhere", text), headers=project.headers
    )
    error = assert_error(refused, 422, "validation_error", [*at, "dataset"])
    assert "`reward` reads the prompts of" in error["message"]

    grpo = tiny_spec(pool="nowhere", dataset_id=dataset_id).model_dump(
        mode="json", exclude_none=True
    )
    records = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(4)]
    uploaded = client.post(
        "/v1/datasets/upload",
        data={"name": "sums"},
        files={"file": ("sums.jsonl", "".join(json.dumps(r) + "\n" for r in records).encode())},
        headers=project.headers,
    )
    assert uploaded.status_code == 201, uploaded.text
    grpo["data"] = {"dataset": uploaded.json()["id"]}
    grpo["method"] = {"kind": "grpo", "grpo": {"graders": [exact], "max_new_tokens": 8}}
    grpo["eval_after"] = ["perplexity"]
    perplexity = client.post("/v1/jobs", json=grpo, headers=project.headers)
    error = assert_error(
        perplexity, 422, "validation_error", ["body", "eval_after", "evaluations", 0, "dataset"]
    )
    assert "kind `reward`" in error["message"]
    grpo["eval_after"] = ["reward"]
    grpo["method"]["grpo"]["graders"].append({"type": "python", "name": "team", "file": "g.py"})
    inherited = client.post("/v1/jobs", json=grpo, headers=project.headers)
    error = assert_error(
        inherited, 422, "validation_error", ["body", "method", "grpo", "graders", 1, "file"]
    )
    assert "give method.grpo.code" in error["message"]
    listed = client.get("/v1/jobs", headers=project.headers).json()["items"]
    assert [j["id"] for j in listed] == [sft["id"]]  # nothing refused was stored
