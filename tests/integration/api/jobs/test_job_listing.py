"""`GET /v1/jobs` sorted and filtered by label, paged by keyset cursors (what the dashboard's
jobs table asks for)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, job_spec, submit


def _walk(client: TestClient, project: ProjectKey, **params: Any) -> list[dict[str, Any]]:
    """Every job of the listing, following `next_cursor` two at a time."""
    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {**params, "limit": 2, **({"cursor": cursor} if cursor else {})}
        answer = client.get("/v1/jobs", params=query, headers=project.headers)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen


def test_every_sort_order_pages_through_all_jobs_once_ties_broken_by_id(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    names = ["delta", "alpha", "charlie", "alpha", "bravo"]
    made = [submit(client, project, job_spec(dataset["id"], name=n)) for n in names]
    client.post(f"/v1/jobs/{made[2]['id']}/cancel", headers=project.headers)
    by_name = sorted(made, key=lambda j: (j["name"], j["id"]))
    assert [j["id"] for j in _walk(client, project, sort="name")] == [j["id"] for j in by_name]
    assert [j["id"] for j in _walk(client, project, sort="-name")] == [
        j["id"] for j in reversed(by_name)
    ]
    assert [j["id"] for j in _walk(client, project, sort="created")] == [j["id"] for j in made]
    by_state = _walk(client, project, sort="state")
    assert [j["state"] for j in by_state] == ["cancelled"] + ["queued"] * 4


def test_label_filters_must_all_match(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    nlp = submit(client, project, job_spec(dataset["id"], labels={"team": "nlp", "tier": "a"}))
    nlp_b = submit(client, project, job_spec(dataset["id"], labels={"team": "nlp", "tier": "b"}))
    odd = submit(client, project, job_spec(dataset["id"], labels={'a.b"c': "x y"}))
    submit(client, project, job_spec(dataset["id"], labels={"team": "vision"}))

    def ids(*labels: str) -> list[int]:
        return [j["id"] for j in _walk(client, project, label=list(labels))]

    assert ids("team=nlp") == [nlp_b["id"], nlp["id"]]
    assert ids("team=nlp", "tier=a") == [nlp["id"]]
    assert ids("team=a=b") == []  # the value is everything after the first "="
    assert ids("nope=x") == []
    assert ids('a.b"c=x y') == [odd["id"]]  # any key: dots and quotes are no path syntax


def test_bad_labels_sorts_and_cursors_are_422(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    for _ in range(3):
        submit(client, project, job_spec(dataset["id"]))
    get = client.get
    headers = project.headers
    assert_error(get("/v1/jobs?label=team", headers=headers), 422, "validation_error",
                 ["query", "label", 0])  # fmt: skip
    assert_error(get("/v1/jobs?sort=loss", headers=headers), 422, "validation_error",
                 ["query", "sort"])  # fmt: skip
    by_name = get("/v1/jobs", params={"sort": "name", "limit": 1}, headers=headers).json()
    other_sort = {"sort": "-created", "cursor": by_name["next_cursor"]}
    assert_error(get("/v1/jobs", params=other_sort, headers=headers), 422, "validation_error",
                 ["query", "cursor"])  # fmt: skip
    forged = by_name["next_cursor"][:-4] + "AAAA"
    answer = get("/v1/jobs", params={"sort": "name", "cursor": forged}, headers=headers)
    assert answer.status_code == 422, answer.text


def test_a_job_names_the_api_key_that_submitted_it_as_its_owner(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    key_name = client.get("/v1/me", headers=project.headers).json()["key"]["name"]
    job = submit(client, project, job_spec(dataset["id"]))
    assert job["owner"] == key_name
    listed = client.get("/v1/jobs", headers=project.headers).json()["items"]
    assert [j["owner"] for j in listed] == [key_name]
