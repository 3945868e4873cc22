"""Training sessions through the service (issue 47): what the control plane adds to a Tinker
client's calls, and whether a session trains as fast as the built-in trainer.

    python -m bench.sessions [--steps 30] [--tokens 16] [--batch 8] [--seq-len 128]
                             [--batched-steps 10] [--trainer-steps 20]

A real API and Celery worker (uvicorn + Postgres + Redis, loopback) serve a registered small
Llama (`demos.offline_llama`); the official `tinker` client drives a LoRA training client of it
(rank 8, attention and MLP adapters, as the built-in trainer's LoRA SFT below).

1. `latency`: `--steps` steps of one tiny call each (`forward_backward(cross_entropy)` of one
   datum of `--tokens` tokens, then `optim_step`), each waited for, through the service (after
   the first, which waits for the job's placement and the model's load), against the same calls
   in this process on the same model (`trainer.session_calls.SessionModel`: decode, forward,
   backward, encode, AdamW step). Goal: p50 through the service under 30 ms above in-process.
   `in_the_service` splits a step: how long each call's row was in the service's hands (API
   stored it -> relay stored its answer) and a step's span there; the rest is the client's and
   the API's (the requests, their commits, `retrieve_future`'s polls).
2. `throughput`: `--batched-steps` steps of `--batch` datums of `--seq-len` tokens through the
   service, tokens/s, each step waited for (`session_tokens_per_s`) and all submitted at once
   (`pipelined_tokens_per_s`: a loop that knows its next batches, as Tinker's own docs advise,
   overlaps its round trips with the steps before), against the built-in trainer's own LoRA SFT
   job on the same model, worker and batch shape (its `tokens_per_second`, median over its steps
   after the first). Goal: >= 0.9 of the trainer.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from bench import smoke
from bench._common import (
    api_server,
    emit,
    note,
    postgres_database,
    project_key,
    server_env,
    summary_ms,
    wait_for,
    worker,
)
from dataformat.tinker_wire import forward_backward_request
from demos.offline_llama import build_model_dir
from jobspec.job import SessionJobSpec
from trainer.session_calls import SessionModel, encode_output

BASE = "bench-llama"
RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
        "grad_clip_norm": 1.0}  # fmt: skip


def _datums(rng: np.random.Generator, count: int, length: int, vocab: int) -> list[dict]:
    """`count` datums of `length` random tokens, every position supervised."""
    out = []
    for _ in range(count):
        ids = rng.integers(1, vocab, size=length + 1)
        out.append({"tokens": ids[:-1], "target_tokens": ids[1:],
                    "weights": np.ones(length, np.float32)})  # fmt: skip
    return out


def _tinker_datums(batch: list[dict]) -> list[Any]:
    import tinker

    return [
        tinker.Datum(
            model_input=tinker.ModelInput.from_ints(d["tokens"].tolist()),
            loss_fn_inputs={
                "target_tokens": tinker.TensorData.from_numpy(d["target_tokens"]),
                "weights": tinker.TensorData.from_numpy(d["weights"]),
            },
        )
        for d in batch
    ]


def _service_steps(client: Any, batches: list[list[dict]], wait_s: float) -> list[float]:
    """Seconds of each step (forward_backward then optim_step, both waited for, `wait_s` at
    most)."""
    import tinker

    seconds = []
    for batch in batches:
        started = time.perf_counter()
        backward = client.forward_backward(_tinker_datums(batch), "cross_entropy")
        step = client.optim_step(tinker.AdamParams(**ADAM))
        backward.result(timeout=wait_s)
        step.result(timeout=wait_s)
        seconds.append(time.perf_counter() - started)
    return seconds


def _pipelined_steps(client: Any, batches: list[list[dict]], wait_s: float) -> float:
    """Seconds for all `batches`' steps submitted at once (each `forward_backward` then its
    `optim_step`), as a Tinker loop that knows its next batches overlaps them: the service's
    sustained rate, its round trips hidden behind the steps before."""
    import tinker

    started = time.perf_counter()
    futures = []
    for batch in batches:
        futures.append(client.forward_backward(_tinker_datums(batch), "cross_entropy"))
        futures.append(client.optim_step(tinker.AdamParams(**ADAM)))
    for future in futures:
        future.result(timeout=wait_s)
    return time.perf_counter() - started


def _where_the_time_went(url: str, model_id: str, since: datetime, until: datetime) -> dict:
    """Of the tiny steps between `since` and `until`: how long each call was in the service's
    hands (its row's `created_at`, stored by the API, to `done_at`, its answer stored by the
    relay: the relay's pick-up, the program's run, the relay's hand-back), p50 per kind, and a
    step's span there (its `forward_backward` stored to its `optim_step` answered). The rest
    of a step is the client's and the API's (requests, commits, `retrieve_future`'s polls)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as db:
            rows = db.execute(
                text(
                    "SELECT kind, seq_id, created_at, done_at FROM session_requests"
                    " WHERE model_id = :model AND created_at BETWEEN :since AND :until"
                    " AND kind IN ('forward_backward', 'optim_step') AND done_at IS NOT NULL"
                    " ORDER BY seq_id"
                ),
                {"model": model_id, "since": since, "until": until},
            ).all()
    finally:
        engine.dispose()
    held: dict[str, list[float]] = {}
    for kind, _, created, done in rows:
        held.setdefault(kind, []).append((done - created).total_seconds())
    by_seq = {seq: (created, done) for _, seq, created, done in rows}
    spans = [
        (by_seq[seq + 1][1] - created).total_seconds()
        for kind, seq, created, _ in rows
        if kind == "forward_backward" and seq + 1 in by_seq
    ]
    out = {f"{kind}_held_p50_ms": summary_ms(v)["p50_ms"] for kind, v in held.items() if v}
    if spans:
        out["step_span_p50_ms"] = summary_ms(spans)["p50_ms"]
    return out


def _in_process_steps(model_dir: Path, seq_len: int, batches: list[list[dict]]) -> list[float]:
    """The same steps on the same model in this process: the protobuf body the client sends,
    decoded, forward and backward, the answer encoded, the AdamW step."""
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.types import ForwardBackwardInput, ForwardBackwardRequest

    spec = SessionJobSpec.model_validate(
        {
            "name": "bench-session",
            "model": {"kind": "hf", "hf": {"path_or_id": str(model_dir)}, "seq_len": seq_len},
            "session": {"session_id": "ses_bench", "model_id": "ses_bench:train:0",
                        "base_model": BASE, "lora_rank": RANK, "lora_seed": 0,
                        "train_unembed": False},
        }
    )  # fmt: skip
    torch.set_num_threads(1)  # as the session program runs (the worker's OMP_NUM_THREADS=1)
    model = SessionModel(spec, torch.device("cpu"))
    seconds = []
    for seq_id, batch in enumerate(batches, 1):
        request = ForwardBackwardRequest(
            forward_backward_input=ForwardBackwardInput(
                data=_tinker_datums(batch), loss_fn="cross_entropy"
            ),
            model_id="ses_bench:train:0",
            seq_id=seq_id,
        )
        body = bytes(forward_backward_request_to_proto(request).SerializeToString())
        started = time.perf_counter()
        encode_output(model.forward_backward(forward_backward_request(body), forward_only=False))
        model.optim_step(ADAM)
        seconds.append(time.perf_counter() - started)
    return seconds


def _trainer_tokens_per_s(
    base: str, headers: dict[str, str], home: Path, model_dir: Path, pool: str, args: Any
) -> float:
    """The built-in trainer's LoRA SFT on the same model, worker and batch shape: the median
    of its reported `tokens_per_second` over its steps after the first."""
    corpus = home / "corpus"
    corpus.mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(errors="replace") for p in sorted(stdlib.glob("*.py"))[:40])
    (corpus / "stdlib.txt").write_text(text)
    ds = httpx.post(f"{base}/v1/datasets", headers=headers, timeout=60,
                    json={"name": "corpus", "uri": str(corpus)})  # fmt: skip
    ds.raise_for_status()
    steps = args.trainer_steps
    spec = {
        "name": "bench-lora-sft",
        "data": {"dataset": ds.json()["id"]},
        "model": {"kind": "hf", "hf": {"path_or_id": str(model_dir)}, "seq_len": args.seq_len},
        "lora": {"r": RANK, "alpha": 32, "dropout": 0.0, "target_modules": TARGETS},
        "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "constant", "weight_decay": 0.0},
        "train": {"micro_batch_size": args.batch, "max_steps": steps, "log_interval_steps": 1},
        "eval": {"interval_steps": steps, "num_batches": 1},
        "checkpoint": {"interval_steps": steps},
        "sample": {"max_new_tokens": 0},
        "resources": {"procs_per_node": 1, "pool": pool},
    }
    job = httpx.post(f"{base}/v1/jobs", headers=headers, json=spec, timeout=60)
    job.raise_for_status()
    job_id = job.json()["id"]

    def ended() -> dict[str, Any] | None:
        row = httpx.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=30).json()
        return row if row["state"] in ("succeeded", "failed", "cancelled") else None

    row = wait_for(ended, args.wait_s, "the trainer's LoRA SFT job", poll_s=0.5)
    if row["state"] != "succeeded":
        raise RuntimeError(f"the trainer's job {row['state']}: {row.get('error')}")
    series = httpx.get(f"{base}/v1/jobs/{job_id}/metrics", headers=headers, timeout=30,
                       params={"names": "tokens_per_second"}).json()  # fmt: skip
    values = series["series"][0]["values"] if series.get("series") else []
    return float(statistics.median(values[1:] or values))


@contextlib.contextmanager
def _explained(logs: list[Path]) -> Iterator[None]:
    """On a failure in the block (a wait past `--wait-s` among them), the last lines of the
    API's and the worker's logs to stderr: what the answer waited on."""
    try:
        yield
    except BaseException:
        for path in logs:
            lines = path.read_text(errors="replace").splitlines()[-40:] if path.exists() else []
            note(f"--- {path.name} (last {len(lines)} lines)\n" + "\n".join(lines))
        raise


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sessions", description=__doc__)
    parser.add_argument("--steps", type=int, default=30, help="tiny steps, each waited for")
    parser.add_argument("--tokens", type=int, default=16, help="tokens of the tiny call's datum")
    parser.add_argument("--batch", type=int, default=8, help="datums of a batched step")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens of each batched datum")
    parser.add_argument("--batched-steps", type=int, default=10)
    parser.add_argument("--trainer-steps", type=int, default=20)
    parser.add_argument("--wait-s", type=float, default=600, help="longest wait for one answer")
    args = smoke.parse(parser, steps=3, tokens=8, batch=2, seq_len=32, batched_steps=2,
                       trainer_steps=3, wait_s=240)  # fmt: skip
    rng = np.random.default_rng(0)
    with postgres_database() as url, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        _, key = project_key(url)
        model_dir = build_model_dir(home / "models" / BASE)
        vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
        pool = f"bench-sessions-{secrets.token_hex(3)}"  # its own queue in a shared Redis
        registry = {BASE: {"path": str(model_dir), "seq_len": args.seq_len, "pool": pool}}
        env = server_env(url, home, TORCHYARD_BASE_MODELS=json.dumps(registry))
        tiny = [_datums(rng, 1, args.tokens, vocab) for _ in range(args.steps + 1)]
        batched = [_datums(rng, args.batch, args.seq_len, vocab) for _ in range(args.batched_steps)]
        logs = [home / "uvicorn.log", home / "w.log"]
        with (
            api_server(env, logs[0]) as api,
            worker(env, pool, logs[1]),
            _explained(logs),
        ):
            os.environ.update(TINKER_BASE_URL=f"{api.url}/tinker", TINKER_API_KEY=f"tml-{key}")
            for name in ("TINKER_CREDENTIAL_CMD", "TINKER_TAGS", "TINKER_PROJECT_ID"):
                os.environ.pop(name, None)
            import tinker

            note("session: placement and load ...")
            service = tinker.ServiceClient()
            client = service.create_lora_training_client(
                BASE, rank=RANK, seed=0, train_unembed=False
            ).result(timeout=args.wait_s)
            first = _service_steps(client, tiny[:1], args.wait_s)[0]
            note("session: tiny steps ...")
            since = datetime.now(UTC)
            through = _service_steps(client, tiny[1:], args.wait_s)
            until = datetime.now(UTC)
            held = _where_the_time_went(url, client.model_id, since, until)
            note("session: batched steps ...")
            batched_s = _service_steps(client, batched, args.wait_s)
            pipelined_s = _pipelined_steps(client, batched, args.wait_s)
            service.close("success").result(timeout=args.wait_s)
            note("trainer: LoRA SFT job ...")
            headers = {"Authorization": f"Bearer {key}"}
            trainer_tps = _trainer_tokens_per_s(api.url, headers, home, model_dir, pool, args)
        note("in process ...")  # once the servers are gone: the same model, nothing beside it
        in_process = _in_process_steps(model_dir, args.seq_len, tiny[1:])
    service_ms, local_ms = summary_ms(through), summary_ms(in_process)
    tokens = args.batch * args.seq_len
    session_tps = tokens / statistics.median(batched_s)
    pipelined_tps = tokens * len(batched) / pipelined_s
    emit(
        {
            "bench": "sessions",
            "latency": {
                "first_step_s": round(first, 2),
                "service": service_ms,
                "in_process": local_ms,
                "p50_added_ms": round(service_ms["p50_ms"] - local_ms["p50_ms"], 2),
                "goal_p50_added_ms": 30,
                "in_the_service": held,
            },
            "throughput": {
                "tokens_per_step": tokens,
                "session_tokens_per_s": round(session_tps, 1),
                "pipelined_tokens_per_s": round(pipelined_tps, 1),
                "trainer_tokens_per_s": round(trainer_tps, 1),
                "ratio": round(session_tps / trainer_tps, 3),
                "pipelined_ratio": round(pipelined_tps / trainer_tps, 3),
                "goal_ratio": 0.9,
            },
        }
    )


if __name__ == "__main__":
    main()
