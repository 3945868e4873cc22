"""Issue 47: sampling in the session program (`trainer.session_sampling`), on a small Llama in
this process: the sampled tokens' log-probabilities are a forward pass's, a seed repeats a
sample, a sample reads the snapshot its weights were saved as (not the weights trained since)
and leaves training as it was, and the sampling parameters are honoured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tinker.proto.response_conv import deserialize_sample_response

from tests.support.sessions import (
    ADAM,
    forward_backward_body,
    session_llama_dir,
    tinker_session_spec,
)
from tests.support.sft_data import bpe_tokenizer
from trainer.events import EventWriter
from trainer.methods.grpo import token_logps
from trainer.session import Server
from trainer.session_calls import SessionModel
from trainer.session_sampling import KEEP_EPHEMERAL

PROMPT = [40, 41, 42, 43, 44]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_llama_dir(tmp_path_factory.mktemp("session_llama"))


@pytest.fixture
def server(tmp_path: Path, model_dir: Path) -> Server:
    model = SessionModel(tinker_session_spec(model_dir), torch.device("cpu"))
    return Server(tmp_path / "run", model, EventWriter(tmp_path / "run", attempt=1))


def _call(server: Server, place: int, request_id: str, kind: str, body: Any) -> tuple[dict, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    (server.inbox / f"{place:012d}.{request_id}.{kind}").write_bytes(data)
    server.run_ready()
    header, _, answer = (server.outbox / request_id).read_bytes().partition(b"\n")
    return json.loads(header), answer


def _sample(server: Server, request_id: str, name: str = "w", **params: Any) -> Any:
    num_samples = params.pop("num_samples", 4)
    prompt_logprobs = params.pop("prompt_logprobs", False)
    body = {
        "name": name,
        "num_samples": num_samples,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
        "sampling_params": {"temperature": 1.0, "top_k": -1, "top_p": 1.0, **params},
        "prompt_logprobs": prompt_logprobs,
    }
    header, answer = _call(server, 1, request_id, "sample", body)
    assert header == {"type": "application/x-protobuf"}, header
    return deserialize_sample_response(answer)


def _save(server: Server, seq_id: int, name: str = "w") -> dict[str, Any]:
    header, answer = _call(server, seq_id, f"req_s{seq_id}", "save_weights_for_sampler",
                           {"name": name})  # fmt: skip
    assert header == {"type": "application/json"}, header
    return dict(json.loads(answer))


def _forward_logprobs(server: Server, tokens: list[int]) -> np.ndarray:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = server.model.model(ids[:, :-1])
    return token_logps(logits, ids[:, 1:])[0].numpy()


def test_sampled_logprobs_equal_a_forward_pass_and_a_seed_repeats_a_sample(
    server: Server,
) -> None:
    assert _save(server, 1) == {"type": "save_weights_for_sampler",
                                "path": "tinker:///sampler_weights/w"}  # fmt: skip
    out = _sample(server, "req_a", max_tokens=12, seed=5, prompt_logprobs=True)
    assert len(out.sequences) == 4
    for seq in out.sequences:
        assert 1 <= len(seq.tokens) <= 12 and len(seq.logprobs) == len(seq.tokens)
        expected = _forward_logprobs(server, PROMPT + seq.tokens)[len(PROMPT) - 1 :]
        np.testing.assert_allclose(seq.logprobs, expected, rtol=1e-4)
        assert seq.stop_reason == ("stop" if seq.tokens[-1] == 2 else "length")
    prompt = _forward_logprobs(server, PROMPT)
    assert out.prompt_logprobs[0] is None
    np.testing.assert_allclose(out.prompt_logprobs[1:], prompt, rtol=1e-4)

    again = _sample(server, "req_b", max_tokens=12, seed=5)
    other = _sample(server, "req_c", max_tokens=12, seed=6)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in out.sequences]
    assert [s.tokens for s in other.sequences] != [s.tokens for s in out.sequences]
    assert again.prompt_logprobs is None


def test_a_sample_reads_its_snapshot_and_leaves_training_as_it_was(server: Server) -> None:
    _save(server, 1)
    before = _sample(server, "req_a", max_tokens=8, seed=1)
    datum = {"tokens": np.array(PROMPT), "target_tokens": np.array([*PROMPT[1:], 45]),
             "weights": np.ones(5, np.float32)}  # fmt: skip
    for step in range(3):  # the weights move on from the snapshot
        backward = forward_backward_body([datum], 2 + 2 * step, loss_fn="cross_entropy")
        _call(server, 2 + 2 * step, f"req_fb{step}", "forward_backward", backward)
        _call(server, 3 + 2 * step, f"req_o{step}", "optim_step", {"adam_params": ADAM})
    trained = _forward_logprobs(server, PROMPT)
    after = _sample(server, "req_b", max_tokens=8, seed=1)
    assert [s.tokens for s in after.sequences] == [s.tokens for s in before.sequences]
    assert [s.logprobs for s in after.sequences] == [s.logprobs for s in before.sequences]
    np.testing.assert_array_equal(_forward_logprobs(server, PROMPT), trained)  # restored
    _save(server, 8, "w")  # replaced by the trained weights
    moved = _sample(server, "req_c", max_tokens=8, seed=1)
    assert [s.logprobs for s in moved.sequences] != [s.logprobs for s in before.sequences]


def test_sampling_parameters_stop_ids_strings_greedy_and_limits(server: Server) -> None:
    _save(server, 1)
    greedy = _sample(server, "req_g", max_tokens=6, temperature=0.0, stop=[], num_samples=2)
    assert greedy.sequences[0].tokens == greedy.sequences[1].tokens
    assert [len(s.tokens) for s in greedy.sequences] == [6, 6]
    assert {s.stop_reason for s in greedy.sequences} == {"length"}
    first = greedy.sequences[0].tokens[0]
    by_id = _sample(server, "req_i", max_tokens=6, temperature=0.0, stop=[first])
    assert [s.tokens for s in by_id.sequences] == [[first]] * 4
    assert {s.stop_reason for s in by_id.sequences} == {"stop"}
    top1 = _sample(server, "req_k", max_tokens=6, top_k=1, stop=[], seed=3)
    assert [s.tokens for s in top1.sequences] == [greedy.sequences[0].tokens] * 4
    text = bpe_tokenizer().decode(greedy.sequences[0].tokens[:2])
    by_text = _sample(server, "req_t", max_tokens=6, temperature=0.0, stop=text[-1])
    for seq in by_text.sequences:
        assert seq.stop_reason == "stop" and len(seq.tokens) <= 2


def test_unknown_weights_or_a_prompt_too_long_is_a_user_error(server: Server) -> None:
    body = {"name": "never", "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
            "sampling_params": {"temperature": 1.0, "top_k": -1, "top_p": 1.0}}  # fmt: skip
    header, _ = _call(server, 1, "req_n", "sample", body)
    assert header["category"] == "user" and "no sampler weights named 'never'" in header["error"]
    for seq_id in range(1, KEEP_EPHEMERAL + 3):
        _save(server, seq_id, f"~sampler-{seq_id}")
    header, _ = _call(server, 1, "req_old", "sample", dict(body, name="~sampler-1"))
    assert header["category"] == "user"  # the oldest unnamed ones are dropped
    _sample(server, "req_new", name=f"~sampler-{KEEP_EPHEMERAL + 2}", max_tokens=2)
    long = dict(body, name=f"~sampler-{KEEP_EPHEMERAL + 2}")
    long["prompt"] = {"chunks": [{"type": "encoded_text", "tokens": [5] * 128}]}
    header, _ = _call(server, 1, "req_l", "sample", long)
    assert header["category"] == "user" and "the model takes 128" in header["error"]
