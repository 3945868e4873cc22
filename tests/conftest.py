"""Shared fixtures: a real Postgres database (migrated) and a real Redis, one per test session.

`TORCHYARD_TEST_POSTGRES` (default postgresql+psycopg://postgres@127.0.0.1:5432/postgres) is
the server to create a throw-away database on; `TORCHYARD_TEST_REDIS` (default
redis://127.0.0.1:6379) the Redis to use (a database number claimed per session, flushed).
`.ci/run` starts both when absent.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from core.access import auth
from core.platform.db import make_engine, session_scope, upgrade
from core.platform.settings import Settings

PG_ADMIN_URL = os.environ.get(
    "TORCHYARD_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("TORCHYARD_TEST_REDIS", "redis://127.0.0.1:6379")
REPO_ROOT = Path(__file__).resolve().parent.parent


CPU_LOG = os.environ.get("TORCHYARD_TEST_CPU_LOG")
"""A file to append each test's CPU seconds to (`{"test", "cpu_s", "wall_s"}` per line): the
test process's and that of the subprocesses it reaped (torchrun and its ranks, Celery workers,
uvicorn, Chromium; not Postgres or Redis). Setup and teardown count, so a module's servers
count in the test that starts or stops them. Unset: nothing is measured."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if CPU_LOG is None:
        yield
        return
    before = os.times()
    yield
    after = os.times()
    cpu = sum(after[:4]) - sum(before[:4])  # user, system, children's user, children's system
    line = {"test": item.nodeid, "cpu_s": round(cpu, 2), "wall_s": round(after[4] - before[4], 2)}
    with open(CPU_LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `cuda` tests (tests/cuda/) run only where `-m` names them (`pytest -m cuda` on a GPU
    host, bench/gpu_round2.sh): deselected otherwise, as a `-m "not cuda"` would, never
    skipped (issue 50)."""
    if "cuda" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker("cuda") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = kept
    longest_modules_first(items)


MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")
"""Each module's seconds in a recent full run (setup, calls, teardown on a 4-worker run):
`--dist loadfile` hands out modules in collection order, so the suite starts the longest first
(longest processing time first, the classic bound for scheduling on identical workers) and its
short modules fill the gaps at the end, instead of a 5-minute module starting last. Refresh it
from a full run's `.test-module-seconds.json` (scripts/test.sh writes it). The order reaches
the workers only with xdist's `--no-loadscope-reorder` (`TORCHYARD_TEST_LONGEST_FIRST=1`)."""
MODULE_SECONDS_OUT = os.environ.get("TORCHYARD_TEST_MODULE_SECONDS")


def longest_modules_first(items: list[pytest.Item]) -> None:
    """Order `items` by their module's seconds in `MODULE_SECONDS`, longest first; a module not
    in it (new) goes first, as if the longest. A stable sort: pytest-randomly's shuffle of the
    tests inside each module, and of modules of equal weight, stays."""
    seconds: dict[str, float] = json.loads(MODULE_SECONDS.read_text())
    unknown = max(seconds.values(), default=0.0) + 1.0
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], unknown))


NO_SKIPS = os.environ.get("TORCHYARD_TEST_NO_SKIPS") == "1"
"""Set by scripts/test.sh (so `.ci/run`): any skipped test fails the run, each named with its
reason (issue 44). What a host must give the suite is checked before it starts
(`tests.support.capabilities`); deselecting (`-m`, `-k`, paths) is no skip."""
_SKIPPED: list[str] = []
_MODULE_S: dict[str, float] = {}
"""Seconds per test module (setup, call and teardown of its tests), for the summary: with
`--dist loadfile` the suite's wall time is set by its slowest modules, so each run says which."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember every skipped test and each module's seconds (on the xdist controller too,
    which gets each report)."""
    module = report.nodeid.split("::")[0]
    _MODULE_S[module] = _MODULE_S.get(module, 0.0) + report.duration
    if report.skipped and not hasattr(report, "wasxfail"):
        where = report.nodeid
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _SKIPPED.append(f"{where}: {reason}")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if hasattr(terminalreporter.config, "workerinput"):
        return
    from tests.support import figures

    measured = figures.read(figures.FIGURES) if figures.FIGURES else []
    if measured:
        terminalreporter.section("latency figures (measured / goal; the suite asserts 3x)")
        for f in measured:
            met = "met" if f["met"] else "MISSED"
            terminalreporter.write_line(
                f"{f['figure']}: {f['value_s']:.1f} s / {f['goal_s']:.0f} s {met} ({f['test']})"
            )
    if len(_MODULE_S) > 1:
        terminalreporter.section("slowest modules (seconds, setup + tests + teardown)")
        for module, seconds in sorted(_MODULE_S.items(), key=lambda m: -m[1])[:25]:
            terminalreporter.write_line(f"{seconds:7.1f}  {module}")
    if not _SKIPPED:
        terminalreporter.write_line("skips: none (every selected test ran)")
        return
    terminalreporter.section("skipped tests (each is a capability this run did not test)")
    for line in sorted(set(_SKIPPED)):
        terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    if NO_SKIPS and _SKIPPED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if MODULE_SECONDS_OUT and len(_MODULE_S) > 1:
        table = {m: round(s, 1) for m, s in sorted(_MODULE_S.items(), key=lambda m: -m[1])}
        Path(MODULE_SECONDS_OUT).write_text(json.dumps(table, indent=0) + "\n")


@pytest.fixture(scope="session", autouse=True)
def row_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The trainer's row cache (`TORCHYARD_CACHE_DIR`) in a directory of this session, for
    in-process runs and the `python -m trainer` processes the tests start (not the user's
    ~/.cache); workers pass their own `--cache-dir`."""
    path = tmp_path_factory.mktemp("row_cache")
    previous = os.environ.get("TORCHYARD_CACHE_DIR")
    os.environ["TORCHYARD_CACHE_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("TORCHYARD_CACHE_DIR", None)
    else:
        os.environ["TORCHYARD_CACHE_DIR"] = previous


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a freshly created, migrated Postgres database, dropped at exit."""
    name = f"torchyard_test_{secrets.token_hex(4)}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A freshly created, migrated Postgres database, dropped after the session."""
    with fresh_database() as url:
        yield url


_REDIS_DATABASES = range(15, 0, -1)  # 0 holds only the claims below; Redis has 16 by default
_REDIS_CLAIM_TTL_S = 6 * 3600  # a killed session's claim expires; no suite runs this long


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis database number of its own for this session, flushed before and after.

    Sessions running at once (pytest-xdist workers, or suites of several checkouts) each claim a
    number with `SET NX` on a key in database 0, so no two of them share (and flush) one.
    """
    import redis

    token = secrets.token_hex(8)
    admin = redis.Redis.from_url(f"{REDIS_URL}/0")
    claim = next(
        (
            f"torchyard-test:db:{db}"
            for db in _REDIS_DATABASES
            if admin.set(f"torchyard-test:db:{db}", token, nx=True, ex=_REDIS_CLAIM_TTL_S)
        ),
        None,
    )  # a generator: it stops at the first number claimed
    if claim is None:
        pytest.fail(f"all Redis databases {list(_REDIS_DATABASES)} are claimed by other sessions")
    url = f"{REDIS_URL}/{claim.rsplit(':', 1)[1]}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()
    if admin.get(claim) == token.encode():
        admin.delete(claim)
    admin.close()


@pytest.fixture(scope="session")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An allowed data root for model directories (`model.hf.path_or_id`) tests write."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def settings(
    postgres_url: str,
    redis_url: str,
    corpus_dir: Path,
    models_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Settings:
    """Settings for a production-shaped deployment: Postgres, Redis, local storage.

    `corpus_dir` is an allowed data root, so tests can register it as a dataset; so is
    `models_root`, for Hugging Face model directories.
    """
    home = tmp_path_factory.mktemp("torchyard_home")
    return Settings(
        env="test",
        home=home,
        database_url=postgres_url,
        broker_url=redis_url,
        storage_url=str(home / "storage"),
        heartbeat_interval_s=1.0,
        ingest_interval_s=0.2,
        sys_metrics_interval_s=1.0,
        cancel_grace_s=5.0,
        data_roots=[str(corpus_dir), str(models_root)],
        # tests drive core.webhooks.delivery.deliver_due themselves (tests/integration/webhooks)
        webhook_deliver_in_api=False,
        # Every worker of the suite sandboxes its jobs or fails its test: `auto` would run them
        # unsandboxed, and green, on a host that cannot (issue 44). The tests of `none` and
        # `auto` set theirs.
        sandbox="bwrap",
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment variables that make a subprocess see `settings`."""
    return {
        **os.environ,
        "TORCHYARD_ENV": settings.env,
        "TORCHYARD_HOME": str(settings.home),
        "TORCHYARD_DATABASE_URL": settings.database_url,
        "TORCHYARD_BROKER_URL": settings.broker_url,
        "TORCHYARD_STORAGE_URL": settings.storage_url,
        "TORCHYARD_HEARTBEAT_INTERVAL_S": str(settings.heartbeat_interval_s),
        "TORCHYARD_INGEST_INTERVAL_S": str(settings.ingest_interval_s),
        "TORCHYARD_SYS_METRICS_INTERVAL_S": str(settings.sys_metrics_interval_s),
        "TORCHYARD_CANCEL_GRACE_S": str(settings.cancel_grace_s),
        "TORCHYARD_DATA_ROOTS": json.dumps(settings.data_roots),
        "TORCHYARD_WEBHOOK_DELIVER_IN_API": str(settings.webhook_deliver_in_api).lower(),
        "TORCHYARD_SANDBOX": settings.sandbox,
        "PYTHONPATH": str(REPO_ROOT),
    }


@pytest.fixture(scope="session")
def engine(settings: Settings) -> Iterator[Engine]:
    eng = make_engine(settings.database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as s:
        yield s


@dataclass(frozen=True)
class ProjectKey:
    project_id: str
    project_name: str
    api_key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


def make_project(engine: Engine, name: str | None = None) -> ProjectKey:
    name = name or f"proj-{secrets.token_hex(4)}"
    with session_scope(engine) as s:
        project = auth.create_project(session=s, name=name)
        key = auth.create_api_key(session=s, project_id=project.id)
    return ProjectKey(project_id=project.id, project_name=name, api_key=key)


@pytest.fixture
def project(engine: Engine) -> ProjectKey:
    """A new project with one API key."""
    return make_project(engine)


@pytest.fixture
def other_project(engine: Engine) -> ProjectKey:
    """A second project, for isolation tests."""
    return make_project(engine)


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real corpus: a few hundred KB of the Python standard library's own source."""
    from tests.support.training import stdlib_corpus

    return stdlib_corpus(tmp_path_factory.mktemp("corpus"))
