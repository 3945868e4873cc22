"""A GRPO job's python grader from the project's code (issue 48: "the team's grade(sample, item)
-> float from the job's code archive") through the real service: SDK -> API -> Celery worker ->
bwrap -> torchrun (2 ranks, DDP). The archive (`torchyard code upload`) holds `graders/lower.py`,
`tests.support.grpo`'s `LOWER` grader as a file, which imports a helper module from the archive's
root: the worker unpacks `method.grpo.code` into the attempt's code directory, the sandbox shows
it read-only, and the grader's process runs there with it first on `sys.path`."""

from __future__ import annotations

from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import make_project
from tests.integration.workers.helpers import start_worker, unique_queue
from tests.support.grpo import GRADERS, grpo_job, write_prompts
from torchyard.client import Client
from torchyard.errors import ValidationFailed

JOB_TIMEOUT_S = 240
pytestmark = pytest.mark.timeout(JOB_TIMEOUT_S + 60)

# `LOWER` (tests.support.grpo), its arithmetic in a module of the archive's root.
HELPER = """
def lower_share(text):
    return sum(c.islower() for c in text) / max(len(text), 1)
"""
LOWER_FILE = """
from textstats import lower_share

def grade(sample, item):
    return lower_share(sample["output_text"])
"""
# 1.0 when the grader can write into the job's code directory (its working directory).
WRITES = """
def grade(sample, item):
    try:
        open("written-by-a-grader.txt", "w").close()
        return 1.0
    except OSError:
        return 0.0
"""


def _archive(root: Path) -> Path:
    (root / "graders").mkdir(parents=True)
    (root / "textstats.py").write_text(HELPER)
    (root / "graders" / "lower.py").write_text(LOWER_FILE)
    (root / "graders" / "writes.py").write_text(WRITES)
    return root


def test_a_grpo_jobs_file_grader_from_its_code_archive_imports_its_neighbours_and_trains(
    live_api: str, engine: Engine, settings: Settings, celery_client: Celery, tmp_path: Path
) -> None:
    """The file grader scores as the inline `LOWER` does (the reward is its, rising from its
    held-out value at step 0), a grader that tries to write into the code scores 0 (read-only in
    the sandbox), and the job succeeds; its `eval_after: [reward]` job scores the final
    checkpoint with the same file graders from the same archive; another project cannot name
    the archive."""
    queue = unique_queue("grpo-code")
    worker = start_worker(
        settings=settings,
        client=celery_client,
        queue=queue,
        log_dir=tmp_path,
        extra_env={"TORCHYARD_SANDBOX": "bwrap"},
    )
    spec = grpo_job(dataset="prompts", pool=queue, max_steps=10)
    spec["eval_after"] = {"evaluations": ["reward"], "baseline": False}
    exact = [g for g in GRADERS if g["name"] == "exact"]
    spec["method"]["grpo"]["graders"] = [
        {"type": "python", "name": "lower", "file": "graders/lower.py"},
        {"type": "python", "name": "writes", "file": "graders/writes.py", "weight": 0},
        *exact,
    ]
    try:
        with Client(live_api, make_project(engine).api_key) as client:
            client.datasets.upload("prompts", write_prompts(tmp_path / "prompts.jsonl"))
            code = client.code.upload(_archive(tmp_path / "code")).id
            spec["method"]["grpo"]["code"] = code
            job = client.jobs.create(spec)
            done = client.jobs.wait(job.id, poll_s=0.5, timeout_s=JOB_TIMEOUT_S)
            assert done.state == "succeeded", (done.error, worker.log[-4000:])
            series = {
                s.name: dict(zip(s.steps, s.values, strict=True))
                for s in client.jobs.metrics(job.id)
            }
            # its eval_after job reads the same archive for the job's own file graders
            (scorer,) = [
                j for j in client.jobs.list().items if j.labels.get("eval_of") == str(job.id)
            ]
            ended = client.jobs.wait(scorer.id, poll_s=0.5, timeout_s=JOB_TIMEOUT_S)
            assert ended.state == "succeeded", (ended.error, worker.log[-4000:])
            (scored,) = client.jobs.evals(job.id)
        with Client(live_api, make_project(engine).api_key) as theirs:
            theirs.datasets.upload("prompts", tmp_path / "prompts.jsonl")
            with pytest.raises(ValidationFailed, match="no code archive") as refused:
                theirs.jobs.create(spec)
    finally:
        worker.stop()
    assert [d.loc for d in refused.value.details] == [("body", "method", "grpo", "code")]
    reward, held = series["reward"], series["eval_reward"]
    assert sorted(reward) == [5, 10] and sorted(held) == [0, 10]
    assert series["reward/lower"] == reward and all(v > 0 for v in reward.values()), reward
    assert held[10] > held[0], held
    assert set(series["reward/writes"].values()) == {0.0}, "the code directory is read-only"
    assert series["grader_errors/lower"][10] == 0, "the helper module imported"
    assert scored.kind == "reward" and scored.step == 10
    assert scored.metrics["grader_errors/lower"] == 0 and scored.metrics["reward/writes"] == 0
    for sample in scored.samples:  # greedy answers of the held-out prompts, scored by the file
        text = sample["completion"]
        assert sample["scores"]["lower"] == pytest.approx(
            sum(c.islower() for c in text) / max(len(text), 1)
        ), sample
