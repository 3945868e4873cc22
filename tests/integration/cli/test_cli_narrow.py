"""Issue 45, item 5, and issue 46: on an 80-column terminal (``COLUMNS=80``) the CLI keeps
whole what a user copies next (a dataset's id, a key's id, a checkpoint's path), cuts a long
job name in its middle on one line, and prints figures in units, not ``1.3e+09``. Each command
runs against a real API server; the job is made running and given metrics by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from core.jobs import upserts
from core.jobs.upserts import Metric
from core.platform.db import session_scope
from core.platform.tables import Checkpoint
from tests.integration.api.conftest import set_running
from tests.integration.conftest import cli_invoker

LONG_NAME = "quickstart-gpt-small-lr-3e-4-warmup-100-cosine-seven"
LONG_URI = "file:///home/ada/.torchyard/quickstart/storage/checkpoints/job-17/step_00000200"


@pytest.fixture
def narrow(live_api: str, api_key: str, tmp_path: Path) -> Any:
    return cli_invoker(live_api, api_key, tmp_path, COLUMNS="80")


def _ok(result: Any) -> str:
    assert result.exit_code == 0, result.output
    return str(result.stdout)


def test_datasets_list_keeps_each_id_whole_and_each_uri_whole_on_one_line(
    narrow: Any, tmp_path: Path
) -> None:
    path = tmp_path / "a-corpus-file-with-a-rather-long-name-for-an-80-column-terminal.txt"
    path.write_text("some text\n")
    dataset = json.loads(
        _ok(narrow("datasets", "upload", "a-long-dataset-name", str(path), "--json"))
    )
    listed = _ok(narrow("datasets", "list"))
    assert dataset["id"] in listed, listed
    assert len(dataset["uri"]) > 40 and any(dataset["uri"] in line for line in listed.splitlines())
    assert all(len(line) <= 80 for line in listed.splitlines() if dataset["uri"] not in line)


def test_keys_list_keeps_the_id_that_keys_revoke_takes(narrow: Any) -> None:
    created = narrow("keys", "create", "ci-deploys-from-the-build-farm", "--scope", "jobs:read")
    key_id = created.output.split()[1]
    assert key_id.startswith("key_"), created.output
    assert key_id in _ok(narrow("keys", "list"))


def test_jobs_cuts_a_long_name_in_its_middle_on_one_line(narrow: Any, spec_file: Path) -> None:
    submitted = narrow("submit", str(spec_file), "--set", f"name={LONG_NAME}", "--json")
    job_id = json.loads(_ok(submitted))["id"]
    listed = _ok(narrow("jobs"))
    row = next(line for line in listed.splitlines() if line.split()[0] == str(job_id))
    head, _, tail = row.split()[1].partition("…")
    assert head and tail and LONG_NAME.startswith(head) and LONG_NAME.endswith(tail), listed
    assert all(len(line) <= 80 for line in listed.splitlines()), listed
    # its place in the queue (other tests' jobs wait on the pool too) stays on the job's line
    assert re.search(r"#\d+ no free", row), listed


def test_metrics_show_and_checkpoints_print_units_and_the_path_whole(
    narrow: Any, spec_file: Path, engine: Engine
) -> None:
    job_id = json.loads(_ok(narrow("submit", str(spec_file), "--json")))["id"]
    set_running(engine, job_id)
    with session_scope(engine) as s:
        points = [
            Metric("loss", 5, 2.5, 0.0),
            Metric("tokens_per_second", 5, 20_600.0, 0.0),
            Metric("step_time_s", 5, 0.512, 0.0),
            Metric("sys/rss_bytes/0", 5, 1.3e9, 0.0),
        ]
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)
        s.add(Checkpoint(job_id=job_id, attempt=1, step=5, uri=LONG_URI))

    metrics = {
        line.split()[0]: line.split()[3:]
        for line in _ok(narrow("metrics", str(job_id))).splitlines()[1:]
    }
    assert metrics["sys/rss_bytes/0"] == ["1.3", "GB"] * 3, metrics
    assert metrics["tokens_per_second"] == ["20.6k"] * 3, metrics
    assert metrics["step_time_s"] == ["0.512", "s"] * 3, metrics
    shown = _ok(narrow("show", str(job_id)))
    assert "e+0" not in shown and "e+0" not in str(metrics), shown
    assert "20.6k" in shown, shown

    listed = _ok(narrow("checkpoints", str(job_id)))
    assert any(LONG_URI in line for line in listed.splitlines()), listed
