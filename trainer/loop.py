"""The training loop: steps with gradient accumulation, metrics, eval, checkpoints, stopping.

The data are `trainer.data.rows.Rows` (train and eval); the sampler says which rows each rank
takes. One optimizer step: the run's method (`Method` below: next-token
prediction or DPO) runs the forward and backward of this rank's `grad_accum_steps`
micro-batches, with one gradient reduction per step; then clip (a mesh-aware global norm under
fsdp/tensor/pipeline), step (through `torch.amp.GradScaler` under fp16), schedule. The method
also says what a log step adds to the metrics and what an evaluation reports; the loop has no
branch on which method runs.

At every step boundary the ranks all-reduce one tiny tensor `[loss x share, stop]`: the loss
becomes the token mean over the step's global batch (`Run.loss_share`), and a SIGTERM seen
by any rank stops all of them at the same step (checkpoint, `stopped` event, exit 0). A
non-finite loss or gradient norm raises `NonFiniteError` on every rank alike.
"""

from __future__ import annotations

import logging
import math
import resource
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn

from dataformat.errors import NonFiniteError
from jobspec.job import JobSpec
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.state import TrainState
from trainer.data.byte_tokenizer import decode, encode
from trainer.data.prompts import Prompts
from trainer.data.rows import Rows
from trainer.data.sampler import GlobalBatchSampler
from trainer.distributed import DistInfo, all_gather_floats, all_reduce_sum
from trainer.events import Reporter
from trainer.models.gpt import VOCAB_SIZE, generate, shape_of
from trainer.models.network import Network
from trainer.optim import clip_gradients
from trainer.parallel import ParallelDims, PipelineRunner, clip_grad_norm
from trainer.parallel.compute_timer import ComputeTimer
from trainer.profiling import StepProfiler

log = logging.getLogger(__name__)


class StopSignal:
    """Remembers that SIGTERM arrived; the loop acts on it at the next step boundary."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


class Method(Protocol):
    """One training method's part of the loop. Every call but `baseline_eval_loss` is made by
    every rank at the same steps (each may hold collectives)."""

    def accumulate(self, run: Run) -> Tensor:
        """Forward and backward over this rank's micro-batches of the next optimizer step
        (`run.sampler`), gradients reduced on the last micro-batch only. Returns this rank's
        share of the step's mean loss (0-dim fp32, detached): the ranks' shares x
        `run.loss_share` add up to the mean over the global batch."""
        ...

    def train_metrics(self, run: Run) -> dict[str, float]:
        """Metrics of the step just taken, added to the loop's `loss`, `lr`, ... at log steps."""
        ...

    def evaluate(self, run: Run) -> dict[str, float]:
        """Held-out metrics over every rank's eval batches (`run.eval_batches`); holds
        `eval_loss`, the number the loop checks for finiteness and reports as the run's."""
        ...

    def baseline_eval_loss(self, run: Run) -> float | None:
        """A model-free reference for `eval_loss` (the `running` status's
        `unigram_eval_loss`), or None where the method has none. Called on every rank, no
        collective."""
        ...


@dataclass
class Run:
    """Everything the loop works with; built by `trainer.train`."""

    spec: JobSpec
    dist: DistInfo
    model: nn.Module  # GPT or HFCausalLM (FSDP/TP-sharded or pipeline-pruned): eval, sampling
    parallel_model: nn.Module  # what a training forward calls: DDP(model) or model
    dims: ParallelDims
    method: Method  # what a step's micro-batches compute, its metrics and evaluation
    pipeline: PipelineRunner | None  # strategy pipeline: runs forward/backward
    num_params: int  # of the whole model
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None  # fp16 only
    sampler: GlobalBatchSampler
    train_rows: Rows | Prompts  # a GRPO job's data are prompts (`trainer.data.prompts`)
    eval_rows: Rows | Prompts
    eval_batches: list[np.ndarray]  # this rank's eval micro-batches (row or prompt indices)
    max_steps: int  # train.max_steps, or the steps of train.epochs over train_rows
    checkpointer: Checkpointer
    reporter: Reporter
    state: TrainState
    stop: StopSignal = field(default_factory=StopSignal)
    network: Network | None = None  # how the model was built: tokenizer, LoRA (export)
    # Called in order after the final eval and checkpoint of a completed run; each returns
    # fields added to the `completed` status data (e.g. QAT's converted eval loss).
    end_hooks: list[Callable[[Run], dict[str, Any]]] = field(default_factory=list)
    # DDP on CPU: times each step's compute up to this rank's last gradient (stragglers)
    compute_timer: ComputeTimer | None = None
    profiler: StepProfiler | None = None  # train.profile: stepped after every optimizer step

    @property
    def rows(self) -> tuple[Rows, Rows]:
        """(train, eval) rows of a method that trains on rows (all but GRPO). Raises
        `TypeError` for a run over prompts."""
        if not isinstance(self.train_rows, Rows) or not isinstance(self.eval_rows, Rows):
            raise TypeError("this run's data are prompts, not rows")
        return self.train_rows, self.eval_rows

    @property
    def loss_share(self) -> float:
        """Weight of this rank's loss in the global sum: 1 / tp (each rank holds its
        data-parallel share's token sum / N, repeated by the tp ranks of its group); a
        pipeline's last rank 1, the others 0."""
        if self.pipeline is not None:
            return 1.0 if self.pipeline.has_last else 0.0
        return self.dims.dp_size / self.dist.world_size

    @property
    def tokens_per_step(self) -> int:
        """Tokens over all ranks per optimizer step."""
        return self.sampler.global_batch_size * self.spec.model.seq_len


def train_step(run: Run) -> tuple[Tensor, float, float]:
    """One optimizer step on this rank's share of the next global batch.

    Returns (this rank's summed token loss / N as a 0-dim tensor, N the supervised positions
    of the global batch; the gradient norm before clipping; the lr used). Raises
    `NonFiniteError` on a non-finite gradient norm, except under fp16, where the scaler
    skips that step and lowers its scale.
    """
    lr = float(run.optimizer.param_groups[0]["lr"])
    loss_sum = run.method.accumulate(run)
    if run.scaler:
        run.scaler.unscale_(run.optimizer)
    grad_norm = _clip(run)
    if not math.isfinite(grad_norm) and run.scaler is None:
        raise NonFiniteError(f"gradient norm is {grad_norm} at step {run.state.step + 1}")
    if run.scaler:
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    return loss_sum, grad_norm, lr


def _clip(run: Run) -> float:
    """Clip gradients; the global norm before clipping. Single/DDP use torch's own
    `clip_grad_norm_`; sharded and pipelined parameters need the mesh-aware one."""
    max_norm = run.spec.optim.grad_clip
    if run.pipeline is not None:
        run.pipeline.sync_tied_grads()
        return clip_grad_norm(run.pipeline.norm_params(), max_norm, pipeline=run.pipeline)
    if run.dims.strategy in ("fsdp", "tensor") and run.dist.is_distributed:
        return clip_grad_norm(list(run.model.parameters()), max_norm, pipeline=None)
    return float(clip_gradients(run.model.parameters(), max_norm))


def agree(run: Run, local_loss: Tensor) -> tuple[float, bool]:
    """All ranks: (mean loss over the global batch, whether any rank was asked to stop)."""
    stop = torch.tensor(float(run.stop.requested), device=run.dist.device)
    share = local_loss.float() * run.loss_share
    loss, stops = all_reduce_sum(torch.stack([share, stop]), run.dist).tolist()
    return loss, stops > 0


def sample_text(run: Run) -> str:
    """A continuation of `spec.sample.prompt` from a generator seeded with the job seed, in
    bytes or through the model's tokenizer."""
    sample = run.spec.sample
    tokenizer = run.network.tokenizer if run.network is not None else None
    if tokenizer is not None:
        prompt = tokenizer.encode(sample.prompt, add_special_tokens=False)
        prompt = prompt or tokenizer.encode("\n", add_special_tokens=False)
    else:
        prompt = encode(sample.prompt) or encode("\n")
    prompt_ids = torch.tensor(prompt, dtype=torch.long)
    generator = torch.Generator(device=run.dist.device).manual_seed(run.spec.seed)
    ids = generate(
        run.model,
        prompt_ids,
        sample.max_new_tokens,
        sample.temperature,
        generator,
        vocab_size=run.network.vocab_size if run.network is not None else VOCAB_SIZE,
    )
    if tokenizer is None:
        return decode(ids)
    # One flat id list decodes to one string (the stubs also allow a batch's list of strings).
    return cast(str, tokenizer.decode(ids.tolist()))


def train_loop(run: Run) -> None:
    """Train from `run.state.step` to `run.max_steps` or until stopped, then finish."""
    spec, state = run.spec, run.state
    interval_time, interval_compute, interval_steps = 0.0, 0.0, 0
    total_time, total_steps = 0.0, 0
    eval_loss: float | None = None
    eval_step = -1
    stopped = False
    while state.step < run.max_steps:
        started = time.perf_counter()
        local_loss, grad_norm, lr = train_step(run)
        loss, stopped = agree(run, local_loss)
        step_time = time.perf_counter() - started
        timer = run.compute_timer
        compute = timer.since(started) if timer is not None else None
        state.step += 1
        state.last_loss = loss
        if run.profiler is not None:
            run.profiler.step()
        if not math.isfinite(loss):
            raise NonFiniteError(f"loss is {loss} at step {state.step}")
        interval_time, interval_steps = interval_time + step_time, interval_steps + 1
        interval_compute += step_time if compute is None else compute
        total_time, total_steps = total_time + step_time, total_steps + 1
        if state.step % spec.train.log_interval_steps == 0:
            times = (interval_time / interval_steps, interval_compute / interval_steps)
            _report_train(run, loss, lr, grad_norm, *times)
            interval_time, interval_compute, interval_steps = 0.0, 0.0, 0
        if state.step % spec.eval.interval_steps == 0:
            eval_loss, eval_step = report_eval(run), state.step
        run.checkpointer.save(state.step, force=stopped)
        run.checkpointer.poll()
        if stopped:
            break
    tokens_per_second = run.tokens_per_step * total_steps / total_time if total_time else 0.0
    if stopped:
        run.checkpointer.close()
        run.reporter.status(
            "stopped",
            f"stopped by SIGTERM after step {state.step}",
            {"step": state.step, "checkpoint_uri": run.checkpointer.last_saved_uri},
        )
        return
    _finish(run, eval_loss if eval_step == state.step else None, tokens_per_second)


def peak_memory_bytes(device: torch.device) -> int:
    """This process's peak memory: CUDA bytes allocated by torch, else the peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _finish(run: Run, eval_loss: float | None, tokens_per_second: float) -> None:
    """Final eval (unless just done), final checkpoint, sample, `completed` status."""
    log.info("peak memory %d bytes", peak_memory_bytes(run.dist.device))
    if eval_loss is None:
        eval_loss = report_eval(run)
    run.checkpointer.save(run.state.step, force=True)
    run.checkpointer.close()
    # Sharded forwards need every rank (same seed: same tokens); a pipeline does not sample.
    if run.pipeline is None and (run.dims.collective_forward or run.dist.rank == 0):
        text = sample_text(run)
        run.reporter.sample(step=run.state.step, prompt=run.spec.sample.prompt, text=text)
    extra: dict[str, Any] = {}
    for hook in run.end_hooks:
        extra.update(hook(run))
    run.reporter.status(
        "completed",
        f"trained {run.state.step} steps",
        {
            "final_loss": run.state.last_loss,
            "final_eval_loss": eval_loss,
            "checkpoint_uri": run.checkpointer.last_saved_uri,
            "steps": run.state.step,
            "tokens_per_second": tokens_per_second,
            **extra,
        },
    )


def _report_train(
    run: Run, loss: float, lr: float, grad_norm: float, step_time: float, compute_time: float
) -> None:
    """The train metrics of the log interval ending now (`step_time`: this rank's mean wall
    seconds per step over it; `compute_time`: its mean compute seconds per step, up to its
    last gradient bucket (`run.compute_timer`), or `step_time` without a timer). Every rank
    calls it at the same steps: with world_size > 1 one all-gather of the ranks' (wall,
    compute) times feeds `step_time_s/max`, `step_time_s/median` (wall) and the
    `rank_step_times` event, in which the worker looks for stragglers: compute times when
    timed (DDP on CPU: a slow rank's wall time equals everyone's, as all wait for it in the
    gradient all-reduce), else wall times (FSDP, tensor, pipeline parallel; CUDA)."""
    values = {
        "loss": loss,
        "lr": lr,
        "grad_norm": grad_norm,
        "tokens_per_second": run.tokens_per_step / step_time,
        "step_time_s": step_time,
        "epoch": run.sampler.epochs_done,
    }
    values.update(run.method.train_metrics(run))  # every rank reports at the same steps
    values.update(cuda_metrics(run, values["tokens_per_second"]))
    if run.dist.is_distributed:  # a collective: every rank reports at the same steps
        wall, compute = zip(*all_gather_floats([step_time, compute_time], run.dist), strict=True)
        values["step_time_s/max"] = max(wall)
        values["step_time_s/median"] = statistics.median(wall)
        if run.compute_timer is not None:
            run.reporter.rank_step_times(run.state.step, list(compute), list(wall), "compute")
        else:
            run.reporter.rank_step_times(run.state.step, list(wall), list(wall), "wall")
    run.reporter.metric(run.state.step, values)
    if run.dist.rank == run.dims.reporting_rank:
        log.info(
            "step %d loss %.4f lr %.3g grad_norm %.3f tokens/s %.0f step %.3f s",
            run.state.step, loss, lr, grad_norm, values["tokens_per_second"], step_time,
        )  # fmt: skip


# Dense bf16 tensor-core peak FLOP/s per GPU, from the vendors' datasheets (A100 SXM/PCIe,
# H100/H200 SXM, L4, L40S, RTX 4090). Unknown devices get no `mfu` (memory is still reported).
PEAK_BF16_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "L40S": 362e12,
                   "L4": 121e12, "4090": 165e12}  # fmt: skip


def cuda_metrics(run: Run, tokens_per_second: float) -> dict[str, float]:
    """On CUDA: `max_memory_allocated_bytes` (this rank's peak since start) and `mfu`, the
    model FLOPs utilisation of all ranks: tokens/s x FLOPs/token / (world_size x peak), with
    FLOPs/token = 6 N + 12 L d T (PaLM, Chowdhery et al. 2022, appendix B). {} on CPU."""
    device = run.dist.device
    if device.type != "cuda":
        return {}
    out = {"max_memory_allocated_bytes": float(torch.cuda.max_memory_allocated(device))}
    name = torch.cuda.get_device_name(device)
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    if peak is not None:
        m = shape_of(run.model)  # GPTConfig, or the LMShape of a Hugging Face model
        per_token = 6 * run.num_params + 12 * m.n_layers * m.d_model * m.seq_len
        out["mfu"] = tokens_per_second * per_token / (peak * run.dist.world_size)
    return out


def report_eval(run: Run) -> float:
    values = run.method.evaluate(run)
    eval_loss = values["eval_loss"]
    if not math.isfinite(eval_loss):
        raise NonFiniteError(f"eval loss is {eval_loss} at step {run.state.step}")
    run.reporter.metric(run.state.step, values)
    if run.dist.rank == run.dims.reporting_rank:
        log.info("step %d eval_loss %.4f", run.state.step, eval_loss)
    return eval_loss
