"""Issue 47: the session program (`trainer.session`) on a small Llama, in this process.

Its step equals the built-in trainer's LoRA SFT step on the same batch (the integration test
drives the same through the API, a worker and the sandbox); it runs calls in `seq_id` order
whatever order their files come in, runs each once, refuses a `seq_id` it has passed and
answers a client's mistake as a `user` error without stopping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tinker.proto.response_conv import deserialize_forward_backward_output

from dataformat.tinker_wire import forward_backward_request
from tests.support.sessions import (
    ADAM,
    chat_data,
    datums,
    forward_backward_body,
    lora_sft_spec,
    session_llama_dir,
    step_batches,
    tinker_session_spec,
)
from tests.support.training import build_local_run
from trainer.events import EventWriter
from trainer.loop import train_step
from trainer.session import Server, Stop
from trainer.session_calls import SessionModel

STEPS = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session_llama_dir(tmp_path_factory.mktemp("session_llama"))


def _server(tmp_path: Path, model_dir: Path) -> tuple[Server, EventWriter]:
    reporter = EventWriter(tmp_path / "run", attempt=1)
    model = SessionModel(tinker_session_spec(model_dir), torch.device("cpu"))
    return Server(tmp_path / "run", model, reporter), reporter


def _put(server: Server, seq_id: int, request_id: str, kind: str, body: bytes) -> None:
    (server.inbox / f"{seq_id:012d}.{request_id}.{kind}").write_bytes(body)


def _answer(server: Server, request_id: str) -> tuple[dict[str, Any], bytes]:
    header, _, body = (server.outbox / request_id).read_bytes().partition(b"\n")
    return json.loads(header), body


def test_each_step_equals_the_trainers_lora_sft_step_whatever_order_the_calls_come_in(
    model_dir: Path, tmp_path: Path
) -> None:
    spec = lora_sft_spec(model_dir, chat_data(tmp_path / "chat.jsonl"), max_steps=STEPS)
    run = build_local_run(spec, tmp_path / "ckpt")
    rows = run.rows[0]
    batches = step_batches(rows, spec, STEPS)
    expected = [float(train_step(run)[0]) for _ in range(STEPS)]

    server, reporter = _server(tmp_path, model_dir)
    adam = json.dumps({"model_id": "ses_0:train:0", "adam_params": ADAM}).encode()
    for step, indices in enumerate(batches):  # each optim_step's file before its backward's
        _put(server, 2 * step + 2, f"req_o{step}", "optim_step", adam)
        batch = datums(rows, indices)
        _put(server, 2 * step + 1, f"req_f{step}", "forward_backward", forward_backward_body(
            batch, 2 * step + 1, loss_fn="cross_entropy"))  # fmt: skip
    assert server.run_ready()
    reporter.close()

    losses = []
    for step in range(STEPS):
        header, body = _answer(server, f"req_f{step}")
        assert header == {"type": "application/x-protobuf"}
        losses.append(deserialize_forward_backward_output(body).metrics["loss:sum"])
        header, body = _answer(server, f"req_o{step}")
        assert json.loads(body)["metrics"]["loss:sum"] == pytest.approx(losses[-1])
    np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=0)
    assert list(server.inbox.iterdir()) == []  # every call's file is gone once answered
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    assert [e["step"] for e in events if e["type"] == "metric"] == [1, 2, 3]


def test_a_call_runs_once_and_a_passed_seq_id_or_bad_datum_is_a_user_error(
    model_dir: Path, tmp_path: Path
) -> None:
    server, reporter = _server(tmp_path, model_dir)
    datum = {"tokens": np.arange(1, 9), "target_tokens": np.arange(2, 10),
             "weights": np.ones(8, np.float32)}  # fmt: skip
    body = forward_backward_body([datum], 1, loss_fn="cross_entropy")
    _put(server, 1, "req_a", "forward_backward", body)
    assert server.run_ready()
    first = _answer(server, "req_a")
    (server.outbox / "req_a").unlink()  # the worker stored it

    _put(server, 1, "req_a", "forward_backward", body)  # handed over again: not run again
    _put(server, 1, "req_b", "forward_backward", body)  # another call with a passed seq_id
    bad = dict(datum, weights=np.ones(3, np.float32))
    _put(
        server,
        2,
        "req_c",
        "forward_backward",
        forward_backward_body([bad], 2, loss_fn="cross_entropy"),
    )
    _put(server, 3, "req_d", "forward_backward", forward_backward_body([datum], 3, loss_fn="kl"))
    _put(server, 4, "req_e", "join_sampling_session", b"{}")
    server.run_ready()
    reporter.close()

    assert not (server.outbox / "req_a").exists()
    assert first[0] == {"type": "application/x-protobuf"}
    assert _answer(server, "req_b")[0] == {
        "error": "seq_id 1 has already run", "category": "user"}  # fmt: skip
    for request_id, words in (("req_c", "'weights'"), ("req_d", "unknown loss_fn 'kl'"),
                              ("req_e", "join_sampling_session is not served")):  # fmt: skip
        header, _ = _answer(server, request_id)
        assert header["category"] == "user" and words in header["error"], header
    assert server.next_seq == 5


def test_a_stopped_program_keeps_its_unsaved_state_and_the_next_attempt_resumes_from_it(
    model_dir: Path, tmp_path: Path
) -> None:
    """Preempted or ended (SIGTERM), the program saves what changed since its last save; the
    job's next attempt (`SessionModel.resume`) continues from the latest checkpoint, so its
    next step's loss is the one the stopped program would have computed."""
    checkpoints = str(tmp_path / "checkpoints")
    spec = tinker_session_spec(model_dir)
    reporter = EventWriter(tmp_path / "run", attempt=1)
    first = SessionModel(spec, torch.device("cpu"))
    server = Server(
        tmp_path / "run", first, reporter, model_id="ses_0:train:0", checkpoint_dir=checkpoints
    )
    rng = np.random.default_rng(0)
    batches = [
        [
            {
                "tokens": (ids := rng.integers(1, 50, size=13))[:-1],
                "target_tokens": ids[1:],
                "weights": np.ones(12, np.float32),
            }
        ]
        for _ in range(3)
    ]
    for step, batch in enumerate(batches[:2]):
        seq = 2 * step + 1
        _put(server, seq, f"req_f{step}", "forward_backward",
             forward_backward_body(batch, seq, loss_fn="cross_entropy"))  # fmt: skip
        _put(server, seq + 1, f"req_o{step}", "optim_step",
             json.dumps({"adam_params": ADAM}).encode())  # fmt: skip
        assert server.run_ready()
    stop = Stop()
    stop.requested = True  # SIGTERM came: the loop ends and the state is kept
    server.serve(stop)
    server.serve(stop)  # nothing changed since: no second checkpoint
    reporter.close()
    assert sorted(p.name for p in Path(checkpoints).glob("step_*")) == ["step_00000002"]

    second = SessionModel(spec, torch.device("cpu"))
    assert second.resume(checkpoints, EventWriter(tmp_path / "run2", attempt=2)) == 2
    assert second.step == 2 and not second.unsaved
    request = forward_backward_request(
        forward_backward_body(batches[2], 5, loss_fn="cross_entropy")
    )
    expected = first.forward_backward(request, forward_only=True)
    resumed = second.forward_backward(request, forward_only=True)
    assert resumed.loss_sum == pytest.approx(expected.loss_sum, rel=1e-6)
    fresh = SessionModel(spec, torch.device("cpu"))
    assert fresh.resume(str(tmp_path / "none"), reporter) is None and fresh.step == 0
