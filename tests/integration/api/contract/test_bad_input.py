"""Bad requests get a 4xx with the error body and the JSON path of the fault, and store nothing."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.conftest import ProjectKey
from tests.integration.api.conftest import JOB_ENDPOINTS, assert_error, counts, job_spec, submit

JSON = {"content-type": "application/json"}


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# (case id, spec built from the dataset id and the corpus dir, status, code, loc)
SPEC_CASES: list[tuple[str, Callable[[str, Path], Any], int, str, list[Any]]] = [
    (
        "unknown_field",
        lambda d, _: job_spec(d, bogus=1),
        422,
        "validation_error",
        ["body", "bogus"],
    ),
    (
        "unknown_nested_field",
        lambda d, _: job_spec(d, model={"n_layer": 2}),
        422,
        "validation_error",
        ["body", "model", "n_layer"],
    ),
    (
        "wrong_type",
        lambda d, _: job_spec(d, model={"n_layers": "four"}),
        422,
        "validation_error",
        ["body", "model", "n_layers"],
    ),
    (
        "negative_size",
        lambda d, _: job_spec(d, train={"micro_batch_size": -1}),
        422,
        "validation_error",
        ["body", "train", "micro_batch_size"],
    ),
    (
        "heads_not_dividing_width",
        lambda d, _: job_spec(d, model={"d_model": 128, "n_heads": 3}),
        422,
        "validation_error",
        ["body", "model", "n_heads"],
    ),
    (
        "missing_name",
        lambda d, _: {"data": {"dataset": d}},
        422,
        "validation_error",
        ["body", "name"],
    ),
    ("not_an_object", lambda d, _: [1, 2], 422, "validation_error", ["body"]),
    (
        "unknown_dataset",
        lambda d, _: job_spec("ds_0000000000000000"),
        422,
        "validation_error",
        ["body", "data", "dataset"],
    ),
    (
        "nul_in_a_label",
        lambda d, _: job_spec(d, labels={"team": "a\x00b"}),
        422,
        "validation_error",
        ["body", "labels", "team"],
    ),
    (
        "lone_surrogate_in_a_label_key",
        lambda d, _: job_spec(d, labels={"k\ud800": "v"}),
        422,
        "validation_error",
        ["body", "labels"],
    ),
    (
        "nul_in_dataset_id",
        lambda d, _: job_spec(d + "\x00"),
        422,
        "validation_error",
        ["body", "data", "dataset"],
    ),
    (
        "data_uri_outside_the_roots",
        lambda d, _: job_spec(d, data={"uri": "/etc"}),
        403,
        "forbidden",
        ["body", "data", "uri"],
    ),
    (
        "data_uri_escaping_a_root_with_dotdot",
        lambda d, c: job_spec(d, data={"uri": f"{c}/../../../../etc/passwd"}),
        403,
        "forbidden",
        ["body", "data", "uri"],
    ),
    (
        "data_uri_remote_not_allowed",
        lambda d, _: job_spec(d, data={"uri": "s3://bucket/corpus"}),
        403,
        "forbidden",
        ["body", "data", "uri"],
    ),
    (
        "data_uri_missing_under_a_root",
        lambda d, c: job_spec(d, data={"uri": f"{c}/no-such-file.txt"}),
        422,
        "validation_error",
        ["body", "data", "uri"],
    ),
    (
        "lora_target_the_gpt_lacks",
        lambda d, _: job_spec(d, lora={"target_modules": ["q_proj"]}),
        422,
        "validation_error",
        ["body", "lora", "target_modules"],
    ),
    (
        "lora_on_a_randomly_initialised_gpt",
        lambda d, _: job_spec(d, lora={"r": 8}),
        422,
        "validation_error",
        ["body", "lora"],
    ),
    (
        "warmup_longer_than_the_run",
        lambda d, _: job_spec(d, optim={"warmup_steps": 75}, train={"max_steps": 60}),
        422,
        "validation_error",
        ["body", "optim", "warmup_steps"],
    ),
    (
        "qlora_with_fsdp",
        lambda d, _: job_spec(
            d, qlora={}, parallelism={"strategy": "fsdp"}, resources={"procs_per_node": 2}
        ),
        422,
        "validation_error",
        ["body", "qlora"],
    ),
    (
        "hf_model_path_outside_the_roots",
        lambda d, _: job_spec(d, model={"kind": "hf", "hf": {"path_or_id": "/etc"}}),
        403,
        "forbidden",
        ["body", "model", "hf", "path_or_id"],
    ),
    (
        "data_uri_unknown_home",
        lambda d, _: job_spec(d, data={"uri": "~no-such-user-xyz/corpus"}),
        422,
        "validation_error",
        ["body", "data", "uri"],
    ),
]


@pytest.mark.parametrize(
    ("make", "status", "code", "loc"),
    [pytest.param(*case[1:], id=case[0]) for case in SPEC_CASES],
)
def test_bad_spec_is_refused_with_its_path_and_nothing_is_stored(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    corpus_dir: Path,
    engine: Engine,
    make: Callable[[str, Path], Any],
    status: int,
    code: str,
    loc: list[Any],
) -> None:
    before = counts(engine, project.project_id)
    # json.dumps escapes to ASCII, so a lone surrogate arrives as `\ud800`, as a client sends it
    body = json.dumps(make(dataset["id"], corpus_dir)).encode()
    answer = client.post("/v1/jobs", content=body, headers={**project.headers, **JSON})
    assert_error(answer, status, code, loc)
    assert counts(engine, project.project_id) == before


@pytest.mark.parametrize(
    ("body", "headers", "loc_prefix"),
    [
        pytest.param(b'{"name": "x", "data": {', JSON, ["body"], id="malformed_json"),
        pytest.param(b"", JSON, ["body"], id="empty_body"),
        pytest.param(b"name=x", {"content-type": "text/plain"}, ["body"], id="not_json"),
        pytest.param(b"\xff\xfe", JSON, ["body"], id="not_utf8"),
        pytest.param(b"[" * 100_000, JSON, ["body"], id="nested_too_deep"),
    ],
)
def test_unparseable_body_is_422_and_nothing_is_stored(
    client: TestClient,
    project: ProjectKey,
    engine: Engine,
    body: bytes,
    headers: dict[str, str],
    loc_prefix: list[str],
) -> None:
    before = counts(engine, project.project_id)
    answer = client.post("/v1/jobs", content=body, headers={**project.headers, **headers})
    error = assert_error(answer, 422, "validation_error")
    assert any(d["loc"][: len(loc_prefix)] == loc_prefix for d in error["details"])
    assert counts(engine, project.project_id) == before


def test_a_malformed_json_body_names_its_position(client: TestClient, project: ProjectKey) -> None:
    answer = client.post(
        "/v1/jobs", content=b'{"name": "x",,}', headers={**project.headers, **JSON}
    )
    error = assert_error(answer, 422, "validation_error")
    assert error["details"][0]["loc"] == ["body", 13]
    assert error["details"][0]["type"] == "json_invalid"


@pytest.mark.parametrize(
    ("key", "loc"),
    [
        pytest.param("k" * 201, ["header", "Idempotency-Key"], id="too_long"),
        pytest.param("", ["header", "Idempotency-Key"], id="empty"),
    ],
)
def test_bad_idempotency_key_is_422(
    client: TestClient,
    project: ProjectKey,
    dataset: dict[str, Any],
    engine: Engine,
    key: str,
    loc: list[str],
) -> None:
    before = counts(engine, project.project_id)
    answer = client.post(
        "/v1/jobs",
        json=job_spec(dataset["id"]),
        headers={**project.headers, "Idempotency-Key": key},
    )
    assert_error(answer, 422, "validation_error", loc)
    assert counts(engine, project.project_id) == before


@pytest.mark.parametrize(
    ("path", "loc"),
    [
        ("/v1/jobs?limit=0", ["query", "limit"]),
        ("/v1/jobs?limit=201", ["query", "limit"]),
        ("/v1/jobs?limit=ten", ["query", "limit"]),
        ("/v1/jobs?state=sleeping", ["query", "state", 0]),
        ("/v1/jobs?name=a%00b", ["query", "name"]),
        ("/v1/jobs?cursor=%21%21not-base64", ["query", "cursor"]),
        ("/v1/jobs?cursor=abc", ["query", "cursor"]),
        ("/v1/jobs?cursor=" + _cursor(b"[]"), ["query", "cursor"]),
        ("/v1/jobs?cursor=" + _cursor(b'{"before_id": "9"}'), ["query", "cursor"]),
        ("/v1/jobs?cursor=" + _cursor(b'{"before_id": -4}'), ["query", "cursor"]),
        (
            "/v1/jobs?cursor=" + _cursor(b'{"before_id": 99999999999999999999999}'),
            ["query", "cursor"],
        ),
        ("/v1/jobs?cursor=" + _cursor(b'{"before_id": true}'), ["query", "cursor"]),
        ("/v1/jobs/abc", ["path", "job_id"]),
        ("/v1/jobs/0", ["path", "job_id"]),
        (f"/v1/jobs/{2**70}", ["path", "job_id"]),
        ("/v1/jobs/1/events?after=-1", ["query", "after"]),
        ("/v1/jobs/1/events?limit=1001", ["query", "limit"]),
        ("/v1/jobs/1/logs?rank=-2", ["query", "rank"]),
        ("/v1/jobs/1/logs?limit=5001", ["query", "limit"]),
        ("/v1/jobs/1/logs?after=x", ["query", "after"]),
        ("/v1/jobs/1/metrics?names=a%00", ["query", "names"]),
    ],
)
def test_bad_query_or_path_is_422_with_its_loc(
    client: TestClient, project: ProjectKey, path: str, loc: list[Any]
) -> None:
    assert_error(client.get(path, headers=project.headers), 422, "validation_error", loc)


@pytest.mark.parametrize("job_id", [1, 2**62])
def test_unknown_job_is_404_on_every_job_endpoint(
    client: TestClient, project: ProjectKey, job_id: int
) -> None:
    # Job 1 exists in some project of this session (or no project): either way not in this one.
    for method, suffix in JOB_ENDPOINTS:
        answer = client.request(method, f"/v1/jobs/{job_id}{suffix}", headers=project.headers)
        assert_error(answer, 404, "not_found")


def test_a_cursor_from_the_api_round_trips_but_its_tampered_form_is_refused(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    for _ in range(2):
        submit(client, project, job_spec(dataset["id"]))
    page = client.get("/v1/jobs?limit=1", headers=project.headers).json()
    cursor = page["next_cursor"]
    ok = client.get("/v1/jobs", params={"cursor": cursor}, headers=project.headers)
    assert ok.status_code == 200
    bad = client.get("/v1/jobs", params={"cursor": cursor[:-2] + "!!"}, headers=project.headers)
    assert_error(bad, 422, "validation_error", ["query", "cursor"])


_HOOK = {"url": "https://ci.example.com/hooks/torchyard", "event_types": ["job.*"]}


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        ("preview", {"max_truncated_share": False}, ["max_truncated_share"]),
        ("preview", {"max_truncated_share": "0.5"}, ["max_truncated_share"]),
        ("preview", {"num_examples": True}, ["num_examples"]),
        ("preview", {"seq_len": "64"}, ["seq_len"]),
        ("/v1/webhooks", {**_HOOK, "alert_rules": {"stalled_minutes": True}}, None),
        ("/v1/webhooks", {**_HOOK, "alert_rules": {"loss_spike_window": False}}, None),
        ("/v1/webhooks", {**_HOOK, "alert_rules": {"loss_spike_factor": "2"}}, None),
        ("/v1/keys", {"name": "ci", "expires_in": True}, ["expires_in"]),
    ],
)
def test_a_documented_number_refuses_booleans_and_strings(
    client: TestClient,
    project: ProjectKey,
    engine: Engine,
    path: str,
    body: dict[str, Any],
    loc: list[str] | None,
) -> None:
    if path == "preview":
        path = f"/v1/datasets/{_chat_dataset(client, project)}/preview"
    if loc is None:  # the one field of alert_rules
        loc = ["alert_rules", *body["alert_rules"]]
    before = counts(engine, project.project_id)
    error = assert_error(
        client.post(path, json=body, headers=project.headers),
        422,
        "validation_error",
        ["body", *loc],
    )
    assert [d["type"] for d in error["details"]] in (["int_type"], ["float_type"])
    assert counts(engine, project.project_id) == before


def test_a_number_that_is_a_json_number_is_still_accepted(
    client: TestClient, project: ProjectKey
) -> None:
    dataset_id = _chat_dataset(client, project)
    # 2.0 is an integer in JSON Schema; 0 is a number.
    body = {"num_examples": 2.0, "max_truncated_share": 0, "seq_len": 64}
    answer = client.post(f"/v1/datasets/{dataset_id}/preview", json=body, headers=project.headers)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["seq_len"], len(answer.json()["examples"])) == (64, 1)


def _chat_dataset(client: TestClient, project: ProjectKey) -> str:
    record = (
        b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
    )
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": "chat"},
        files={"file": ("c.jsonl", record + b"\n")},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])
