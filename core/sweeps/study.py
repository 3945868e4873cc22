"""The Optuna glue: where studies are stored, and a sweep's searcher and pruner as Optuna's.

Optuna (`optuna.storages.RDBStorage`) keeps every study in our own database, so the API, the
controller and every worker ask and tell the same study: on Postgres in a schema of its own,
`optuna` (migration 0019; Optuna's tables include an `alembic_version` of its own), on SQLite
in a file beside the database (`<name>-optuna.db`). Optuna creates its tables on first use.
Optuna's engine puts its schema first on the search path at the start of each transaction
(`SET LOCAL`, the `SearchPath` engine plugin), not for the connection's life (libpq's
`options`): behind PgBouncer in transaction pooling (README's Deployment) each transaction may
run on another server connection, and PgBouncer refuses `options` at connect.

Optuna is imported inside the functions: the API imports this module, and a process that never
touches a sweep does not pay for it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, event
from sqlalchemy.dialects import plugins
from sqlalchemy.engine import URL, CreateEnginePlugin, make_url

from core.platform import db
from jobspec.sweep import Dimension, SweepSpec, grid_size

if TYPE_CHECKING:
    import optuna

SCHEMA = "optuna"
_storages: dict[str, Any] = {}
_lock = threading.Lock()


class SearchPath(CreateEnginePlugin):
    """An engine plugin (SQLAlchemy's `CreateEnginePlugin`, named `torchyard_search_path`): the
    engine's every transaction starts with `SET LOCAL search_path TO <schema>`, the schema
    given as the `search_path` argument of `create_engine`. Optuna makes its engine itself
    (and queries through it before returning), so its arguments are the only way in."""

    def __init__(self, url: URL, kwargs: dict[str, Any]) -> None:
        super().__init__(url, kwargs)
        self.schema = str(kwargs.pop("search_path"))

    def update_url(self, url: URL) -> URL:
        return url  # nothing of the plugin's is in the URL

    def engine_created(self, engine: Engine) -> None:
        statement = f'SET LOCAL search_path TO "{self.schema}"'

        @event.listens_for(engine, "begin")
        def _search_path(conn) -> None:  # type: ignore[no-untyped-def]
            conn.exec_driver_sql(statement)


plugins.register("torchyard_search_path", __name__, "SearchPath")


def storage_url(database_url: str) -> tuple[str, dict[str, Any]]:
    """The URL and engine arguments of the Optuna storage beside `database_url`."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database in ("", ":memory:"):
            raise ValueError("sweeps need a file or server database, not an in-memory SQLite")
        stem = database[:-3] if database.endswith(".db") else database
        return url.set(database=f"{stem}-optuna.db").render_as_string(hide_password=False), {}
    return (
        url.render_as_string(hide_password=False),
        {
            "plugins": ["torchyard_search_path"],
            "search_path": SCHEMA,
            "connect_args": db.connect_args(database_url),  # as `make_engine`'s: none prepared
            "pool_pre_ping": True,
        },
    )


def storage(database_url: str) -> optuna.storages.RDBStorage:
    """This process's Optuna storage for `database_url` (one engine, made on first use)."""
    with _lock:
        found = _storages.get(database_url)
        if found is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            url, engine_kwargs = storage_url(database_url)
            found = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
            _storages[database_url] = found
        return found


def study_name(sweep_id: int) -> str:
    return f"torchyard-sweep-{sweep_id}"


def distributions(spec: SweepSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    """Each dimension as an Optuna distribution (grid: the values as categorical choices)."""
    return {
        path: _distribution(dim, grid=spec.searcher == "grid") for path, dim in spec.space.items()
    }


def _distribution(dim: Dimension, *, grid: bool) -> optuna.distributions.BaseDistribution:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    values = dim.grid_values()
    if grid or dim.choice is not None:
        assert values is not None
        return CategoricalDistribution(values)
    if dim.int is not None:
        step = dim.int[2] if len(dim.int) == 3 else 1
        last = dim.int[1] - (dim.int[1] - dim.int[0]) % step  # the last value a step reaches
        return IntDistribution(dim.int[0], last, step=step)
    if dim.log_uniform is not None:
        return FloatDistribution(dim.log_uniform[0], dim.log_uniform[1], log=True)
    assert dim.uniform is not None
    return FloatDistribution(dim.uniform[0], dim.uniform[1])


def sampler(spec: SweepSpec, trials_so_far: int) -> optuna.samplers.BaseSampler:
    """The searcher for the next `ask`. Samplers are made afresh for each ask (any process may
    ask), so the seed moves with the trials already asked: the same sweep draws the same values
    in the same order, and no two asks repeat one random state."""
    import optuna

    seed = spec.seed + trials_so_far
    if spec.searcher == "grid":
        return optuna.samplers.GridSampler(spec.grid(), seed=spec.seed)
    if spec.searcher == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    import optuna

    p = spec.pruner
    if p.kind == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=p.min_resource if p.min_resource is not None else "auto",
            reduction_factor=p.reduction_factor,
        )
    if p.kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup
        )
    return optuna.pruners.NopPruner()


def create(database_url: str, name: str, spec: SweepSpec) -> None:
    """Create the study `name` (a second call for the same name is an error of Optuna's)."""
    import optuna

    optuna.create_study(
        study_name=name,
        storage=storage(database_url),
        direction=spec.direction,
        sampler=sampler(spec, 0),
        pruner=pruner(spec),
    )


def load(database_url: str, name: str, spec: SweepSpec, trials_so_far: int = 0) -> optuna.Study:
    import optuna

    return optuna.load_study(
        study_name=name,
        storage=storage(database_url),
        sampler=sampler(spec, trials_so_far),
        pruner=pruner(spec),
    )


def max_trials(spec: SweepSpec) -> int:
    """Trials the sweep runs in all: `max_trials`, or the grid's size when smaller."""
    if spec.searcher == "grid":
        return min(spec.max_trials, grid_size(spec))
    return spec.max_trials
