"""``torchyard sweep`` against a real API server, with the controller's sweep round run in this
process and a trial's job ended by hand: submit from YAML (a bad space is refused with its
path), show, trials, best (with the export command of its checkpoint), cancel; and the SDK's
`client.sweeps` the CLI stands on."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from core.jobs import service as jobs
from core.jobs import upserts
from core.jobs.upserts import Metric
from core.platform.db import session_factory, session_scope
from core.platform.settings import Settings
from core.platform.tables import Checkpoint, Job, JobState
from core.sweeps import drive, prune
from tests.integration.api.conftest import set_running
from torchyard import Client
from torchyard.errors import Conflict, ValidationFailed


def _round(engine: Engine, settings: Settings) -> None:
    drive.advance_all(
        session_factory=session_factory(engine),
        settings=settings,
        dispatch=lambda job_id, pool: None,
    )


def _sweep_file(tmp_path: Path, spec_file: Path, space: str) -> Path:
    base = spec_file.read_text().replace("\n", "\n  ")
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: cli-sweep\n"
        f"base:\n  {base}\n"
        f"space: {space}\n"
        "searcher: grid\n"
        "max_trials: 2\n"
        "max_concurrent_trials: 2\n"
    )
    return path


def _succeed(engine: Engine, job_id: int) -> None:
    """End trial job `job_id` as a worker would: running, eval_loss 2.5 at step 10, a
    checkpoint at step 10, succeeded."""
    set_running(engine, job_id)
    with session_scope(engine) as s:
        points = [Metric("eval_loss", 10, 2.5, 0.0)]
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)
        s.add(Checkpoint(job_id=job_id, attempt=1, step=10, uri="/nowhere"))
        jobs.transition(session=s, job_id=job_id, to=JobState.SUCCEEDED)


def test_sweep_commands_submit_show_trials_best_and_cancel(
    cli: Any,
    spec_file: Path,
    tmp_path: Path,
    engine: Engine,
    settings: Settings,
    live_api: str,
    api_key: str,
) -> None:
    bad = _sweep_file(tmp_path, spec_file, "{optim.lrr: {choice: [0.001, 0.01]}}")
    refused = cli("sweep", "submit", str(bad))
    assert refused.exit_code == 1
    assert "space.optim.lrr" in refused.output and "'lrr' is not a field of optim" in refused.output

    good = _sweep_file(tmp_path, spec_file, "{optim.lr: {choice: [0.001, 0.01]}}")
    submitted = cli("sweep", "submit", str(good), "--json")
    assert submitted.exit_code == 0, submitted.output
    sweep = json.loads(submitted.stdout)
    assert sweep["state"] == "running" and sweep["max_trials"] == 2

    best = cli("sweep", "best", str(sweep["id"]))
    assert best.exit_code == 1 and "no completed trial yet" in best.output

    _round(engine, settings)
    trials = json.loads(cli("sweep", "trials", str(sweep["id"]), "--json").stdout)
    assert sorted(t["params"]["optim.lr"] for t in trials) == [0.001, 0.01]
    table = cli("sweep", "trials", str(sweep["id"]))
    assert table.exit_code == 0 and "optim.lr" in table.stdout and "running" in table.stdout

    done = trials[0]
    _succeed(engine, done["job_id"])
    _round(engine, settings)
    best = cli("sweep", "best", str(sweep["id"]))
    assert best.exit_code == 0, best.output
    assert f"trial {done['number']}: eval_loss 2.5, job {done['job_id']}" in best.stdout
    assert f"torchyard export {done['job_id']} " in best.stdout
    shown_best = json.loads(cli("sweep", "best", str(sweep["id"]), "--json").stdout)
    assert shown_best["export_refused"] is None  # a full GPT's checkpoint exports
    shown = cli("sweep", "show", str(sweep["id"]))
    assert "1/2 ended, 1 running" in shown.stdout

    with Client(live_api, api_key) as client:  # the SDK the commands use
        assert [s.id for s in client.sweeps.list().items] == [sweep["id"]]
        assert client.sweeps.get(sweep["id"]).best.number == done["number"]  # type: ignore[union-attr]
        with pytest.raises(ValidationFailed):
            client.sweeps.create({"name": "x", "base": {}, "space": {}})

    cancelled = cli("sweep", "cancel", str(sweep["id"]), "--json")
    assert cancelled.exit_code == 0 and json.loads(cancelled.stdout)["state"] == "cancelled"
    with Client(live_api, api_key) as client, pytest.raises(Conflict):
        client.sweeps.cancel(sweep["id"])


def test_sweep_best_of_a_lora_sweep_says_why_its_checkpoint_is_not_exported(
    cli: Any,
    spec_file: Path,
    tmp_path: Path,
    engine: Engine,
    settings: Settings,
) -> None:
    """Issue 45: `sweep best` suggested `torchyard export J C` for a LoRA trial, a 409. It now
    says why (the adapters-only checkpoint) and what the run wrote instead, as the export does."""
    submitted = cli("submit", str(spec_file), "--json")
    assert submitted.exit_code == 0, submitted.output
    source = json.loads(submitted.stdout)["id"]  # the weights the trials adapt
    with session_scope(engine) as s:
        s.add(Checkpoint(job_id=source, attempt=1, step=10, uri=str(tmp_path / "source")))
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(
        spec_file.read_text().replace("model: {", f"model: {{init_from: {{job: {source}}}, ")
    )
    sweep_file = _sweep_file(tmp_path, tuned, "{lora.r: {choice: [4, 8]}}")
    created = cli("sweep", "submit", str(sweep_file), "--json")
    assert created.exit_code == 0, created.output
    sweep = json.loads(created.stdout)
    _round(engine, settings)
    done = json.loads(cli("sweep", "trials", str(sweep["id"]), "--json").stdout)[0]
    _succeed(engine, done["job_id"])
    _round(engine, settings)

    best = cli("sweep", "best", str(sweep["id"]))
    assert best.exit_code == 0, best.output
    assert re.search(r"torchyard export \d", best.stdout) is None  # no checkpoint export offered
    assert f"torchyard export-lora {done['job_id']}" in best.stdout  # its adapter instead
    assert "LoRA/QLoRA" in best.stdout and "adapter and merged model" in best.stdout
    shown = json.loads(cli("sweep", "best", str(sweep["id"]), "--json").stdout)
    assert shown["export_refused"].startswith(f"job {done['job_id']} is a LoRA/QLoRA")
    refused = cli("export", str(done["job_id"]), str(shown["checkpoint_id"]), "--out", "m.st")
    assert refused.exit_code != 0 and "LoRA/QLoRA" in refused.output  # what it spared the user
    assert cli("sweep", "cancel", str(sweep["id"])).exit_code == 0


def test_a_pruned_trial_says_pruned_in_jobs_show_and_trials_and_is_not_retried(
    cli: Any,
    spec_file: Path,
    tmp_path: Path,
    engine: Engine,
    settings: Settings,
) -> None:
    """Issue 45, item 4: a pruned trial's job read `cancelled` in `torchyard jobs` and `show`
    (no reason) while `sweep trials` said pruned. The pruner's stop (`prune.stop`) and the
    worker's end of the stopped attempt (`jobs.end_stop`) leave it `pruned`, with where, in
    every command; `retry` refuses it."""
    sweep_file = _sweep_file(tmp_path, spec_file, "{optim.lr: {choice: [0.001, 0.01]}}")
    sweep_file.write_text(
        sweep_file.read_text() + "pruner: {kind: asha, min_resource: 5, reduction_factor: 2}\n"
    )
    created = cli("sweep", "submit", str(sweep_file), "--json")
    assert created.exit_code == 0, created.output
    sweep_id = json.loads(created.stdout)["id"]
    _round(engine, settings)
    trial = json.loads(cli("sweep", "trials", str(sweep_id), "--json").stdout)[0]
    job_id = trial["job_id"]
    set_running(engine, job_id)
    with session_scope(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None
        running = prune.trial_of(s, job)
        assert running is not None
        assert prune.stop(s, job_id, running, prune.Verdict(step=10, rung=1))
    with session_scope(engine) as s:  # the trainer stopped: the worker ends the attempt
        assert jobs.end_stop(session=s, job_id=job_id).state == JobState.PRUNED
    _round(engine, settings)
    why = f"pruned by sweep {sweep_id} at step 10, rung 1"

    shown = cli("show", str(job_id))
    assert shown.exit_code == 0, shown.output
    assert "cancelled" not in shown.stdout and why in shown.stdout, shown.stdout
    listed = cli("jobs", "--json")
    assert {j["id"]: j["state"] for j in json.loads(listed.stdout)}[job_id] == "pruned"
    assert "pruned" in cli("jobs", "--state", "pruned").stdout
    trials = cli("sweep", "trials", str(sweep_id))
    assert "pruned at step 10 (rung 1)" in trials.stdout, trials.stdout
    refused = cli("retry", str(job_id))
    assert refused.exit_code != 0 and "pruned" in refused.output, refused.output
    assert cli("sweep", "cancel", str(sweep_id)).exit_code == 0
