"""``torchyard usage`` against a real API server whose pool `gpu-a` has a price: the table,
``--json``, ``--csv`` and a bad ``--since``; ``torchyard show`` prints the job's usage."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from core.platform.settings import Settings
from tests.conftest import ProjectKey, settings_env
from tests.integration.conftest import cli_invoker, serve_api
from tests.integration.usage_rows import make_job

WINDOW = ["--since", "2026-03-01", "--until", "2026-04-01"]


@pytest.fixture(scope="module")
def priced_api(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real API server (uvicorn) where a slot-hour of pool `gpu-a` costs 2 EUR."""
    env = {
        **settings_env(settings),
        "TORCHYARD_SLOT_PRICES": json.dumps({"gpu-a": 2.0}),
        "TORCHYARD_CURRENCY": "EUR",
    }
    with serve_api(env, tmp_path_factory.mktemp("priced_api")) as base_url:
        yield base_url


@pytest.fixture
def cli(priced_api: str, project: ProjectKey, tmp_path: Path) -> Any:
    return cli_invoker(priced_api, project.api_key, tmp_path, COLUMNS="200")


@pytest.fixture
def job_id(engine: Engine, project: ProjectKey) -> int:
    """3 slots on gpu-a for two hours over midnight, March 10th to 11th: 12 EUR, 1800 CPU-s."""
    start = datetime(2026, 3, 10, 23, tzinfo=UTC)
    end = datetime(2026, 3, 11, 1, tzinfo=UTC)
    return make_job(engine, project, "gpu-a", [(1, start, end, 3, 1800.0)])


def test_usage_prints_a_table_per_day_with_hours_cost_and_total(cli: Any, job_id: int) -> None:
    result = cli("usage", *WINDOW)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    day10 = next(line for line in lines if "2026-03-10" in line)
    assert day10.split() == ["2026-03-10", "3.00", "0.25", "6.00"]
    assert "COST (EUR)" in result.stdout
    total = next(line for line in lines if line.strip().startswith("total"))
    assert total.split() == ["total", "6.00", "0.50", "12.00"]


def test_usage_says_which_pools_have_no_price_and_what_a_slot_hour_is(
    cli: Any, job_id: int, engine: Engine, project: ProjectKey
) -> None:
    priced_only = cli("usage", *WINDOW)
    assert "no price set" not in priced_only.stdout
    assert "slot-hours: devices (GPUs, or CPU slots) x hours held" in priced_only.stdout
    start = datetime(2026, 3, 12, 9, tzinfo=UTC)
    make_job(engine, project, "cpu-free", [(1, start, start + timedelta(hours=1), 1, 5.0)])
    result = cli("usage", *WINDOW)
    assert result.exit_code == 0, result.output
    assert (
        "no price set for pool cpu-free (TORCHYARD_SLOT_PRICES): their slot-hours cost 0"
        in " ".join(result.stdout.split())
    )


def test_usage_json_and_csv_by_job(cli: Any, job_id: int) -> None:
    as_json = cli("usage", *WINDOW, "--by", "job", "--json")
    assert as_json.exit_code == 0, as_json.output
    report = json.loads(as_json.stdout)
    assert report["currency"] == "EUR"
    assert [(r["job_id"], r["cost"]) for r in report["rows"]] == [(job_id, 12.0)]
    as_csv = cli("usage", *WINDOW, "--by", "job", "--csv")
    assert as_csv.exit_code == 0, as_csv.output
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [(r["job_id"], r["slot_seconds"], r["cpu_seconds"], r["cost"]) for r in rows] == [
        (str(job_id), "21600.0", "1800.0", "12.0")
    ]


def test_show_prints_the_jobs_usage(cli: Any, job_id: int) -> None:
    result = cli("show", str(job_id))
    assert result.exit_code == 0, result.output
    assert "6.00 slot-hours, 0.50 CPU-hours, cost 12.00" in result.stdout


def test_a_bad_window_exits_1_naming_the_option(cli: Any) -> None:
    result = cli("usage", "--since", "last tuesday")
    assert result.exit_code == 1
    assert "since" in result.stderr
    bad_by = cli("usage", "--by", "week")
    assert bad_by.exit_code == 2 and "--by" in bad_by.output
