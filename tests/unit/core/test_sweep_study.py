"""`core.sweeps.study`: where Optuna keeps a sweep's study beside our database, and a sweep's
searcher and pruner as Optuna's."""

from __future__ import annotations

import optuna
import pytest

from core.sweeps import study
from jobspec.sweep import SweepSpec

BASE = {
    "name": "b",
    "data": {"uri": "/d"},
    "train": {"max_steps": 100},
    "eval": {"interval_steps": 10},
}


def _spec(**more: object) -> SweepSpec:
    return SweepSpec.model_validate(
        {"name": "s", "base": BASE, "space": {"optim.lr": {"log_uniform": [1e-5, 1e-2]}}, **more}
    )


def test_the_study_lives_beside_sqlite_in_a_file_and_in_its_own_postgres_schema() -> None:
    assert study.storage_url("sqlite:////srv/ty/torchyard.db") == (
        "sqlite:////srv/ty/torchyard-optuna.db",
        {},
    )
    url, kwargs = study.storage_url("postgresql+psycopg://ty:pw@db:5432/ty")
    assert url == "postgresql+psycopg://ty:pw@db:5432/ty"  # the password kept, not masked
    # its schema set per transaction (`SET LOCAL`), as PgBouncer's transaction pooling allows,
    # and no server-side prepared statements (another transaction may meet another connection)
    assert kwargs["plugins"] == ["torchyard_search_path"] and kwargs["search_path"] == "optuna"
    assert kwargs["connect_args"] == {"prepare_threshold": None}
    with pytest.raises(ValueError, match="in-memory"):
        study.storage_url("sqlite://")


def test_each_dimension_becomes_its_optuna_distribution() -> None:
    spec = _spec(
        space={
            "optim.lr": {"log_uniform": [1e-5, 1e-2]},
            "optim.weight_decay": {"uniform": [0.0, 0.2]},
            "optim.warmup_steps": {"int": [0, 10, 4]},  # 0, 4, 8: the last reachable is 8
            "optim.schedule": {"choice": ["cosine", "linear"]},
        }
    )
    dists = study.distributions(spec)
    assert dists["optim.lr"] == optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)
    assert dists["optim.weight_decay"] == optuna.distributions.FloatDistribution(0.0, 0.2)
    assert dists["optim.warmup_steps"] == optuna.distributions.IntDistribution(0, 8, step=4)
    assert dists["optim.schedule"] == optuna.distributions.CategoricalDistribution(
        ["cosine", "linear"]
    )


def test_samplers_move_their_seed_with_the_trials_so_asks_do_not_repeat() -> None:
    spec = _spec(searcher="random", seed=5)
    one = optuna.create_study(sampler=study.sampler(spec, 0))
    two = optuna.create_study(sampler=study.sampler(spec, 0))
    later = optuna.create_study(sampler=study.sampler(spec, 1))
    dists = study.distributions(spec)
    first = one.ask(dists).params
    assert two.ask(dists).params == first  # the same sweep draws the same values
    assert later.ask(dists).params != first
    assert isinstance(study.sampler(_spec(), 0), optuna.samplers.TPESampler)


def test_pruners_and_the_grid_size() -> None:
    asha = study.pruner(_spec(pruner={"kind": "asha", "min_resource": 5, "reduction_factor": 2}))
    assert isinstance(asha, optuna.pruners.SuccessiveHalvingPruner)
    assert isinstance(study.pruner(_spec(pruner={"kind": "median"})), optuna.pruners.MedianPruner)
    assert isinstance(study.pruner(_spec()), optuna.pruners.NopPruner)
    grid = _spec(searcher="grid", space={"optim.lr": {"choice": [1e-3, 1e-2]}}, max_trials=10)
    assert study.max_trials(grid) == 2 and study.max_trials(_spec(max_trials=7)) == 7
