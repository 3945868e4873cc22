"""`/v1/sweeps` on the real app and Postgres, with the controller's sweep round
(`core.sweeps.drive.advance_all`) run in this process and jobs ended by hand: what a sweep
refuses, how trials become jobs, how ended jobs end trials, cancel, and another project's 404.
The sweeps that train for real are tests/integration/workers/test_sweeps.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from core.jobs import service as jobs
from core.jobs import upserts
from core.jobs.upserts import Metric
from core.platform.db import session_factory, session_scope
from core.platform.settings import Settings
from core.platform.tables import Job, JobNode, JobState, Sweep, SweepTrial
from core.sweeps import drive, study
from core.sweeps import service as sweeps
from jobspec.sweep import SweepSpec
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, job_spec, set_running


def sweep_spec(dataset_id: str, pool: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "lr",
        "base": job_spec(dataset_id, resources={"pool": pool}),
        "space": {"optim.lr": {"log_uniform": [1e-5, 1e-2]}},
        "searcher": "random",
        "max_trials": 3,
        "max_concurrent_trials": 2,
    }
    spec.update(overrides)
    return spec


class Rounds:
    """The controller's sweep round, in this process; dispatched jobs are recorded."""

    def __init__(
        self, engine: Engine, settings: Settings, prices: dict[str, float] | None = None
    ) -> None:
        self.factory = session_factory(engine)
        self.settings = settings.model_copy(update={"slot_prices": prices or {}})
        self.sent: list[tuple[int, str]] = []

    def to(self, pool: str) -> list[tuple[int, str]]:
        """What was dispatched to `pool` (a round serves every sweep of the database, those of
        other tests too)."""
        return [sent for sent in self.sent if sent[1] == pool]

    def run(self) -> drive.Round:
        return drive.advance_all(
            session_factory=self.factory,
            settings=self.settings,
            dispatch=lambda job_id, pool: self.sent.append((job_id, pool)),
        )


@pytest.fixture
def rounds(engine: Engine, settings: Settings) -> Rounds:
    return Rounds(engine, settings)


def _create(client: TestClient, project: ProjectKey, spec: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/v1/sweeps", json=spec, headers=project.headers)
    assert answer.status_code == 201, answer.text
    assert answer.headers["Location"] == f"/v1/sweeps/{answer.json()['id']}"
    return dict(answer.json())


def _trials(client: TestClient, project: ProjectKey, sweep_id: int) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/sweeps/{sweep_id}/trials", headers=project.headers)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def _held_a_slot(engine: Engine, job_id: int, *, seconds: float) -> None:
    """The job's first attempt held one slot for `seconds` (until now), as its worker records
    it: what its usage, and so its cost, counts."""
    now = datetime.now(UTC)
    with session_scope(engine) as s:
        s.add(
            JobNode(
                job_id=job_id,
                attempt=1,
                node_rank=0,
                worker="w",
                devices=[0],
                cpu_seconds=1.0,
                joined_at=now - timedelta(seconds=seconds),
                ended_at=now,
            )
        )


def _finish(engine: Engine, job_id: int, eval_losses: dict[int, float]) -> None:
    """The job ran (as a worker would record it) and succeeded, reporting `eval_losses`."""
    set_running(engine, job_id)
    with session_scope(engine) as s:
        points = [Metric("eval_loss", step, value, 0.0) for step, value in eval_losses.items()]
        upserts.metrics(session=s, job_id=job_id, attempt=1, points=points)
        jobs.transition(session=s, job_id=job_id, to=JobState.SUCCEEDED)


def test_every_problem_of_a_sweep_is_a_422_at_its_path_before_any_trial(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str
) -> None:
    spec = sweep_spec(
        dataset["id"],
        pool,
        space={
            "optim.lrr": {"log_uniform": [1e-5, 1e-2]},  # no such field
            "lora.r": {"uniform": [4, 32]},  # a float range for an integer field
            "optim.schedule": {"choice": ["cosine", "zigzag"]},  # a value the field refuses
            "train.micro_batch_size": {"int": [4, 2]},  # low above high
        },
        metric="accuracy",  # the trainer never reports it
    )
    error = assert_error(
        client.post("/v1/sweeps", json=spec, headers=project.headers), 422, "validation_error"
    )
    locs = {tuple(d["loc"]) for d in error["details"]}
    # low above high is the dimension's own check; the rest come together from the sweep's
    assert ("body", "space", "train.micro_batch_size") in locs, locs
    spec["space"].pop("train.micro_batch_size")
    error = assert_error(
        client.post("/v1/sweeps", json=spec, headers=project.headers), 422, "validation_error"
    )
    by_loc = {tuple(d["loc"]): d["msg"] for d in error["details"]}
    assert "'lrr' is not a field of optim" in by_loc[("body", "space", "optim.lrr")]
    assert "not a float range" in by_loc[("body", "space", "lora.r")]
    assert "'zigzag'" in by_loc[("body", "space", "optim.schedule")]
    assert "never reports 'accuracy'" in by_loc[("body", "metric")]

    grid = sweep_spec(
        dataset["id"],
        pool,
        searcher="grid",
        space={
            "optim.lr": {"choice": [1e-4, 1e-3, 1e-2]},
            "optim.warmup_steps": {"int": [0, 10, 5]},
        },
        max_trials=8,
    )
    error = assert_error(
        client.post("/v1/sweeps", json=grid, headers=project.headers),
        422,
        "validation_error",
        ["body", "max_trials"],
    )
    assert "9 points" in error["message"]

    missing = sweep_spec("ds_0000000000000000", pool)
    assert_error(
        client.post("/v1/sweeps", json=missing, headers=project.headers),
        422,
        "validation_error",
        ["body", "base", "data", "dataset"],
    )
    listed = client.get("/v1/sweeps", headers=project.headers).json()["items"]
    assert listed == []


def test_trials_become_jobs_end_with_them_and_the_best_is_found(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    engine: Engine,
    rounds: Rounds,
) -> None:
    sweep = _create(client, project, sweep_spec(dataset["id"], pool))
    assert sweep["state"] == "running" and sweep["max_trials"] == 3 and sweep["best"] is None

    rounds.run()
    trials = _trials(client, project, sweep["id"])
    assert [t["number"] for t in trials] == [0, 1]  # max_concurrent_trials
    job_ids = [t["job_id"] for t in trials]
    assert sorted(rounds.to(pool)) == sorted((j, pool) for j in job_ids)
    with session_scope(engine) as s:
        made = [s.get(Job, j) for j in job_ids]
        for trial, job in zip(trials, made, strict=True):
            assert job is not None and job.state == JobState.QUEUED
            assert job.labels == {"sweep": str(sweep["id"]), "trial": str(trial["number"])}
            assert job.name == f"lr-{trial['number']}"
            assert job.spec.optim.lr == pytest.approx(trial["params"]["optim.lr"])
    assert len({t["params"]["optim.lr"] for t in trials}) == 2

    rounds.run()  # nothing ended: nothing new
    assert len(_trials(client, project, sweep["id"])) == 2 and len(rounds.to(pool)) == 2

    _finish(engine, job_ids[0], {10: 5.0, 20: 4.0})
    _finish(engine, job_ids[1], {10: 4.5, 20: 3.5})
    rounds.run()
    trials = _trials(client, project, sweep["id"])
    assert [(t["state"], t["value"]) for t in trials[:2]] == [
        ("succeeded", 4.0),
        ("succeeded", 3.5),
    ]
    assert len(trials) == 3 and trials[2]["state"] == "running"
    shown = client.get(f"/v1/sweeps/{sweep['id']}", headers=project.headers).json()
    assert shown["best"]["number"] == 1 and shown["best"]["value"] == 3.5
    assert shown["best"]["job_id"] == job_ids[1]
    assert shown["trials"]["succeeded"] == 2 and shown["trials"]["running"] == 1

    with session_scope(engine) as s:  # the third trial's job fails: recorded, the sweep ends
        set_running(engine, trials[2]["job_id"])
        jobs.transition(
            session=s, job_id=trials[2]["job_id"], to=JobState.FAILED, values={"error": "boom"}
        )
    rounds.run()
    shown = client.get(f"/v1/sweeps/{sweep['id']}", headers=project.headers).json()
    assert shown["state"] == "succeeded" and shown["finished_at"] is not None
    third = _trials(client, project, sweep["id"])[2]
    assert third["state"] == "failed" and third["error"] == "boom"
    assert len(rounds.to(pool)) == 3


def test_a_drawn_spec_that_does_not_validate_fails_its_trial_and_the_sweep_goes_on(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any], pool: str, rounds: Rounds
) -> None:
    base = job_spec(dataset["id"], resources={"pool": pool}, model={"n_heads": 4, "d_model": 96})
    spec = sweep_spec(
        dataset["id"],
        pool,
        base=base,
        searcher="grid",
        # each value fits the base alone; n_heads 3 with d_model 64 does not
        space={"model.n_heads": {"choice": [3, 4]}, "model.d_model": {"choice": [64, 96]}},
        max_trials=4,
        max_concurrent_trials=4,
    )
    sweep = _create(client, project, spec)
    rounds.run()
    trials = _trials(client, project, sweep["id"])
    assert len(trials) == 4
    failed = [t for t in trials if t["state"] == "failed"]
    assert [t["params"] for t in failed] == [{"model.n_heads": 3, "model.d_model": 64}]
    assert failed[0]["job_id"] is None
    assert "n_heads (3) must divide d_model (64)" in failed[0]["error"]
    assert sorted((t["params"]["model.n_heads"], t["params"]["model.d_model"]) for t in trials) == [
        (3, 64), (3, 96), (4, 64), (4, 96)
    ]  # fmt: skip
    assert all(t["job_id"] is not None for t in trials if t["state"] == "running")


def test_cancel_ends_the_sweep_and_its_trials_and_another_project_sees_404(
    client: TestClient,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    engine: Engine,
    rounds: Rounds,
) -> None:
    sweep = _create(client, project, sweep_spec(dataset["id"], pool))
    rounds.run()
    first, second = _trials(client, project, sweep["id"])
    set_running(engine, first["job_id"])

    for method, suffix in (("get", ""), ("get", "/trials"), ("post", "/cancel")):
        answer = client.request(
            method, f"/v1/sweeps/{sweep['id']}{suffix}", headers=other_project.headers
        )
        assert_error(answer, 404, "not_found")
    assert client.get("/v1/sweeps", headers=other_project.headers).json()["items"] == []

    answer = client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=project.headers)
    assert answer.status_code == 202, answer.text
    assert answer.json()["state"] == "cancelled"
    with session_scope(engine) as s:
        assert s.get(Job, first["job_id"]).state == JobState.CANCELLING  # its trainer stops
        assert s.get(Job, second["job_id"]).state == JobState.CANCELLED  # it never started
    assert_error(
        client.post(f"/v1/sweeps/{sweep['id']}/cancel", headers=project.headers), 409, "conflict"
    )

    rounds.run()
    assert [t["state"] for t in _trials(client, project, sweep["id"])] == ["running", "cancelled"]
    with session_scope(engine) as s:
        jobs.transition(session=s, job_id=first["job_id"], to=JobState.CANCELLED)
    rounds.run()
    assert [t["state"] for t in _trials(client, project, sweep["id"])] == ["cancelled", "cancelled"]
    assert len(rounds.to(pool)) == 2  # no trial started after the cancel


def test_a_sweeps_budget_stops_new_trials_and_needs_a_priced_pool(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    engine: Engine,
    settings: Settings,
) -> None:
    spec = sweep_spec(dataset["id"], pool, limits={"max_cost": 1.0}, max_concurrent_trials=1)
    assert_error(
        client.post("/v1/sweeps", json=spec, headers=project.headers),
        422,
        "validation_error",
        ["body", "limits", "max_cost"],
    )  # this server prices no pool: the cost would never accrue
    with session_factory(engine)() as s:  # as a server pricing `pool` would have made it
        sweep = sweeps.create(
            session=s,
            database_url=settings.database_url,
            project_id=project.project_id,
            spec=SweepSpec.model_validate(spec),
        )
    priced = Rounds(engine, settings, prices={pool: 3600.0})  # 1 per slot-second
    priced.run()
    (first,) = _trials(client, project, sweep.id)
    _held_a_slot(engine, first["job_id"], seconds=2)  # cost 2 > 1
    _finish(engine, first["job_id"], {10: 4.0})
    priced.run()
    shown = client.get(f"/v1/sweeps/{sweep.id}", headers=project.headers).json()
    assert [t["state"] for t in _trials(client, project, sweep.id)] == ["succeeded"]
    assert shown["state"] == "succeeded" and shown["error"] == "limits.max_cost reached"


def test_a_spent_budget_stops_the_trials_under_way_and_a_sweep_with_none_completed_failed(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    engine: Engine,
    settings: Settings,
) -> None:
    """`limits.max_cost` holds over all trials: the trials under way when it is spent stop
    (they ran on past the budget to their end before), and a sweep none of whose trials
    completed ends `failed` saying so."""
    spec = sweep_spec(dataset["id"], pool, limits={"max_cost": 1.0}, max_concurrent_trials=2)
    with session_factory(engine)() as s:  # as a server pricing `pool` would have made it
        sweep = sweeps.create(
            session=s,
            database_url=settings.database_url,
            project_id=project.project_id,
            spec=SweepSpec.model_validate(spec),
        )
    priced = Rounds(engine, settings, prices={pool: 3600.0})  # 1 per slot-second
    priced.run()
    running, waiting = _trials(client, project, sweep.id)
    set_running(engine, running["job_id"])
    _held_a_slot(engine, running["job_id"], seconds=2)  # so far: cost 2 > 1
    priced.run()
    with session_factory(engine)() as s:
        states = {j: s.get(Job, j).state for j in (running["job_id"], waiting["job_id"])}  # type: ignore[union-attr]
    assert states == {running["job_id"]: "cancelling", waiting["job_id"]: "cancelled"}
    events = client.get(f"/v1/jobs/{running['job_id']}/events", headers=project.headers).json()
    stop = next(e for e in events["items"] if e.get("state_to") == "cancelling")
    assert stop["message"] == f"sweep {sweep.id}: limits.max_cost 1 reached"
    assert stop["data"]["cause"] == "sweep_budget"

    with session_scope(engine) as s:  # its trainer checkpointed and stopped
        jobs.transition(session=s, job_id=running["job_id"], to=JobState.CANCELLED)
    priced.run()
    trials = _trials(client, project, sweep.id)
    assert [(t["state"], t["error"]) for t in trials] == [
        ("cancelled", "stopped: the sweep's limits.max_cost was reached")
    ] * 2
    shown = client.get(f"/v1/sweeps/{sweep.id}", headers=project.headers).json()
    assert shown["state"] == "failed"
    assert shown["error"] == "no trial completed (limits.max_cost reached)"
    assert len(priced.to(pool)) == 2  # no trial started once the budget was spent


def test_a_round_that_crashed_after_asking_or_after_making_the_job_is_replayed_once(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    pool: str,
    engine: Engine,
    settings: Settings,
    rounds: Rounds,
) -> None:
    """The controller can die anywhere in a round; the next round (any controller's) makes
    each trial's job once: a trial Optuna holds without a row (died after the ask) is adopted,
    and a row whose job was made but not recorded on it (died before that commit) gets the
    same job back through the trial's idempotency key, dispatched once."""
    sweep = _create(client, project, sweep_spec(dataset["id"], pool))
    spec = SweepSpec.model_validate(sweep["spec"])
    with session_factory(engine)() as s:
        name = s.get(Sweep, sweep["id"]).study_name  # type: ignore[union-attr]
    asked = study.load(settings.database_url, name, spec).ask(study.distributions(spec))
    rounds.run()  # died after the ask: trial 0 has no row until this round
    first = _trials(client, project, sweep["id"])
    assert [t["number"] for t in first] == [0, 1]  # adopted, then one more asked for
    assert first[0]["params"] == {"optim.lr": asked.params["optim.lr"]}
    assert all(t["job_id"] for t in first) and len(rounds.to(pool)) == 2

    with session_scope(engine) as s:  # died after making trial 1's job, before recording it
        row = s.get(SweepTrial, (sweep["id"], 1))
        assert row is not None
        row.job_id = None
    rounds.run()
    again = _trials(client, project, sweep["id"])
    assert [t["job_id"] for t in again] == [t["job_id"] for t in first]
    assert len(rounds.to(pool)) == 2  # nothing dispatched twice
    listed = client.get(
        "/v1/jobs", params={"label": f"sweep={sweep['id']}"}, headers=project.headers
    ).json()
    assert sorted(j["id"] for j in listed["items"]) == sorted(t["job_id"] for t in first)


def test_a_drawn_reference_the_project_may_not_use_fails_its_trial_without_a_job(
    client: TestClient,
    project: ProjectKey,
    other_project: ProjectKey,
    dataset: dict[str, Any],
    corpus_dir: Path,
    pool: str,
    rounds: Rounds,
) -> None:
    theirs = client.post(
        "/v1/datasets",
        json={"name": "theirs", "uri": str(corpus_dir)},
        headers=other_project.headers,
    ).json()["id"]
    spec = sweep_spec(
        dataset["id"],
        pool,
        searcher="grid",
        space={"data.dataset": {"choice": [dataset["id"], theirs]}},
        max_trials=2,
    )
    sweep = _create(client, project, spec)  # each id is a well-formed dataset id
    rounds.run()
    by_dataset = {t["params"]["data.dataset"]: t for t in _trials(client, project, sweep["id"])}
    assert by_dataset[dataset["id"]]["state"] == "running" and by_dataset[dataset["id"]]["job_id"]
    refused = by_dataset[theirs]
    assert refused["state"] == "failed" and refused["job_id"] is None
    assert f"no dataset {theirs!r} in this project" in refused["error"]
    assert len(rounds.to(pool)) == 1
