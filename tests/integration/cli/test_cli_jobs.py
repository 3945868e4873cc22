"""The ``torchyard`` CLI and SDK against a real API server (the `live_api` fixture).

No worker serves the pool these jobs ask for, so they stay queued until the test cancels
them: the outcomes below do not depend on timing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.integration.conftest import UNSERVED_POOL
from torchyard import Client
from torchyard.cli import app


def test_submit_list_show_cancel_follow_round_trip(cli: Any, spec_file: Path) -> None:
    submitted = cli("submit", str(spec_file), "--set", "train.max_steps=20", "--json")
    assert submitted.exit_code == 0, submitted.output
    job = json.loads(submitted.stdout)
    assert (job["name"], job["state"], job["pool"]) == ("cli-test", "queued", UNSERVED_POOL)

    listed = cli("jobs", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)] == [job["id"]]
    assert job["id"] in {
        j["id"] for j in json.loads(cli("jobs", "--state", "queued", "--json").stdout)
    }
    assert json.loads(cli("jobs", "--state", "running", "--json").stdout) == []

    shown = json.loads(cli("show", str(job["id"]), "--json").stdout)
    assert shown["spec"]["train"]["max_steps"] == 20, "--set must reach the stored spec"
    assert shown["max_steps"] == 20
    assert shown["queue"]["reason"] == "no free worker"  # nothing serves its pool
    header, *rows = cli("jobs").stdout.splitlines()  # 80 columns: the QUEUE column wraps
    queue = " ".join(row[header.index("QUEUE") :].strip() for row in rows)
    assert queue == "#1 no free worker", cli("jobs").stdout
    assert "no free worker" in " ".join(cli("show", str(job["id"])).stdout.split())

    cancelled = cli("cancel", str(job["id"]), "--json")
    assert cancelled.exit_code == 0, cancelled.output
    assert json.loads(cancelled.stdout)["state"] == "cancelled"

    again = cli("cancel", str(job["id"]))
    assert again.exit_code == 1
    assert "conflict" in again.output

    followed = cli("follow", str(job["id"]), "--poll", "0.1")
    assert followed.exit_code == 1, "following a cancelled job must not exit 0"
    assert "cancelled" in followed.output


def test_bad_spec_prints_each_field_path_and_exits_1(cli: Any, spec_file: Path) -> None:
    result = cli(
        "submit", str(spec_file), "--set", "model.n_heads=5", "--set", "eval.interval_steps=50"
    )
    assert result.exit_code == 1
    assert "model.n_heads: n_heads (5) must divide d_model (32)" in result.output
    assert "eval.interval_steps: interval_steps (50) exceeds train.max_steps (10)" in result.output
    assert "Traceback" not in result.output
    assert json.loads(cli("jobs", "--json").stdout) == [], "a rejected spec must not make a job"


def test_wrong_api_key_exits_1_saying_unauthorized(cli: Any) -> None:
    result = cli("jobs", key="ty_not-a-real-key")
    assert result.exit_code == 1
    assert "unauthorized" in result.output


def test_sdk_iter_follows_next_cursor_newest_first(
    live_api: str, api_key: str, spec_file: Path, cli: Any
) -> None:
    ids = [json.loads(cli("submit", str(spec_file), "--json").stdout)["id"] for _ in range(3)]
    with Client(live_api, api_key) as client:
        first = client.jobs.list(limit=1)
        assert [j.id for j in first.items] == [ids[-1]] and first.next_cursor is not None
        assert [j.id for j in client.jobs.iter(page_size=1)] == ids[::-1]
        for job_id in ids:
            client.jobs.cancel(job_id)
        assert [j.id for j in client.jobs.iter(state="cancelled", page_size=2)] == ids[::-1]


def test_login_verifies_the_key_then_commands_use_the_saved_config(
    live_api: str, api_key: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    env = {"TORCHYARD_CONFIG": str(tmp_path / "config.toml"), "TORCHYARD_URL": None,
           "TORCHYARD_API_KEY": None}  # fmt: skip
    refused = runner.invoke(app, ["login", "--url", live_api, "--api-key", "ty_bad"], env=env)
    assert refused.exit_code == 1 and "unauthorized" in refused.output
    assert not (tmp_path / "config.toml").exists(), "a refused key must not be saved"

    login = runner.invoke(app, ["login", "--url", live_api, "--api-key", api_key], env=env)
    assert login.exit_code == 0, login.output
    whoami = runner.invoke(app, ["whoami", "--json"], env=env)
    assert whoami.exit_code == 0, whoami.output
    me = json.loads(whoami.stdout)
    assert me["url"] == live_api and api_key.startswith(me["key"]["prefix"])


def test_label_sets_labels_and_a_note_and_refuses_a_bad_pair(cli: Any, spec_file: Path) -> None:
    job = json.loads(cli("submit", str(spec_file), "--json").stdout)
    result = cli("label", str(job["id"]), "team=nlp", "stage=a=b", "--note", "best so far")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"job {job['id']}: team=nlp stage=a=b",
        "note: best so far",
    ]
    shown = json.loads(cli("show", str(job["id"]), "--json").stdout)
    assert (shown["labels"], shown["note"]) == ({"team": "nlp", "stage": "a=b"}, "best so far")
    # Only the note: the labels stay; --clear removes them.
    kept = json.loads(cli("label", str(job["id"]), "--note", "", "--json").stdout)
    assert (kept["labels"], kept["note"]) == ({"team": "nlp", "stage": "a=b"}, None)
    assert json.loads(cli("label", str(job["id"]), "--clear", "--json").stdout)["labels"] == {}

    bad = cli("label", str(job["id"]), "nokey")
    assert bad.exit_code == 2 and "'nokey' is not KEY=VALUE" in bad.output
    too_long = cli("label", str(job["id"]), "k=" + "v" * 201)
    assert too_long.exit_code == 1 and "labels.k" in too_long.output
    assert "Example: `torchyard label 42" in cli("label", "--help").stdout
    cli("cancel", str(job["id"]))
