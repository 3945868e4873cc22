"""What a session job's program computes for its client's calls (issue 47): the model it
serves, `forward_backward` / `forward`, and `optim_step`, in the Tinker API's terms
(docs/TINKER-WIRE.md) on the built-in trainer's own parts.

- The model: the session's base model through the trainer's `build_network`, with LoRA
  applied by the trainer's `apply_lora` (rank, seed and targets from the client's
  `LoraConfig`; alpha `LORA_ALPHA`, no dropout), so it is the model a LoRA SFT job of the same
  base, rank and seed trains.
- `forward_backward`: the call's datums right-padded into one (B, T) batch, logits of the
  model's plain causal path (padding only trails, so it changes no real position), the target
  tokens' log-probabilities (`trainer.methods.grpo.token_logps`), the loss
  (`trainer.methods.session_losses.session_loss`, a sum over tokens) and its backward: the
  gradients add up until the next `optim_step`. The answer is the protobuf
  `ForwardBackwardOutput`: per datum `logprobs` (float32, the datum's length, or (length, K)
  for top-K targets) and the metric `loss:sum`.
- `save_weights` (the client's `save_state`): the adapters and the optimizer through the
  trainer's `Checkpointer` (DCP, `AdapterOptimizerState`) at the job's checkpoint directory,
  `step_<n>`, n the optim steps so far or one past the job's last checkpoint (a `checkpoint`
  event: listed and exportable like any checkpoint); the name maps to its step in
  `tinker_names.json` there. `load_weights`: a checkpoint directory
  (the worker copied it into the run dir) loaded the same way, the optimizer's state too or a
  fresh optimizer.
- `optim_step`: `torch.optim.AdamW` (`trainer.optim.build_optimizer`: the trainer's parameter
  groups) with the call's `AdamParams` (learning rate, betas, eps, decoupled weight decay on the
  decayed group) and, when `grad_clip_norm` > 0, the trainer's global-norm clipping; then the
  gradients are dropped.

Errors of the client's making raise `CallError` (Tinker's category `user`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor

from dataformat.tinker_wire import schema
from jobspec.job import JobSpec, SessionJobSpec
from jobspec.session import NAMES_FILE
from trainer.checkpoint.checkpointer import Checkpointer, list_checkpoints
from trainer.distributed import DistInfo
from trainer.events import Reporter
from trainer.methods.base import autocast
from trainer.methods.grpo import token_logps
from trainer.methods.session_losses import LOSS_SUM, LossInputError, session_loss
from trainer.models.network import Network, build_network, model_state
from trainer.optim import build_optimizer, clip_gradients

# Tinker's LoRA scale: alpha fixed at 32 whatever the rank (its LoRA primer), no dropout.
LORA_ALPHA = 32
# The linear layers each of the client's switches adapts, by their Llama-family names.
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}  # the wire's DType values we read
KEEP_CHECKPOINTS = 10**6  # a session's saves are the client's: none is deleted by retention


class CallError(ValueError):
    """A call the session cannot run as sent: the client's mistake (category `user`)."""


def trainer_spec(spec: SessionJobSpec) -> JobSpec:
    """The built-in trainer's view of a session job: its model, its seed (the adapters' init)
    and a `lora` section of the client's rank and targets; `data` is never read."""
    lora = spec.session
    targets = [
        *(ATTN_MODULES if lora.train_attn else ()),
        *(MLP_MODULES if lora.train_mlp else ()),
        *(UNEMBED_MODULES if lora.train_unembed else ()),
    ]
    if not targets:
        raise CallError(
            "the LoRA config trains nothing: set train_attn, train_mlp or train_unembed"
        )
    return JobSpec.model_validate(
        {
            "name": spec.name,
            "seed": spec.seed,
            "data": {"uri": "session"},
            "model": spec.model.model_dump(exclude_none=True),
            "lora": {
                "r": lora.lora_rank,
                "alpha": LORA_ALPHA,
                "dropout": 0.0,
                "target_modules": targets,
            },
        }
    )


@dataclass
class Output:
    """One `forward_backward`'s answer before encoding: per datum log-probabilities
    (float32 (length,) or (length, K)) and the loss summed over every token."""

    logprobs: list[np.ndarray]
    loss_sum: float


class SessionModel:
    """The served training client: the LoRA network, its optimizer and the loss summed over
    the `forward_backward` calls since the last `optim_step` (for the step's metric)."""

    def __init__(self, spec: SessionJobSpec, device: torch.device) -> None:
        self.spec = trainer_spec(spec)
        self.device = device
        self.network: Network = build_network(self.spec, device=device)
        self.model = self.network.model
        self.model.train()
        self._fresh_optimizer()
        self.step = 0  # optim_steps applied (never goes back: it names checkpoint directories)
        self.pending_loss = 0.0
        self.unsaved = False  # weights changed since the last save or resume (a step, a load)

    def _fresh_optimizer(self) -> None:
        self.optimizer = build_optimizer(self.model, self.spec.optim)
        # the trainer's decayed group (matrices): `weight_decay` applies to it alone
        self.decayed = [g for g in self.optimizer.param_groups if g["weight_decay"] > 0]

    def _states(self) -> dict[str, Any]:
        return {"model_optim": model_state(self.model, self.optimizer, self.network)}

    def save(self, root: str, name: str | None, *, overwrite: bool, reporter: Reporter) -> int:
        """Save the adapters and the optimizer's state under `root` (the job's checkpoint
        directory) as `name` (None: unnamed, the state a stopped program keeps for the job's
        next attempt); returns the checkpoint's step. Raises `CallError` when `name` exists
        and not `overwrite`."""
        fs, base = fsspec.core.url_to_fs(root)
        names_path = f"{base.rstrip('/')}/{NAMES_FILE}"
        names: dict[str, int] = json.loads(fs.cat_file(names_path)) if fs.exists(names_path) else {}
        if name is not None and name in names and not overwrite:
            raise CallError(f"a checkpoint named {name!r} exists (overwrite it with overwrite)")
        # a directory of its own, past every earlier one: a load changes the weights without
        # a step, and an earlier attempt's program may have saved at these steps
        step = max([self.step, *(c.step + 1 for c in list_checkpoints(root))])
        self._checkpointer(root, reporter).save(step, force=True)
        self.unsaved = False
        if name is not None:
            names[name] = step
            fs.pipe_file(names_path, json.dumps(names).encode())
        return step

    def resume(self, root: str, reporter: Reporter) -> int | None:
        """Continue from the job's own latest complete checkpoint under `root` (an earlier
        attempt's save: the client's `save_state`, or the state a stopped program kept), with
        its optimizer state; its step, or None (none saved: the base model's fresh adapters).
        Optim steps after that checkpoint are lost with the attempt that made them."""
        step = self._checkpointer(root, reporter).load_latest()
        if step is not None:
            self.step, self.unsaved = step, False
        return step

    def _checkpointer(self, root: str, reporter: Reporter) -> Checkpointer:
        return Checkpointer(
            root=root,
            spec=self.spec.checkpoint.model_copy(update={"keep_last": KEEP_CHECKPOINTS}),
            states=self._states(),
            rank_states={},
            job_spec_json=self.spec.model_dump_json(indent=2),
            dist_info=DistInfo(rank=0, local_rank=0, world_size=1, device=self.device),
            reporter=reporter,
        )

    def load(self, uri: str, *, optimizer: bool) -> None:
        """Load the adapters (and, with `optimizer`, the optimizer's state; else a fresh
        optimizer) from the checkpoint directory `uri`."""
        states = self._states()
        dcp.load(states, storage_reader=dcp.FileSystemReader(uri), no_dist=True)
        if not optimizer:
            self._fresh_optimizer()
        self.unsaved = True  # another state than this job's own latest save

    def forward_backward(self, request: Any, *, forward_only: bool) -> Output:
        """Run a decoded `ForwardBackwardRequest` (its `data`, `loss_fn`, `loss_fn_config`);
        backpropagate unless `forward_only`. Raises `CallError` for data the loss cannot
        take."""
        datums = [_datum(d, i) for i, d in enumerate(request.data)]
        if not datums:
            raise CallError("forward_backward needs at least one datum")
        batch = _batch(datums, self.device)
        config = _loss_config(request)
        context = torch.no_grad() if forward_only else torch.enable_grad()
        with context:
            with autocast(self.device, self.spec.train.precision):
                logits = self.model(batch.input_ids)
            target_logprobs = _target_logprobs(logits, batch.inputs["target_tokens"])
            mask = batch.mask if target_logprobs.dim() == 2 else batch.mask.unsqueeze(-1)
            mask = mask.expand_as(target_logprobs).to(target_logprobs.dtype)
            try:
                result = session_loss(
                    request.loss_fn, target_logprobs, batch.inputs, config, mask=mask
                )
            except LossInputError as exc:
                raise CallError(str(exc)) from exc
            if not forward_only:
                result.loss.backward()
                self.pending_loss += result.metrics[LOSS_SUM]
        logprobs = result.logprobs.float().cpu().numpy()
        return Output(
            logprobs=[logprobs[i, : len(d.tokens)] for i, d in enumerate(datums)],
            loss_sum=result.metrics[LOSS_SUM],
        )

    def optim_step(self, adam: dict[str, Any]) -> dict[str, float]:
        """One AdamW step with `adam` (`AdamParams`: `learning_rate`, `beta1`, `beta2`,
        `eps`, `weight_decay`, `grad_clip_norm`; 0 clips nothing), then zero the gradients.
        Returns the step's metrics: the gradient norm before clipping, the learning rate and
        the loss summed since the last step."""
        lr = float(adam["learning_rate"])
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            group["betas"] = (float(adam["beta1"]), float(adam["beta2"]))
            group["eps"] = float(adam["eps"])
        for group in self.decayed:
            group["weight_decay"] = float(adam["weight_decay"])
        clip = float(adam["grad_clip_norm"])
        grad_norm = float(clip_gradients(self.model.parameters(), clip if clip > 0 else None))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.unsaved = True
        loss, self.pending_loss = self.pending_loss, 0.0
        return {"grad_norm:mean": grad_norm, "learning_rate:mean": lr, "loss:sum": loss}


@dataclass(frozen=True)
class _Datum:
    tokens: np.ndarray  # (T,) int64
    inputs: dict[str, np.ndarray]  # `loss_fn_inputs`, each (T,) or (T, K)


@dataclass(frozen=True)
class _Batch:
    input_ids: Tensor  # (B, T) int64, right-padded with 0
    mask: Tensor  # (B, T) 1 for a datum's positions, 0 for padding
    inputs: dict[str, Tensor]  # each (B, T) or (B, T, K), padded with 0


def _datum(message: Any, index: int) -> _Datum:
    parts = []
    for chunk in message.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise CallError(f"datum {index}: only encoded_text chunks are served")
        parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype="<i4"))
    tokens = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    if tokens.size == 0:
        raise CallError(f"datum {index}: model_input holds no tokens")
    inputs = {key: _tensor(value, f"datum {index}: {key}") for key, value in
              message.loss_fn_inputs.items()}  # fmt: skip
    if "target_tokens" not in inputs:
        raise CallError(f"datum {index}: loss_fn_inputs needs target_tokens")
    for key, array in inputs.items():
        if array.ndim == 0 or array.shape[0] != tokens.size:
            raise CallError(
                f"datum {index}: loss_fn_inputs[{key!r}] has shape {array.shape}, model_input "
                f"{tokens.size} tokens"
            )
    return _Datum(tokens=tokens, inputs=inputs)


def _tensor(message: Any, what: str) -> np.ndarray:
    """A wire `Tensor` (dense, or sparse CSR for 2-D) as a numpy array of its shape."""
    dtype = _DTYPES.get(message.dtype)
    if dtype is None:
        raise CallError(f"{what}: unsupported dtype {message.dtype}")
    shape = tuple(int(s) for s in message.shape)
    try:
        if message.WhichOneof("encoding") == "sparse_csr":
            csr = message.sparse_csr
            if len(shape) != 2:
                raise CallError(f"{what}: a sparse tensor must be 2-D, got shape {shape}")
            dense = np.zeros(shape, dtype=dtype)
            crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
            cols = np.frombuffer(csr.col_indices, dtype=np.int64)
            values = np.frombuffer(csr.values, dtype=dtype)
            rows = np.repeat(np.arange(shape[0]), np.diff(crow))
            dense[rows, cols] = values
            return dense
        return np.frombuffer(message.dense, dtype=dtype).reshape(shape).copy()
    except (ValueError, IndexError) as exc:
        raise CallError(f"{what}: {exc}") from exc


def _batch(datums: list[_Datum], device: torch.device) -> _Batch:
    length = max(len(d.tokens) for d in datums)
    ids = np.zeros((len(datums), length), np.int64)
    mask = np.zeros((len(datums), length), np.float32)
    for i, d in enumerate(datums):
        ids[i, : len(d.tokens)] = d.tokens
        mask[i, : len(d.tokens)] = 1.0
    keys = set(datums[0].inputs)
    if any(set(d.inputs) != keys for d in datums):
        raise CallError("every datum of a call needs the same loss_fn_inputs keys")
    inputs = {}
    for key in sorted(keys):
        trailing = datums[0].inputs[key].shape[1:]
        if any(d.inputs[key].shape[1:] != trailing for d in datums):
            raise CallError(f"loss_fn_inputs[{key!r}] differs in its trailing shape by datum")
        padded = np.zeros((len(datums), length, *trailing), datums[0].inputs[key].dtype)
        for i, d in enumerate(datums):
            padded[i, : len(d.tokens)] = d.inputs[key]
        tensor = torch.from_numpy(padded).to(device)
        inputs[key] = tensor.long() if key == "target_tokens" else tensor.float()
    return _Batch(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device), inputs)


def _target_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """(B, T) or (B, T, K) fp32 log-probabilities of `targets` under `logits` (B, T, V)."""
    vocab = logits.shape[-1]
    if int(targets.min()) < 0 or int(targets.max()) >= vocab:
        raise CallError(f"target_tokens must lie in [0, {vocab}) (the model's vocabulary)")
    if targets.dim() == 2:
        return token_logps(logits, targets)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets)


def _loss_config(request: Any) -> dict[str, float | str]:
    config: dict[str, float | str] = dict(request.loss_fn_config)
    for key, value in request.loss_fn_config_v2.items():
        kind = value.WhichOneof("value")
        if kind is not None:
            config[key] = getattr(value, kind)
    return config


def encode_output(output: Output) -> bytes:
    """The protobuf `ForwardBackwardOutput` of `output`: one `ArrayRecord` holding every
    datum's `logprobs` (float32 bytes, concatenated, with byte offsets) and `loss:sum`."""
    pb = schema()
    arrays = [np.ascontiguousarray(a, dtype="<f4") for a in output.logprobs]
    offsets = np.cumsum([0, *(a.nbytes for a in arrays)]).astype("<i8")
    trailing = list(arrays[0].shape[1:]) if arrays else []
    record = pb.ArrayRecord(num_datums=len(arrays))
    record.fields["logprobs"].CopyFrom(
        pb.BatchedTensor(
            data=b"".join(a.tobytes() for a in arrays),
            offsets=offsets.tobytes(),
            dtype=pb.DTYPE_FLOAT32,
            trailing_shape=trailing,
        )
    )
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    message.loss_fn_outputs.append(record)
    message.metrics[LOSS_SUM] = output.loss_sum
    return bytes(message.SerializeToString())
