"""`GET /v1/usage` and each job's `usage`: slot-seconds, CPU-seconds and cost from `job_nodes`
rows made at known times, cut at UTC midnight, as JSON and CSV, one project's only; and
`limits.max_cost` refused on a pool without a price."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.platform.settings import Settings
from core.platform.tables import JobState
from core.usage.accounting import month_start
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, job_spec
from tests.integration.usage_rows import make_job

PRICES = {"gpu-a": 2.0, "gpu-b": 3.0}
MARCH = {"since": "2026-03-01T00:00:00Z", "until": "2026-04-01T00:00:00Z"}


@pytest.fixture(scope="module")
def priced(settings: Settings) -> Iterator[TestClient]:
    """A client of an app whose pools `gpu-a` and `gpu-b` cost 2 and 3 EUR per slot-hour."""
    app = create_app(settings.model_copy(update={"slot_prices": PRICES, "currency": "EUR"}))
    with TestClient(app, raise_server_exceptions=True) as client:
        yield client


def _at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def two_jobs(engine: Engine, project: ProjectKey) -> tuple[int, int]:
    """Job A: 2 slots on gpu-a from 23:00 on March 10th to 01:00 on the 11th, 720 CPU-s.
    Job B on gpu-b: attempt 1 one slot 10:00-10:30 (100 CPU-s); attempt 2 two nodes of one
    slot 11:00-12:00 on the 11th (50 CPU-s each)."""
    a = make_job(engine, project, "gpu-a", [(1, _at(10, 23), _at(11, 1), 2, 720.0)])
    b = make_job(
        engine,
        project,
        "gpu-b",
        [
            (1, _at(11, 10), _at(11, 10, 30), 1, 100.0),
            (2, _at(11, 11), _at(11, 12), 1, 50.0),
            (2, _at(11, 11), _at(11, 12), 1, 50.0),
        ],
    )
    return a, b


def usage(client: TestClient, project: ProjectKey, **params: str) -> dict[str, Any]:
    answer = client.get("/v1/usage", params=params, headers=project.headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    return dict(answer.json())


def _totals(row: dict[str, Any]) -> tuple[float, float, float]:
    return row["slot_seconds"], row["cpu_seconds"], row["cost"]


def test_days_are_cut_at_utc_midnight_with_exact_slot_cpu_seconds_and_cost(
    priced: TestClient, project: ProjectKey, two_jobs: tuple[int, int]
) -> None:
    body = usage(priced, project, **MARCH, group_by="day")
    assert body["group_by"] == "day" and body["currency"] == "EUR"
    assert body["since"] == "2026-03-01T00:00:00Z" and body["until"] == "2026-04-01T00:00:00Z"
    assert [(r["day"], *_totals(r)) for r in body["rows"]] == [
        ("2026-03-10", 7200.0, 360.0, 4.0),  # A's first hour: 2 slots x 3600 s at 2/h
        ("2026-03-11", 7200.0 + 9000.0, 360.0 + 200.0, 4.0 + 7.5),
    ]
    assert _totals(body["total"]) == (23400.0, 920.0, 15.5)


def test_pools_and_jobs_add_up_every_attempt_and_node(
    priced: TestClient, project: ProjectKey, two_jobs: tuple[int, int]
) -> None:
    a, b = two_jobs
    pools = usage(priced, project, **MARCH, group_by="pool")["rows"]
    assert [(r["pool"], *_totals(r)) for r in pools] == [
        ("gpu-a", 14400.0, 720.0, 8.0),
        ("gpu-b", 9000.0, 200.0, 7.5),
    ]
    jobs = usage(priced, project, **MARCH, group_by="job")["rows"]
    assert [(r["job_id"], r["job_name"], r["pool"], *_totals(r)) for r in jobs] == [
        (a, "job-gpu-a", "gpu-a", 14400.0, 720.0, 8.0),
        (b, "job-gpu-b", "gpu-b", 9000.0, 200.0, 7.5),
    ]
    shown = priced.get(f"/v1/jobs/{b}", headers=project.headers).json()
    assert shown["usage"] == {"slot_seconds": 9000.0, "cpu_seconds": 200.0, "cost": 7.5}


def test_a_report_names_the_pools_used_without_a_price(
    priced: TestClient, project: ProjectKey, two_jobs: tuple[int, int], engine: Engine
) -> None:
    """Issue 28, item 7: slot-hours on a pool with no price cost 0, and the report says which
    pools those are, so a page can say why instead of charting a cost of zero."""
    assert usage(priced, project, **MARCH)["unpriced_pools"] == []
    make_job(engine, project, "cpu-free", [(1, _at(12, 9), _at(12, 10), 4, 60.0)])
    make_job(engine, project, "another-free", [(1, _at(12, 9), _at(12, 9, 30), 1, 6.0)])
    body = usage(priced, project, **MARCH, group_by="pool")
    assert body["unpriced_pools"] == ["another-free", "cpu-free"]
    free = next(r for r in body["rows"] if r["pool"] == "cpu-free")
    assert _totals(free) == (14400.0, 60.0, 0.0)
    april = usage(priced, project, since="2026-04-01T00:00:00Z", until="2026-05-01T00:00:00Z")
    assert april["unpriced_pools"] == []  # no usage in the window: nothing to say


def test_a_window_counts_only_its_part_of_a_node(
    priced: TestClient, project: ProjectKey, two_jobs: tuple[int, int]
) -> None:
    body = usage(priced, project, since="2026-03-11T00:00:00", until="2026-03-11T00:30:00")
    assert [(r["day"], *_totals(r)) for r in body["rows"]] == [("2026-03-11", 3600.0, 180.0, 2.0)]


def test_csv_has_a_header_row_and_one_line_per_group(
    priced: TestClient, project: ProjectKey, two_jobs: tuple[int, int]
) -> None:
    by_query = priced.get(
        "/v1/usage", params={**MARCH, "group_by": "pool", "format": "csv"}, headers=project.headers
    )
    by_accept = priced.get(
        "/v1/usage",
        params={**MARCH, "group_by": "pool"},
        headers={**project.headers, "Accept": "text/csv"},
    )
    for answer in (by_query, by_accept):
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/csv")
        assert list(csv.reader(io.StringIO(answer.text))) == [
            ["pool", "slot_seconds", "cpu_seconds", "cost", "currency"],
            ["gpu-a", "14400.0", "720.0", "8.0", "EUR"],
            ["gpu-b", "9000.0", "200.0", "7.5", "EUR"],
        ]
    jobs = priced.get(
        "/v1/usage", params={**MARCH, "group_by": "job", "format": "csv"}, headers=project.headers
    )
    rows = list(csv.DictReader(io.StringIO(jobs.text)))
    assert [(r["job_name"], r["pool"], r["cost"]) for r in rows] == [
        ("job-gpu-a", "gpu-a", "8.0"),
        ("job-gpu-b", "gpu-b", "7.5"),
    ]


def test_another_projects_usage_is_never_counted(
    priced: TestClient,
    engine: Engine,
    project: ProjectKey,
    other_project: ProjectKey,
    two_jobs: tuple[int, int],
) -> None:
    theirs = make_job(engine, other_project, "gpu-a", [(1, _at(11, 0), _at(11, 5), 8, 9.0)])
    mine = usage(priced, project, **MARCH, group_by="job")
    assert theirs not in {r["job_id"] for r in mine["rows"]}
    assert _totals(mine["total"]) == (23400.0, 920.0, 15.5)
    other = usage(priced, other_project, **MARCH, group_by="job")
    assert [r["job_id"] for r in other["rows"]] == [theirs]
    assert _totals(other["total"]) == (8 * 5 * 3600.0, 9.0, 8 * 5 * 2.0)
    a, _ = two_jobs
    assert priced.get(f"/v1/jobs/{a}", headers=other_project.headers).status_code == 404


def test_the_default_window_is_this_calendar_month_and_a_running_node_counts_to_now(
    priced: TestClient, engine: Engine, project: ProjectKey
) -> None:
    start = month_start()
    now = datetime.now(UTC)
    ended = start + (now - start) / 2
    make_job(engine, project, "gpu-a", [(1, start - timedelta(days=1), ended, 3, 0.0)])
    body = usage(priced, project, group_by="pool")
    assert body["since"] == start.isoformat().replace("+00:00", "Z")
    assert body["total"]["slot_seconds"] == pytest.approx((ended - start).total_seconds() * 3)
    running = make_job(engine, project, "gpu-b", [(1, now - timedelta(minutes=10), None, 2, 5.0)])
    shown = priced.get(f"/v1/jobs/{running}", headers=project.headers).json()["usage"]
    assert shown["slot_seconds"] >= 2 * 600.0
    assert shown["cpu_seconds"] == 5.0


def test_a_node_whose_attempt_ended_without_its_end_counts_until_its_last_heartbeat(
    priced: TestClient, engine: Engine, project: ProjectKey
) -> None:
    """A node that never recorded its end (its attempt failed before launch, its worker was
    lost) is not running: it held its slots from joining to its last heartbeat."""
    failed = make_job(
        engine,
        project,
        "gpu-a",
        [(1, _at(12, 8), None, 2, 0.0)],
        state=JobState.FAILED,
        heartbeat_at=_at(12, 8, 30),
    )
    superseded = make_job(
        engine,
        project,
        "gpu-a",
        [(1, _at(12, 9), None, 1, 0.0), (2, _at(12, 10), _at(12, 11), 1, 0.0)],
        state=JobState.SUCCEEDED,
    )  # attempt 1 never beat: it counts nothing
    rows = usage(priced, project, **MARCH, group_by="job")["rows"]
    assert [(r["job_id"], r["slot_seconds"]) for r in rows] == [
        (failed, 2 * 1800.0),
        (superseded, 3600.0),
    ]


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"group_by": "week"}, ["query", "group_by"]),
        ({"format": "xml"}, ["query", "format"]),
        ({"since": "yesterday"}, ["query", "since"]),
        ({"since": "2026-03-02T00:00:00Z", "until": "2026-03-01T00:00:00Z"}, ["query", "until"]),
        ({"since": "2026-03-01T00:00:00Z", "until": "2026-03-01T00:00:00Z"}, ["query", "until"]),
        ({"since": "2024-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, ["query", "until"]),
        ({"since": "0001-01-01T00:00:00+01:00"}, ["query", "since"]),
        (
            {"since": "9999-12-31T00:00:00Z", "until": "9999-12-31T23:00:00-01:00"},
            ["query", "until"],
        ),
    ],
)
def test_bad_parameters_are_a_422_naming_the_parameter(
    priced: TestClient, project: ProjectKey, params: dict[str, str], loc: list[str]
) -> None:
    answer = priced.get("/v1/usage", params=params, headers=project.headers)
    assert_error(answer, 422, "validation_error", loc)


def test_usage_needs_a_key(priced: TestClient) -> None:
    assert priced.get("/v1/usage").status_code == 401


def test_max_cost_on_a_pool_without_a_price_is_refused_naming_the_field(
    priced: TestClient, project: ProjectKey, dataset_on_priced: str
) -> None:
    spec = job_spec(dataset_on_priced, limits={"max_cost": 1.5}, resources={"pool": "free"})
    for path in ("/v1/jobs", "/v1/spec/validate"):
        answer = priced.post(path, json=spec, headers=project.headers)
        assert_error(answer, 422, "validation_error", ["body", "limits", "max_cost"])
    spec["resources"] = {"pool": "gpu-a"}
    answer = priced.post("/v1/spec/validate", json=spec, headers=project.headers)
    assert answer.status_code == 200, answer.text


@pytest.fixture
def dataset_on_priced(priced: TestClient, project: ProjectKey, corpus_dir: Any) -> str:
    answer = priced.post(
        "/v1/datasets", json={"name": "corpus", "uri": str(corpus_dir)}, headers=project.headers
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])
