"""DPO training (`method.kind: dpo`): the frozen reference model, one optimizer step's
forward/backward over preference pairs, and the evaluation of held-out pairs.

Data: two row sets of equal length, `chosen` and `rejected` (the rows contract of
`trainer.data.rows`, written by the data pipeline for `preference` datasets); row i of each is
the same prompt followed by one answer, supervised on the answer only, one example per row
(right padding). A micro-batch is `train.micro_batch_size`
pairs: the chosen and rejected rows are concatenated into one batch of 2B rows, so the policy
runs one forward and one backward per micro-batch (one DDP/FSDP reduction per step, as for
SFT) and the reference one no-grad forward, as TRL's `concatenated_forward` does.

The reference (`DPOSpec.reference: initial`) is the starting weights:
- under lora/qlora, the policy itself with its adapters disabled (peft's `disable_adapter()`;
  no second copy in memory, and a 4-bit base stays 4-bit);
- otherwise a second copy built from the same source as the policy (seeded init, model files,
  `init_from` checkpoint), frozen, in eval mode, sharded like the policy under fsdp (the same
  mesh and `MixedPrecisionPolicy`), a plain module under ddp. Building it from the source
  rather than copying the policy keeps it the starting weights when a run resumes from its
  own checkpoint, and keeps it out of checkpoints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh

from dataformat.errors import InvalidJobError
from jobspec.job import DPOSpec, JobSpec
from trainer.data.rows import IGNORE_INDEX, Batch, Rows
from trainer.distributed import DistInfo, no_sync
from trainer.methods.base import autocast
from trainer.methods.dpo import dpo_loss, mean_metrics, pair_statistics, sequence_logps
from trainer.models.network import Network, build_network
from trainer.parallel.parallelize import apply_fsdp, set_gradient_sync

if TYPE_CHECKING:
    from trainer.loop import Run

_CHECK_ROWS = 8192
Forward = Callable[[nn.Module, Batch], Tensor]  # (model, batch of B rows) -> logits (B, T, V)


def logits_of(model: nn.Module, batch: Batch) -> Tensor:
    """Logits (B, T, V) of `batch`. A preference row is one right-padded example, so plain
    causal attention over `input_ids` is exact at every supervised position."""
    return model(batch.input_ids)


def concat_pairs(chosen: Batch, rejected: Batch) -> Batch:
    """One batch of 2B rows: the B chosen rows, then the B rejected ones."""
    if chosen.input_ids.shape != rejected.input_ids.shape:
        raise ValueError(
            f"chosen {tuple(chosen.input_ids.shape)} and rejected "
            f"{tuple(rejected.input_ids.shape)} batches differ in shape"
        )
    return Batch(*(torch.cat([c, r]) for c, r in zip(chosen, rejected, strict=True)))


@dataclass
class Reference:
    """The frozen reference pi_ref: `model` as it is (a frozen copy) or, with `peft_model`,
    the policy `model` with the adapters of `peft_model` disabled."""

    model: nn.Module
    peft_model: Any | None = None  # peft.PeftModel whose adapters live inside `model`

    @torch.no_grad()
    def logps(self, batch: Batch, *, forward: Forward, precision: str) -> Tensor:
        """(B,) fp32 summed answer log-probabilities under the reference, in eval mode."""
        adapters_off = (
            self.peft_model.disable_adapter() if self.peft_model else contextlib.nullcontext()
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with adapters_off, autocast(batch.input_ids.device, precision):
                logits = forward(self.model, batch)
        finally:
            self.model.train(was_training)
        return sequence_logps(logits, batch.labels)[0]


def build_reference(
    spec: JobSpec,
    network: Network,
    model: nn.Module,
    *,
    dist_info: DistInfo,
    mesh: DeviceMesh | None,
    init_from: str | None = None,
) -> Reference | None:
    """The reference of a DPO run whose policy is `model` (parallelized, from `network`);
    None when `spec.method.dpo.reference` is `none`. As `starting_weights`."""
    if _dpo_spec(spec).reference == "none":
        return None
    return starting_weights(
        spec, network, model, dist_info=dist_info, mesh=mesh, init_from=init_from
    )


def starting_weights(
    spec: JobSpec,
    network: Network,
    model: nn.Module,
    *,
    dist_info: DistInfo,
    mesh: DeviceMesh | None,
    init_from: str | None = None,
) -> Reference:
    """The policy `model`'s starting weights, frozen: the policy with its adapters disabled
    under lora/qlora, else a copy built from the same source (see the module docstring).
    `init_from`: the checkpoint the policy started from (even when the run resumes from its
    own checkpoints); `mesh`: the policy's (the copy is sharded alike under fsdp).

    Raises `InvalidJobError` when the copy cannot be built (as `build_network`)."""
    if network.peft_model is not None:
        return Reference(model=model, peft_model=network.peft_model)
    frozen = build_network(
        spec, device=dist_info.device, init_from=init_from, dist_info=dist_info
    ).model
    frozen.requires_grad_(False)
    if spec.parallelism.strategy == "fsdp" and mesh is not None:
        apply_fsdp(frozen, mesh, spec.parallelism.fsdp)
    return Reference(model=frozen.eval())


def _dpo_spec(spec: JobSpec) -> DPOSpec:
    if spec.method.kind != "dpo" or spec.method.dpo is None:
        raise ValueError("not a DPO job (method.kind is not 'dpo')")
    return spec.method.dpo


@dataclass
class DPOMethod:
    """DPO as the loop's `trainer.loop.Method`: what a step's micro-batches do instead
    of SFT's cross-entropy, its metrics (`trainer.methods.dpo.METRICS`) and evaluation over
    held-out pairs. The run's `train_rows` / `eval_rows` hold the chosen answers; `rejected`
    the rejected ones aligned with them, (train, eval)."""

    spec: DPOSpec
    reference: Reference | None  # None: reference-free (log pi_ref = 0)
    precision: str = "fp32"  # `train.precision`: autocast of both forwards
    forward: Forward = logits_of
    rejected: tuple[Rows, Rows] | None = None  # needed by the `Method` calls only
    _sums: Tensor | None = field(default=None, repr=False)  # last step's pair_statistics

    def accumulate(self, run: Run) -> Tensor:
        """`Method.accumulate`: the step's pairs (chosen: `run.train_rows`, rejected: the
        aligned rows), normalised by the global batch's pairs (`accumulate_pairs`)."""
        rejected = self._rejected()[0]
        global_batch = run.sampler.next_global_batch()
        micro_batches = run.sampler.split(global_batch)
        pairs = pair_batches(run.rows[0], rejected, micro_batches, run.dist.device)
        return self.accumulate_pairs(
            list(pairs),
            model=run.model,
            train_model=run.parallel_model,
            global_pairs=len(global_batch),
            dp_size=run.dims.dp_size,
            scaler=run.scaler,
        )

    def train_metrics(self, run: Run) -> dict[str, float]:
        """`Method.train_metrics`: the last step's `METRICS` (a collective)."""
        return self.step_metrics(run.dist)

    def evaluate(self, run: Run) -> dict[str, float]:
        """`Method.evaluate`: `METRICS` over the held-out pairs of every rank."""
        rejected = self._rejected()[1]
        pairs = pair_batches(run.rows[1], rejected, run.eval_batches, run.dist.device)
        return self.evaluate_pairs(run.model, pairs, run.dist)

    def baseline_eval_loss(self, run: Run) -> float | None:
        """None: a pair's loss has no model-free reference (log 2 is the reference's own)."""
        return None

    def _rejected(self) -> tuple[Rows, Rows]:
        if self.rejected is None:
            raise InvalidJobError("method 'dpo' needs a preference dataset")
        return self.rejected

    def accumulate_pairs(
        self,
        pairs: Sequence[tuple[Batch, Batch]],
        *,
        model: nn.Module,
        train_model: nn.Module,
        global_pairs: int,
        dp_size: int,
        scaler: torch.amp.GradScaler | None = None,
    ) -> Tensor:
        """Forward and backward over this rank's micro-batches `pairs` of one step.

        `model`: the policy (FSDP-sharded or plain); `train_model`: what a training forward
        calls (DDP(model) or model). Each micro-batch backwards the sum of its pair losses x
        dp_size / global_pairs: the data-parallel gradient average (DDP, FSDP) then gives the
        gradient of the mean loss over the `global_pairs` pairs of the step, whatever their
        split into micro-batches and ranks (DPO's loss is per pair, not per token). Gradients
        are reduced on the last micro-batch only. Returns this rank's share of the step's mean
        loss, the sum of its pair losses / global_pairs (0-dim fp32, detached): the ranks'
        shares add up to the mean, as the token sums / N of SFT steps do (`trainer.data.batches`).
        """
        scale = dp_size / global_pairs
        device = pairs[0][0].input_ids.device
        loss_sum = torch.zeros((), device=device)
        sums = torch.zeros(8, dtype=torch.float64, device=device)
        for m, (chosen, rejected) in enumerate(pairs):
            last = m == len(pairs) - 1
            both = concat_pairs(chosen, rejected)
            ref = self._reference_logps(both)
            set_gradient_sync(model, last)
            with no_sync(train_model, skip_sync=not last):
                with autocast(device, self.precision):
                    logits = self.forward(train_model, both)
                losses, stats = self._score(logits, both, ref)
                loss = losses.sum() * scale
                (scaler.scale(loss) if scaler else loss).backward()
            loss_sum += losses.detach().sum() / global_pairs
            sums += stats
        self._sums = sums
        return loss_sum

    def _reference_logps(self, both: Batch) -> Tensor:
        if self.reference is None:
            return torch.zeros(both.input_ids.shape[0], device=both.input_ids.device)
        return self.reference.logps(both, forward=self.forward, precision=self.precision)

    def _score(self, logits: Tensor, both: Batch, ref: Tensor) -> tuple[Tensor, Tensor]:
        """(per-pair losses (B,), `pair_statistics` sums) of a 2B-row batch's logits."""
        logps, tokens = sequence_logps(logits, both.labels)
        policy_chosen, policy_rejected = logps.chunk(2)
        ref_chosen, ref_rejected = ref.chunk(2)
        chosen_tokens, rejected_tokens = tokens.chunk(2)
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            policy_chosen,
            policy_rejected,
            ref_chosen,
            ref_rejected,
            beta=self.spec.beta,
            loss_type=self.spec.loss_type,
            label_smoothing=self.spec.label_smoothing,
            chosen_tokens=chosen_tokens,
            rejected_tokens=rejected_tokens,
        )
        stats = pair_statistics(
            losses, chosen_rewards, rejected_rewards, policy_chosen, policy_rejected
        )
        return losses, stats

    def step_metrics(self, dist: DistInfo) -> dict[str, float]:
        """All ranks (a collective): the last step's `METRICS`, means over its global batch."""
        if self._sums is None:
            raise RuntimeError("no DPO step has run yet")
        return mean_metrics(self._sums, dist)

    @torch.no_grad()
    def evaluate_pairs(
        self, model: nn.Module, pairs: Iterable[tuple[Batch, Batch]], dist: DistInfo
    ) -> dict[str, float]:
        """All ranks: `METRICS` over the held-out `pairs` of every rank, named `eval_loss`,
        `eval_rewards/accuracy`, ... (`model` in eval mode meanwhile)."""
        was_training = model.training
        model.eval()
        sums: Tensor | None = None
        try:
            for chosen, rejected in pairs:
                both = concat_pairs(chosen, rejected)
                ref = self._reference_logps(both)
                with autocast(both.input_ids.device, self.precision):
                    logits = self.forward(model, both)
                stats = self._score(logits, both, ref)[1]
                sums = stats if sums is None else sums + stats
        finally:
            model.train(was_training)
        if sums is None:
            raise InvalidJobError("no held-out preference pair to evaluate")
        return {f"eval_{name}": value for name, value in mean_metrics(sums, dist).items()}


def build_dpo(
    spec: JobSpec,
    network: Network,
    model: nn.Module,
    *,
    dist_info: DistInfo,
    mesh: DeviceMesh | None,
    init_from: str | None = None,
    rows: tuple[Rows, Rows] | None = None,
    rejected: tuple[Rows, Rows] | None = None,
) -> DPOMethod | None:
    """The DPO method of a `method.kind: dpo` job (its reference built as `build_reference`
    says, after `parallelize` gave the policy `model` and `mesh`); None for SFT. `rows`: the
    chosen (train, eval) rows and `rejected` the rejected ones, checked pair by pair
    (`check_pairs`) when given.

    Raises `InvalidJobError` when `rows` are given without `rejected`, or `check_pairs` does."""
    if spec.method.kind != "dpo":
        return None
    if rows is not None:
        if rejected is None:
            raise InvalidJobError("method 'dpo' needs a preference dataset")
        check_pairs(rows[0], rejected[0])
        check_pairs(rows[1], rejected[1])
    reference = build_reference(
        spec, network, model, dist_info=dist_info, mesh=mesh, init_from=init_from
    )
    return DPOMethod(_dpo_spec(spec), reference, precision=spec.train.precision, rejected=rejected)


def pair_batches(
    chosen: Rows, rejected: Rows, batches: Iterable[Any], device: torch.device
) -> Iterator[tuple[Batch, Batch]]:
    """(chosen, rejected) `Batch` of each index array in `batches` (sampler output)."""
    for indices in batches:
        yield chosen.batch(indices, device), rejected.batch(indices, device)


def check_pairs(chosen: Rows, rejected: Rows) -> None:
    """Refuse preference rows DPO cannot score. Raises `InvalidJobError` when the two sets
    differ in length or row length, or a row has no supervised (answer) token."""
    if len(chosen) != len(rejected) or chosen.seq_len != rejected.seq_len:
        raise InvalidJobError(
            f"preference rows differ: {len(chosen)} chosen x {chosen.seq_len} tokens, "
            f"{len(rejected)} rejected x {rejected.seq_len}"
        )
    for name, rows in (("chosen", chosen), ("rejected", rejected)):
        for start in range(0, len(rows), _CHECK_ROWS):  # bounded memory on a memmap
            labels = np.asarray(rows.labels[start : start + _CHECK_ROWS])
            empty = np.flatnonzero(~(labels != IGNORE_INDEX).any(axis=1))
            if empty.size:
                raise InvalidJobError(
                    f"preference pair {start + int(empty[0])}: its {name} answer has no "
                    "supervised token (truncated away?)"
                )
