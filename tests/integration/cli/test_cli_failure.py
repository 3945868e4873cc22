"""`torchyard show` starts a failed job with why it failed, and `torchyard jobs` names the
failure class beside the state (issue 12; issue 15: "`jobs`/`show`: ... failure cause;
`--json` unchanged for scripts"), against a real API server (`live_api`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine

from core.platform.tables import JobState
from tests.conftest import ProjectKey
from tests.integration.conftest import UNSERVED_POOL
from tests.integration.failures import INFRA, OOM, RETRIES, fail_job
from tests.integration.workers.helpers import create_job, tiny_spec


@pytest.fixture
def dataset_id(live_api: str, project: ProjectKey, corpus_dir: Path) -> str:
    answer = httpx.post(
        f"{live_api}/v1/datasets",
        json={"name": "corpus", "uri": str(corpus_dir)},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _job(engine: Engine, project: ProjectKey, dataset_id: str, name: str) -> int:
    spec = tiny_spec(pool=UNSERVED_POOL, dataset_id=dataset_id, name=name, retries=RETRIES)
    return create_job(engine, project, spec)


def test_show_starts_a_failed_job_with_class_reason_where_budget_and_log_tail(
    cli: Any,
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
) -> None:
    job_id = _job(engine, project, dataset_id, "oom-run")
    fail_job(engine, job_id, OOM, restarts_by_class={"infra": 2})

    shown = cli("show", str(job_id))
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == f"failed: [oom] {OOM.reason} (rank 3 on host-b, exit 1)"
    assert lines[1] == (
        "restarts: restarted 2 times (hang 0/2, infra 2/3, at most 3 in all); "
        "oom is not restarted (budget 0)"
    )
    assert lines[2] == "last log lines of rank 3:"
    assert lines[3 : 3 + len(OOM.log_tail)] == [f"  {line}" for line in OOM.log_tail]
    details = shown.stdout[shown.stdout.index("\nid ") :]
    assert "oom-run" in details
    assert "[oom]" not in details, "the error text (and its log tail) is not printed twice"


def test_show_json_keeps_its_shape_and_adds_the_failure_fields(
    cli: Any,
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
) -> None:
    job_id = _job(engine, project, dataset_id, "oom-run")
    before = json.loads(cli("show", str(job_id), "--json").stdout)
    fail_job(engine, job_id, OOM, restarts_by_class={"infra": 2})
    after = json.loads(cli("show", str(job_id), "--json").stdout)
    new = {"failure", "restarts_used", "restarts_by_class", "retry_policy"}
    assert new <= set(before) and set(after) == set(before)
    assert before["failure"] is None
    assert after["failure"]["failure_class"] == "oom"
    assert after["failure"]["log_tail"] == list(OOM.log_tail)
    assert after["retry_policy"]["by_class"]["infra"] == {"allowed": 3, "used": 2, "left": 1}
    [listed] = json.loads(cli("jobs", "--json").stdout)
    assert listed["failure"] == {**after["failure"], "log_tail": None}


def test_jobs_names_the_failure_class_beside_the_state(
    cli: Any,
    engine: Engine,
    project: ProjectKey,
    dataset_id: str,
) -> None:
    failed = _job(engine, project, dataset_id, "oom-run")
    fail_job(engine, failed, OOM)
    restarted = _job(engine, project, dataset_id, "infra-run")
    fail_job(engine, restarted, INFRA, state=JobState.RUNNING, restarts_by_class={"infra": 1})
    healthy = _job(engine, project, dataset_id, "fine-run")

    listed = cli("jobs")
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "failed (oom)" in rows[str(failed)]
    assert "running (after infra)" in rows[str(restarted)]
    assert rows[str(healthy)].split()[2:4] == ["queued", "0/24"], "no class when none failed"

    shown = cli("show", str(restarted))
    first = shown.stdout.splitlines()[0]
    assert first == f"last failure: [infra] {INFRA.reason} (rank 1 on host-a, exit 1)"
