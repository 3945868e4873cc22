"""Training sessions against the built-in trainer (issue 47): a small registered Llama with a
ChatML tokenizer, the LoRA SFT spec a session's training client equals, and the trainer's own
batches as the Tinker client's datums.

A session trains with `cross_entropy` summed over tokens; the trainer's step loss is the summed
token cross-entropy over the global batch divided by N, its supervised positions
(`trainer.data.batches`). So each datum's `weights` are its supervised positions / N: the
session's `loss:sum` is then the trainer's loss and its gradients the trainer's. A packed row
becomes one datum per example (segment): positions restart at each, and attention stays inside
each, exactly as the trainer's packed forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from jobspec.job import JobSpec, SessionJobSpec
from tests.support.sft_data import bpe_tokenizer, messages_records, write_jsonl
from tests.support.training import TINY_LLAMA
from trainer.data.rows import IGNORE_INDEX, Rows
from trainer.data.sampler import GlobalBatchSampler

BASE = "session-llama"  # the registered base model of the session tests' API
BROKEN = "broken-llama"  # registered, but without model files: its session job fails at load
SEED = 7
RANK = 8
LR = 2e-3
MICRO_BATCH = 4
SEQ_LEN = 128
# The trainer's AdamW as a session's `AdamParams` gives it: torch's default eps, no decay, the
# trainer's default clip (`optim.grad_clip` 1.0).
ADAM = {"learning_rate": LR, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0,
        "grad_clip_norm": 1.0}  # fmt: skip
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def session_llama_dir(out: Path) -> Path:
    """`TINY_LLAMA` with the stdlib set's ChatML BPE tokenizer, seeded weights, saved to `out`
    (a registered base model's directory). Returns `out`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = bpe_tokenizer()
    shape = {k: v for k, v in TINY_LLAMA.items() if k not in ("model_type", "vocab_size")}
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0, **shape
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def chat_data(out: Path) -> Path:
    """The stdlib set as chat messages (`messages` JSONL) at `out`."""
    return write_jsonl(out, messages_records(200))


def lora_sft_spec(model_dir: Path, data: Path, *, max_steps: int) -> JobSpec:
    """The built-in trainer's LoRA SFT that a session's training client (rank `RANK`, seed
    `SEED`, no unembedding adapter) trained with `ADAM` and constant lr equals."""
    return JobSpec.model_validate(
        {
            "name": "session-twin",
            "seed": SEED,
            "data": {"uri": str(data), "max_truncated_share": 1.0},
            "model": {"kind": "hf", "hf": {"path_or_id": str(model_dir)}, "seq_len": SEQ_LEN},
            "lora": {"r": RANK, "alpha": 32, "dropout": 0.0, "target_modules": TARGETS},
            "optim": {"lr": LR, "weight_decay": 0.0, "warmup_steps": 0, "schedule": "constant"},
            "train": {"micro_batch_size": MICRO_BATCH, "max_steps": max_steps},
            "eval": {"num_batches": 1},
        }
    )


def step_batches(rows: Rows, spec: JobSpec, num_steps: int) -> list[np.ndarray]:
    """The row indices of the trainer's first `num_steps` global batches (its sampler, seeded
    as the trainer seeds it, on one rank)."""
    sampler = GlobalBatchSampler(
        num_chunks=len(rows),
        seed=spec.seed,
        micro_batch_size=spec.train.micro_batch_size,
        grad_accum_steps=spec.train.grad_accum_steps,
        rank=0,
        world_size=1,
    )
    return [sampler.next_global_batch() for _ in range(num_steps)]


def datums(rows: Rows, indices: np.ndarray) -> list[dict[str, np.ndarray]]:
    """One global batch as the client's datums: per example (segment) of each row, `tokens`
    (T,) int64, `target_tokens` (T,) int64 (unsupervised positions: 0) and `weights` (T,)
    float32, its supervised positions / N."""
    count = max(1, rows.num_supervised(indices))
    out = []
    for i in indices:
        ids, labels = np.asarray(rows.input_ids[i]), np.asarray(rows.labels[i])
        segments = np.asarray(rows.segment_ids[i])
        for segment in np.unique(segments):
            where = segments == segment
            supervised = labels[where] != IGNORE_INDEX
            if not supervised.any():
                continue  # padding, or an example with nothing to learn: adds nothing
            out.append(
                {
                    "tokens": ids[where].astype(np.int64),
                    "target_tokens": np.where(supervised, labels[where], 0).astype(np.int64),
                    "weights": (supervised / count).astype(np.float32),
                }
            )
    return out


def random_batches(count: int, seed: int = SEED) -> list[list[dict[str, np.ndarray]]]:
    """`count` batches of 4 datums of 32 random tokens (ids 1-59), every position weighted 1:
    steps whose losses only need to be repeatable, not the trainer's."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = rng.integers(1, 60, size=(4, 33))
        out.append(
            [
                {"tokens": row[:-1], "target_tokens": row[1:], "weights": np.ones(32, np.float32)}
                for row in ids
            ]
        )
    return out


def tinker_datums(batch: list[dict[str, np.ndarray]]) -> list[Any]:
    """`batch` (from `datums`) as the official client's `tinker.Datum`s."""
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


def tinker_session_spec(model_dir: Path) -> SessionJobSpec:
    """The session job spec of a training client of `model_dir` (rank `RANK`, seed `SEED`, no
    unembedding adapter), as `create_model` makes it."""
    return SessionJobSpec.model_validate(
        {
            "name": "session",
            "seed": SEED,
            "model": {"kind": "hf", "hf": {"path_or_id": str(model_dir)}, "seq_len": 128},
            "session": {
                "session_id": "ses_0",
                "model_id": "ses_0:train:0",
                "base_model": "session-llama",
                "lora_rank": RANK,
                "lora_seed": SEED,
                "train_unembed": False,
            },
        }
    )


def forward_backward_body(batch: list[dict[str, np.ndarray]], seq_id: int, **kw: Any) -> bytes:
    """The protobuf `forward_backward` body the client sends for `batch` (from `datums`)."""
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.types import ForwardBackwardInput, ForwardBackwardRequest

    request = ForwardBackwardRequest(
        forward_backward_input=ForwardBackwardInput(data=tinker_datums(batch), **kw),
        model_id="ses_0:train:0",
        seq_id=seq_id,
    )
    return bytes(forward_backward_request_to_proto(request).SerializeToString())


def run_and_sampler(engine: Any, project_id: str, session_id: str, job_id: int) -> tuple[str, str]:
    """(a training client's model id, a sampling session's id) of the project's session
    `session_id`, the client's rows on the existing job `job_id` (never run as a session): the
    route-wide tests' resources for `{training_run_id}` and `{sampler_id}`."""
    from core.platform.db import session_scope
    from core.platform.tables import SessionModel, utcnow
    from core.sessions import samplers, training_clients

    with session_scope(engine) as s:
        model_id = training_clients.model_id(session_id, 0)
        s.add(SessionModel(id=model_id, project_id=project_id, session_id=session_id,
                           model_seq_id=0, base_model="llama-tiny", lora_rank=8,
                           job_id=job_id, created_at=utcnow()))  # fmt: skip
        s.flush()
        path = samplers.sampler_path(model_id, "w")
        sampler = samplers.create(
            session=s, project_id=project_id, session_id=session_id, model_path=path
        )
        return model_id, sampler.id
