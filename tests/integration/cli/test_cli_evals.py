"""``torchyard evals`` and the SDK's `client.jobs.evals` against a real API server: an eval job
submitted through the SDK (its source's checkpoint pinned), its results recorded as a worker's
ingest records them, then listed from the eval job and from the evaluated job, with the
answers on request; and an eval job ended as a worker ends it, as `jobs`, `show` and `follow`
print it: kind ``eval``, its scores first, the job and checkpoint it scored, the starting
weights' score and the change beside each, and "evaluation completed"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from core.jobs import evaluations
from core.platform.db import session_scope
from core.platform.tables import Checkpoint, Job
from tests.conftest import ProjectKey
from tests.integration.conftest import cli_invoker
from tests.integration.eval_jobs import add_checkpoint, run_eval_job
from torchyard import Client

SCORES = {"exact_match": 0.5, "chrf": 61.25, "rouge_l": 0.75, "answers": 2.0}


def test_evals_lists_an_eval_jobs_results_from_either_job(
    cli: Any, spec_file: Path, engine: Engine, live_api: str, project: ProjectKey, tmp_path: Path
) -> None:
    submitted = cli("submit", str(spec_file), "--json")
    assert submitted.exit_code == 0, submitted.output
    source = json.loads(submitted.stdout)["id"]
    with session_scope(engine) as session:
        session.add(Checkpoint(job_id=source, attempt=1, step=8, uri="file:///nowhere/step_8"))
    client = Client(live_api, api_key=project.api_key)
    evaluation = {"kind": "generate", "name": "qa", "dataset": _qa_dataset(cli, tmp_path)}
    spec = {"name": "eval", "evaluate": {"source": {"job": source}, "evaluations": [evaluation]}}
    eval_job = client.jobs.create(spec)
    assert eval_job.spec["evaluate"]["source"]["checkpoint"] is not None
    sample = {"prompt": "Q: 2+2?", "reference": "4", "answer": "4", "exact_match": 1.0}
    with session_scope(engine) as session:
        row = session.get(Job, eval_job.id)
        assert row is not None
        event = {
            "name": "qa",
            "kind": "generate",
            "step": 8,
            "metrics": SCORES,
            "samples": [sample],
        }
        evaluations.record(session=session, job=row, attempt=1, event=event)

    for job_id in (source, eval_job.id):
        (found,) = client.jobs.evals(job_id)
        assert (found.job_id, found.source_job_id, found.step, found.metrics) == (
            eval_job.id,
            source,
            8,
            SCORES,
        )
        shown = cli("evals", str(job_id), "--answers")
        assert shown.exit_code == 0, shown.output
        assert "chrf 61.25" in shown.output and "rouge_l 0.75" in shown.output
        assert "Q: 2+2?" in shown.output and "answer:    '4'" in shown.output
    listed = cli("evals", str(source), "--json")
    assert [e["name"] for e in json.loads(listed.stdout)] == ["qa"]
    for job_id in (eval_job.id, source):  # queued on pools other tests count their queue of
        assert client.jobs.cancel(job_id).state == "cancelled"


def test_an_eval_job_prints_as_one_with_its_scores_source_and_baseline(
    cli: Any, spec_file: Path, engine: Engine, live_api: str, project: ProjectKey, tmp_path: Path
) -> None:
    submitted = cli("submit", str(spec_file), "--json")
    assert submitted.exit_code == 0, submitted.output
    source = json.loads(submitted.stdout)["id"]
    checkpoint_id = add_checkpoint(engine, source, 8)
    client = Client(live_api, api_key=project.api_key)
    evaluate = {"source": {"job": source}, "evaluations": [{"kind": "perplexity"}]}
    eval_job = client.jobs.create({"name": "scored", "evaluate": evaluate})
    initial = {"source": {"job": source, "initial": True}, "evaluations": [{"kind": "perplexity"}]}
    base_job = client.jobs.create({"name": "base", "evaluate": initial})
    run_eval_job(engine, base_job.id, 0, {"perplexity": {"loss": 3.5, "tokens": 4096.0}})
    run_eval_job(engine, eval_job.id, 8, {"perplexity": {"loss": 2.5, "tokens": 4096.0}})

    followed = cli("follow", str(eval_job.id))
    assert followed.exit_code == 0, followed.output
    assert "evaluation completed" in followed.output and "training" not in followed.output
    tail = followed.output[followed.output.index("job    ") :]
    lines = [line.split() for line in tail.splitlines() if line.strip()]
    assert [line[0] for line in lines[:5]] == [
        "job", "state", "perplexity.loss", "perplexity.tokens", "source"
    ], followed.output  # fmt: skip
    assert lines[2] == ["perplexity.loss", "2.5", "base", "3.5,", "change", "-1"]
    assert lines[4] == ["source", "job", f"{source},", "checkpoint", str(checkpoint_id), "(step",
                        "8)"]  # fmt: skip
    assert f"eval job {base_job.id} (starting weights)" in followed.output
    for training_only in ("tok/s", "train loss", "eval loss", "/?"):
        assert training_only not in followed.output, followed.output

    shown = cli("show", str(eval_job.id))
    assert shown.exit_code == 0, shown.output
    rows = [line.strip().split(maxsplit=1) for line in shown.output.splitlines() if line.strip()]
    assert rows[0] == ["perplexity.loss", "2.5  base 3.5, change -1"], shown.output
    assert ["source", f"job {source}, checkpoint {checkpoint_id} (step 8)"] in rows
    assert ["kind", "eval"] in rows and "ran" in dict(r for r in rows if len(r) == 2)
    assert "trained" not in shown.output and "step" not in dict(r for r in rows if len(r) == 2)

    narrow = cli_invoker(live_api, project.api_key, tmp_path, COLUMNS="80")
    listed = narrow("jobs", "--name", "scored")
    assert listed.exit_code == 0, listed.output
    header, row = (line.split() for line in listed.output.splitlines()[:2])
    assert (row[0], row[header.index("KIND")]) == (str(eval_job.id), "eval"), listed.output
    assert client.jobs.cancel(source).state == "cancelled"  # queued on a pool others count


def _qa_dataset(cli: Any, tmp_path: Path) -> str:
    """A prompt/completion dataset uploaded through the CLI; its id."""
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"prompt": "Q: 2+2?", "completion": "4"}) + "\n")
    uploaded = cli("datasets", "upload", "qa", str(path), "--json")
    assert uploaded.exit_code == 0, uploaded.output
    return str(json.loads(uploaded.stdout)["id"])
