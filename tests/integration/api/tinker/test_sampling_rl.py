"""Issue 47, done means: an RL loop written only with the official `tinker` client (0.38.0,
unchanged) — prompts -> `sample` 4 completions each -> a reward from a Python function ->
group-normalised advantages -> `forward_backward(importance_sampling)` with the sampled
log-probabilities -> `optim_step` — raises the mean reward of a toy task over 30 iterations, on
CPU, through the real API, a real Celery worker and the session program in its sandbox.

Also through the client: the sampled tokens' log-probabilities equal a forward pass of the same
model on the same tokens, a seed repeats a sample, named sampler weights are sampled by path,
and another project's key gets 404 on the paths, sampling sessions and sample futures."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
import numpy as np
import pytest
import tinker
from sqlalchemy import Engine
from tinker import types

from tests.conftest import ProjectKey, make_project
from tests.integration.api.tinker.stalls import Stall
from tests.support.sessions import BASE

RESULT_TIMEOUT_S = 300  # the first call waits for the job's placement and the model's load
pytestmark = pytest.mark.timeout(3 * RESULT_TIMEOUT_S)

ITERATIONS = 30
GROUP = 4  # completions per prompt
MAX_TOKENS = 8
LR = 2e-2
RANK = 8
PROMPTS = [[40, 41, 42], [50, 51, 52, 53], [60, 61], [70, 71, 72, 73, 74]]
TARGET = frozenset(range(100, 160))  # 60 of the model's 600 ids: ~0.1 of a random sample


def reward(tokens: list[int]) -> float:
    """The toy task: the share of a completion's tokens that are in `TARGET`."""
    return sum(t in TARGET for t in tokens) / max(1, len(tokens))


def group_advantages(rewards: list[float]) -> list[float]:
    """A group's rewards, centred on their mean and scaled by their std (GRPO's normalisation,
    Shao et al. 2024); all 0 for a group whose rewards are equal."""
    r = np.asarray(rewards)
    return ((r - r.mean()) / (r.std() + 1e-6)).tolist()


def rl_datum(prompt: list[int], seq: Any, advantage: float) -> types.Datum:
    """One completion as an `importance_sampling` datum: input prompt + completion minus the
    last token, each position's target the next token; the prompt's positions carry advantage
    0 (not trained), the completion's its advantage and its sampled log-probability."""
    tokens = prompt + list(seq.tokens)
    n_prompt = len(prompt) - 1
    logprobs = [0.0] * n_prompt + list(seq.logprobs)
    advantages = [0.0] * n_prompt + [advantage] * len(seq.tokens)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(tokens[1:], np.int64)),
            "logprobs": types.TensorData.from_numpy(np.asarray(logprobs, np.float32)),
            "advantages": types.TensorData.from_numpy(np.asarray(advantages, np.float32)),
        },
    )


@pytest.mark.usefixtures("client_env")
def test_an_rl_loop_written_with_the_client_raises_the_mean_reward(stall: Stall) -> None:
    service = tinker.ServiceClient()
    client = stall.answer(service.create_lora_training_client(BASE, rank=RANK, seed=1), 60)
    means, started = [], time.monotonic()
    for iteration in range(ITERATIONS):
        sampler = stall.answer(client.save_weights_and_get_sampling_client(), RESULT_TIMEOUT_S)
        params = [types.SamplingParams(max_tokens=MAX_TOKENS, seed=1000 * iteration + i, stop=[])
                  for i in range(len(PROMPTS))]  # fmt: skip
        futures = [
            sampler.sample(types.ModelInput.from_ints(prompt), GROUP, p)
            for prompt, p in zip(PROMPTS, params, strict=True)
        ]
        batch, rewards = [], []
        for prompt, future in zip(PROMPTS, futures, strict=True):
            sequences = stall.answer(future, RESULT_TIMEOUT_S).sequences
            assert len(sequences) == GROUP
            group = [reward(list(s.tokens)) for s in sequences]
            rewards += group
            batch += [rl_datum(prompt, s, a) for s, a in
                      zip(sequences, group_advantages(group), strict=True)]  # fmt: skip
        backward = client.forward_backward(batch, "importance_sampling")
        step = client.optim_step(types.AdamParams(learning_rate=LR))
        stall.answer(backward, RESULT_TIMEOUT_S)
        stall.answer(step, RESULT_TIMEOUT_S)
        means.append(float(np.mean(rewards)))
    seconds = time.monotonic() - started
    first, last = np.mean(means[:5]), np.mean(means[-5:])
    print(f"mean reward: iteration 1 {means[0]:.3f}, 30 {means[-1]:.3f}; first 5 {first:.3f}, "
          f"last 5 {last:.3f}; {seconds:.1f} s")  # fmt: skip
    assert last > first + 0.2, means
    stall.answer(service.close("success"), 60)


@pytest.mark.usefixtures("client_env")
def test_sampled_logprobs_equal_a_forward_pass_a_seed_repeats_and_paths_sample(
    stall: Stall,
) -> None:
    service = tinker.ServiceClient()
    client = stall.answer(service.create_lora_training_client(BASE, rank=RANK, seed=2), 60)
    path = stall.answer(client.save_weights_for_sampler("start"), RESULT_TIMEOUT_S).path
    assert path == f"tinker://{client.model_id}/sampler_weights/start"
    sampler = stall.answer(service.create_sampling_client(model_path=path), 60)
    # the session lists its training client and its sampling session (`RestClient.get_session`)
    # (over HTTP: a second RestClient's own holder hung one CI run for 60 s)
    base, key = os.environ["TINKER_BASE_URL"], os.environ["TINKER_API_KEY"]
    headers = {"X-API-Key": key}
    sid = service.holder.get_session_id()
    seen = httpx.get(f"{base}/api/v1/sessions/{sid}", headers=headers, timeout=60).json()
    assert seen["training_run_ids"] == [client.model_id]
    assert len(seen["sampler_ids"]) == 1
    got = httpx.get(f"{base}/api/v1/samplers/{seen['sampler_ids'][0]}", headers=headers,
                    timeout=60).json()  # fmt: skip
    assert got["model_path"] == path
    prompt = types.ModelInput.from_ints(PROMPTS[1])
    params = types.SamplingParams(max_tokens=MAX_TOKENS, seed=11, stop=[])
    asked = sampler.sample(prompt, 3, params, include_prompt_logprobs=True)
    first = stall.answer(asked, RESULT_TIMEOUT_S)
    again = stall.answer(sampler.sample(prompt, 3, params), RESULT_TIMEOUT_S)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
    assert [len(s.tokens) for s in first.sequences] == [MAX_TOKENS] * 3
    assert {s.stop_reason for s in first.sequences} == {"length"}

    # a forward pass of the training client (its weights are still the snapshot's) on the
    # same tokens: its target log-probabilities are the sampled ones
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(PROMPTS[1] + list(s.tokens)[:-1]),
            loss_fn_inputs={
                "target_tokens": types.TensorData.from_numpy(
                    np.asarray(PROMPTS[1][1:] + list(s.tokens), np.int64)
                ),
                "weights": types.TensorData.from_numpy(
                    np.ones(len(PROMPTS[1]) - 1 + len(s.tokens), np.float32)
                ),
            },
        )
        for s in first.sequences
    ]
    forward = stall.answer(client.forward(data, "cross_entropy"), RESULT_TIMEOUT_S)
    n = len(PROMPTS[1]) - 1
    for s, out in zip(first.sequences, forward.loss_fn_outputs, strict=True):
        logprobs = out["logprobs"].to_numpy()
        np.testing.assert_allclose(s.logprobs, logprobs[n:], rtol=1e-4)
        assert first.prompt_logprobs is not None and first.prompt_logprobs[0] is None
        np.testing.assert_allclose(first.prompt_logprobs[1:], logprobs[:n], rtol=1e-4)
    stall.answer(service.close("success"), 60)


def _post(server: str, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server}/api/v1/{path}", json=body, headers={"X-API-Key": f"tml-{key}"})


@pytest.mark.usefixtures("client_env")
def test_another_projects_key_gets_404_on_sampler_paths_sessions_and_futures(
    server: str, stall: Stall, owner: ProjectKey, engine: Engine
) -> None:
    service = tinker.ServiceClient()
    client = stall.answer(service.create_lora_training_client(BASE, rank=RANK), 60)
    path = stall.answer(client.save_weights_for_sampler("mine"), RESULT_TIMEOUT_S).path
    session_id = service.holder.get_session_id()
    created = _post(
        server,
        "create_sampling_session",
        owner.api_key,
        {"session_id": session_id, "sampling_session_seq_id": 0, "model_path": path},
    )
    sampler_id = created.json()["sampling_session_id"]
    prompt = {"chunks": [{"type": "encoded_text", "tokens": PROMPTS[0]}]}
    sample = {"sampling_session_id": sampler_id, "seq_id": 0,
              "num_samples": 1, "prompt": prompt, "sampling_params": {"max_tokens": 2}}  # fmt: skip
    mine = _post(server, "asample", owner.api_key, sample)
    assert mine.status_code == 200, mine.text

    other = make_project(engine).api_key
    other_session = _post(server, "create_session", other,
                          {"tags": [], "sdk_version": "0.38.0"}).json()["session_id"]  # fmt: skip
    refused = [
        _post(
            server,
            "create_sampling_session",
            other,
            {"session_id": other_session, "sampling_session_seq_id": 0, "model_path": path},
        ),
        _post(server, "asample", other, sample),
        _post(server, "retrieve_future", other, {"request_id": mine.json()["request_id"]}),
        _post(
            server,
            "save_weights_for_sampler",
            other,
            {"model_id": client.model_id, "path": "theirs", "seq_id": 99},
        ),
        httpx.get(f"{server}/api/v1/samplers/{sampler_id}", headers={"X-API-Key": f"tml-{other}"}),
    ]
    assert [r.status_code for r in refused] == [404] * 5, [r.text for r in refused]
    # bad input names its field; a bare base model is not served
    bad = _post(server, "asample", owner.api_key, dict(sample, num_samples=0))
    assert bad.status_code == 422 and "num_samples" in bad.text
    bare = _post(server, "create_sampling_session", owner.api_key,
                 {"session_id": session_id, "sampling_session_seq_id": 5,
                  "base_model": BASE})  # fmt: skip
    assert bare.status_code == 422 and "model_path" in bare.text
    capabilities = httpx.get(f"{server}/api/v1/get_server_capabilities",
                             headers={"X-API-Key": f"tml-{owner.api_key}"}).json()  # fmt: skip
    assert {m["sampleable"] for m in capabilities["supported_models"]} == {True}
    stall.answer(service.close("success"), 60)
