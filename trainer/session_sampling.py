"""Sampling in a session job's program (issue 47): snapshots of the served training client's
adapters (`save_weights_for_sampler`) and completions sampled from them (`sample`), in the
Tinker API's terms (docs/TINKER-WIRE.md).

- A snapshot is a copy of the adapters' tensors (the trainable parameters: small beside the
  base model) under its name, taken when the training client's `save_weights_for_sampler` runs
  in its `seq_id` lane. Named ones live as long as the program; unnamed ones
  (`save_weights_and_get_sampling_client`, names starting `~`) only the newest
  `KEEP_EPHEMERAL`.
- A sample call swaps a snapshot's tensors into the model, samples with the trainer's own GRPO
  sampler (`trainer.methods.rollouts.sample_group`: temperature, top-k, top-p, stop ids,
  transformers' KV cache), computes the log-probabilities with one plain forward pass of the
  model over prompt + completion (so they equal `forward_backward`'s on the same tokens: the
  model's distribution at temperature 1, before top-k/top-p), and swaps the training weights
  back: where a sample falls between training calls changes nothing either answers.
- Stop strings need the model's tokenizer: a completion is cut after the first token at which
  its decoded text holds one (that token kept), as vLLM keeps a stop's text out of later tokens.

Errors of the client's making raise `CallError` (category `user`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dataformat.tinker_wire import schema
from trainer.methods.base import autocast
from trainer.methods.grpo import token_logps
from trainer.methods.rollouts import Sampling, sample_group
from trainer.session_calls import CallError, SessionModel

EPHEMERAL = "~"  # names of unnamed snapshots (`core.sessions.samplers.EPHEMERAL`)
KEEP_EPHEMERAL = 32  # unnamed snapshots kept; a sample of an older one is a user error


class Sampler:
    """The snapshots of one served training client, and sampling from them."""

    def __init__(self, served: SessionModel) -> None:
        self.served = served
        self.snapshots: OrderedDict[str, dict[str, Tensor]] = OrderedDict()

    def save(self, name: str) -> None:
        """Snapshot the adapters now as `name` (replacing one of that name)."""
        params = self.served.model.named_parameters()
        self.snapshots[name] = {n: p.detach().clone() for n, p in params if p.requires_grad}
        self.snapshots.move_to_end(name)
        ephemeral = [n for n in self.snapshots if n.startswith(EPHEMERAL)]
        for old in ephemeral[: max(0, len(ephemeral) - KEEP_EPHEMERAL)]:
            del self.snapshots[old]

    @contextmanager
    def _weights(self, name: str) -> Iterator[None]:
        snapshot = self.snapshots.get(name)
        if snapshot is None:
            raise CallError(
                f"no sampler weights named {name!r} in this session job (never saved, dropped "
                f"as one of more than {KEEP_EPHEMERAL} unnamed ones, or saved by an earlier "
                "attempt of the job)"
            )
        params = dict(self.served.model.named_parameters())
        training = {n: params[n].detach().clone() for n in snapshot}
        with torch.no_grad():
            for n, tensor in snapshot.items():
                params[n].copy_(tensor)
        try:
            yield
        finally:
            with torch.no_grad():
                for n, tensor in training.items():
                    params[n].copy_(tensor)

    def sample(self, body: bytes) -> bytes:
        """Answer a relayed `sample` call (the client's `SampleRequest` as the API validated
        it, and the weights' `name`): the protobuf `SampleResponse`. Raises `CallError` for a
        prompt the model cannot take or weights it does not hold."""
        request: dict[str, Any] = json.loads(body)
        params: dict[str, Any] = request["sampling_params"]
        prompt = [t for chunk in request["prompt"]["chunks"] for t in chunk["tokens"]]
        network, device = self.served.network, self.served.device
        seq_len = self.served.spec.model.seq_len
        if not prompt:
            raise CallError("the prompt holds no tokens")
        if len(prompt) >= seq_len:
            raise CallError(f"the prompt has {len(prompt)} tokens; the model takes {seq_len}")
        if max(prompt) >= network.vocab_size:
            raise CallError(f"prompt tokens must lie in [0, {network.vocab_size})")
        stop = params.get("stop")
        sampling = Sampling(
            group_size=int(request["num_samples"]),
            max_new_tokens=min(params.get("max_tokens") or seq_len, seq_len - len(prompt)),
            temperature=float(params["temperature"]),
            top_p=float(params["top_p"]),
            top_k=None if params["top_k"] <= 0 else int(params["top_k"]),
            stop_ids=self._stop_ids(stop),
            vocab_size=network.vocab_size,
        )
        generator = torch.Generator(device=device)
        if params.get("seed") is None:
            generator.seed()
        else:
            generator.manual_seed(int(params["seed"]))
        prompt_ids = torch.tensor(prompt, dtype=torch.long, device=device)
        with self._weights(request["name"]):
            with autocast(device, self.served.spec.train.precision):  # as GRPO samples
                ids, mask = sample_group(self.served.model, prompt_ids, sampling, generator)
            lengths = mask.sum(dim=1).tolist()
            stopped = [n > 0 and int(ids[i, n - 1]) in sampling.stop_ids for i, n in
                       enumerate(lengths)]  # fmt: skip
            if isinstance(stop, str) or (stop and isinstance(stop[0], str)):
                cut = [self._cut(ids[i, :n].tolist(), stop) for i, n in enumerate(lengths)]
                stopped = [c is not None or s for c, s in zip(cut, stopped, strict=True)]
                lengths = [n if c is None else c for c, n in zip(cut, lengths, strict=True)]
            logprobs = self._logprobs(prompt_ids, ids)
        return _encode(
            prompt, ids, logprobs, lengths, stopped, bool(request.get("prompt_logprobs"))
        )

    def _stop_ids(self, stop: Any) -> tuple[int, ...]:
        """The token ids that end a sample: the model's EOS, unless `stop` is [] (none); with
        ids, those too."""
        if stop == []:
            return ()
        ids = [t for t in stop if isinstance(t, int)] if isinstance(stop, list) else []
        return tuple(sorted({*self._eos(), *ids}))

    def _eos(self) -> list[int]:
        tokenizer = self.served.network.tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            lm = getattr(self.served.model, "lm", None)
            eos = getattr(getattr(lm, "config", None), "eos_token_id", None)
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def _cut(self, tokens: list[int], stop: str | list[str]) -> int | None:
        """How many of `tokens` to keep: up to the first whose decoded prefix holds a stop
        string; None when none does."""
        tokenizer = self.served.network.tokenizer
        if tokenizer is None:
            raise CallError("stop strings need a tokenizer; this model has none (give ids)")
        strings = [stop] if isinstance(stop, str) else stop
        for k in range(1, len(tokens) + 1):
            text = tokenizer.decode(tokens[:k])
            if any(s in text for s in strings):
                return k
        return None

    def _logprobs(self, prompt: Tensor, ids: Tensor) -> Tensor:
        """(G, T0 + C) fp32: at position t the log-probability of token t given the tokens
        before it (position 0: NaN), by one forward pass over prompt + completion."""
        full = torch.cat([prompt.view(1, -1).expand(ids.shape[0], -1), ids], dim=1)
        model = self.served.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), autocast(self.served.device, self.served.spec.train.precision):
                logits = model(full[:, :-1])
            scored = token_logps(logits, full[:, 1:])
        finally:
            model.train(was_training)
        nan = torch.full((ids.shape[0], 1), float("nan"), device=scored.device)
        return torch.cat([nan, scored], dim=1)


def _encode(
    prompt: list[int],
    ids: Tensor,
    logprobs: Tensor,
    lengths: list[int],
    stopped: list[bool],
    with_prompt: bool,
) -> bytes:
    """The protobuf `SampleResponse`: per sample its tokens (int32), their log-probabilities
    (float32) and stop reason; the prompt's log-probabilities (float32, NaN at 0) if asked."""
    pb = schema()
    message = pb.SampleResponse()
    start = len(prompt)
    ids_np = ids.cpu().numpy()
    lp = logprobs.float().cpu().numpy()
    for i, (n, stop) in enumerate(zip(lengths, stopped, strict=True)):
        message.sequences.append(
            pb.SampledSequence(
                stop_reason=pb.STOP_REASON_STOP if stop else pb.STOP_REASON_LENGTH,
                tokens=np.ascontiguousarray(ids_np[i, :n], dtype="<i4").tobytes(),
                logprobs=np.ascontiguousarray(lp[i, start : start + n], dtype="<f4").tobytes(),
            )
        )
    if with_prompt:
        message.prompt_logprobs = np.ascontiguousarray(lp[0, :start], dtype="<f4").tobytes()
    return bytes(message.SerializeToString())
