"""The server's mirror of the `tinker` client's wire types (`api/schemas/tinker.py`) takes what
the client sends and answers what it reads: each request the client builds validates as ours,
and each of our answers (its documented example, and a full one) validates as the client's own
type, which is strict (`_strict_response_validation`). A drift on either side fails here."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel
from tinker import types as client

from api import openapi_examples
from api.schemas import tinker as ours
from api.schemas import tinker_runs as runs
from api.schemas import tinker_sampling as sampling
from api.schemas import tinker_weights as weights


def _sent(request: Any) -> dict[str, Any]:
    """The body as the client puts it on the wire (`model_dump(exclude_none=True)`)."""
    dumped: dict[str, Any] = request.model_dump(exclude_none=True, mode="json")
    return dumped


REQUESTS = [
    (client.ClientConfigRequest(sdk_version="0.38.0"), ours.ClientConfigRequest),
    (
        client.CreateSessionRequest(
            tags=["a", ""], user_metadata={"k": "v"}, sdk_version="0.38.0", display_name="d"
        ),
        ours.CreateSessionRequest,
    ),
    (
        client.CreateSessionRequest(tags=[], user_metadata=None, sdk_version="0.38.0"),
        ours.CreateSessionRequest,
    ),
    (
        client.SessionHeartbeatRequest(session_id="ses_0123456789abcdef"),
        ours.SessionHeartbeatRequest,
    ),
    (
        client.LoadWeightsRequest(
            model_id="s:train:0", seq_id=4, path="tinker://s:train:0/weights/w", optimizer=True
        ),
        weights.LoadWeightsRequest,
    ),
    (  # create-via-load (`create_training_client_from_state`)
        client.LoadWeightsRequest(
            session_id="ses_0",
            model_seq_id=1,
            base_model="llama-tiny",
            user_metadata={"k": "v"},
            path="tinker://s:train:0/weights/w",
            optimizer=False,
            optimizer_config=client.AdamOptimizerConfig(),
        ),
        weights.LoadWeightsRequest,
    ),
    (
        client.SaveWeightsForSamplerRequest(model_id="s:train:0", path="w", seq_id=3),
        sampling.SaveWeightsForSamplerRequest,
    ),
    (
        client.SaveWeightsForSamplerRequest(
            model_id="s:train:0", seq_id=3, sampling_session_seq_id=0, kind="snapshot"
        ),
        sampling.SaveWeightsForSamplerRequest,
    ),
    (
        client.CreateSamplingSessionRequest(
            session_id="ses_0", sampling_session_seq_id=1, model_path="tinker://m/sampler_weights/w"
        ),
        sampling.CreateSamplingSessionRequest,
    ),
    (
        client.SampleRequest(
            sampling_session_id="req_0",
            seq_id=4,
            num_samples=2,
            prompt=client.ModelInput.from_ints([1, 2, 3]),
            sampling_params=client.SamplingParams(
                max_tokens=5, seed=1, stop=["x", "y"], temperature=0.5, top_k=3, top_p=0.9
            ),
            prompt_logprobs=True,
        ),
        sampling.SampleRequest,
    ),
    (
        client.SampleRequest(
            sampling_session_id="req_0",
            seq_id=0,
            prompt=client.ModelInput.from_ints([1]),
            sampling_params=client.SamplingParams(stop=[7, 8]),
            prompt_logprobs=False,
        ),
        sampling.SampleRequest,
    ),
]


@pytest.mark.parametrize(("request_", "mirror"), REQUESTS, ids=lambda v: type(v).__name__)
def test_every_request_the_client_sends_validates_as_ours(
    request_: Any, mirror: type[BaseModel]
) -> None:
    body = _sent(request_)
    parsed = mirror.model_validate(body).model_dump(mode="json", exclude_none=True)
    for name, value in body.items():
        assert parsed[name] == value


ANSWERS: list[tuple[type[BaseModel], Any]] = [
    (ours.HealthResponse, client.HealthResponse),
    (ours.ClientConfigResponse, client.ClientConfigResponse),
    (ours.ClientDynamicConfigResponse, client.ClientDynamicConfigResponse),
    (ours.GetServerCapabilitiesResponse, client.GetServerCapabilitiesResponse),
    (ours.CreateSessionResponse, client.CreateSessionResponse),
    (ours.SessionHeartbeatResponse, client.SessionHeartbeatResponse),
    (ours.ListSessionsResponse, client.ListSessionsResponse),
    (ours.GetSessionResponse, client.GetSessionResponse),
    (sampling.CreateSamplingSessionResponse, client.CreateSamplingSessionResponse),
    (sampling.SampleFuture, client.UntypedAPIFuture),
    (sampling.GetSamplerResponse, client.GetSamplerResponse),
    (runs.WeightsInfoResponse, client.WeightsInfoResponse),
]


def _examples(mirror: type[BaseModel]) -> list[dict[str, Any]]:
    """The model's documented examples, nulls as the document shows them (api.openapi_examples
    marks them so FastAPI keeps them)."""
    found: list[dict[str, Any]] = openapi_examples._restored(mirror.model_json_schema()["examples"])
    assert found
    return found


@pytest.mark.parametrize(("mirror", "theirs"), ANSWERS, ids=lambda v: v.__name__)
def test_each_answer_of_ours_validates_as_the_clients_type(
    mirror: type[BaseModel], theirs: Any
) -> None:
    for example in _examples(mirror):
        answer = mirror.model_validate(example).model_dump(mode="json")
        read = theirs.model_validate(answer)  # strict: a missing or mistyped field raises
        known = set(type(read).model_fields) & set(answer)
        assert {name: answer[name] for name in known} == read.model_dump(mode="json", include=known)


def test_the_client_config_turns_off_jwt_exchange_pyqwest_and_compression() -> None:
    read = client.ClientConfigResponse.model_validate(ours.ClientConfigResponse().model_dump())
    assert not read.pjwt_auth_enabled
    assert not read.use_pyqwest_transport
    assert not read.proto_compress_fwdbwd
    assert not read.sample_use_retrieve_futures
    assert not read.custom_loss_server_side


def test_a_session_answer_keeps_the_clients_fields() -> None:
    example = _examples(ours.GetSessionResponse)[0]
    read = client.GetSessionResponse.model_validate(example)
    assert read.user_metadata == example["user_metadata"]
    assert read.training_run_ids == example["training_run_ids"]
    assert read.sampler_ids == example["sampler_ids"]
