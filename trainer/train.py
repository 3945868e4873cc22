"""Entrypoint: parse the command line (docs/CONTRACTS.md section 1), build, train, close.

    torchrun ... -m trainer --spec RUN_DIR/spec.json --run-dir RUN_DIR --checkpoint-dir CKPT
    python -m trainer --spec ... --run-dir ... --checkpoint-dir ...     (stand-alone, 1 process)

Exit codes: 0 success or a clean stop after SIGTERM; 2 invalid spec or data (an `error`
event says so; do not retry); 1 any other failure (`error` event, traceback on stderr and in
torchrun's error file through `@record`).
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.elastic.multiprocessing.errors import record

from dataformat.errors import InvalidJobError
from dataformat.failures import FailureClass, classify_exception
from jobspec.job import JobSpec
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.state import RNGState, TrainState
from trainer.data.batches import lm_loss, resolve_max_steps
from trainer.data.byte_tokenizer import is_uri
from trainer.data.pairs import PreferenceRows
from trainer.data.prep import PreparedRows, cache_root, prepare_rows
from trainer.data.prompts import Prompts, load_prompts
from trainer.data.rows import Rows
from trainer.data.sampler import GlobalBatchSampler, eval_batches
from trainer.distributed import DistInfo, env_rank, env_world_size, init_distributed, shutdown
from trainer.events import EventWriter, NullReporter, Reporter, restart_count
from trainer.exports.safetensors import export_at_end
from trainer.logs import log_to_stdout
from trainer.loop import Method, Run, report_eval, train_loop
from trainer.methods.dpo_train import build_dpo
from trainer.methods.grpo_train import GRPOMethod, build_grpo
from trainer.methods.sft import SFT
from trainer.models.hf import load_tokenizer
from trainer.models.network import build_network, lora_settings, model_state
from trainer.optim import build_optimizer, build_scheduler
from trainer.parallel import ParallelDims, parallelize, reporting_rank
from trainer.profiling import StepProfiler

log = logging.getLogger("trainer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, help="JobSpec JSON file")
    p.add_argument("--run-dir", required=True, type=Path, help="directory for events.jsonl")
    p.add_argument("--checkpoint-dir", required=True, help="local directory or fsspec URI")
    p.add_argument("--data", help="corpus file or directory; default: spec.data.uri")
    p.add_argument(
        "--eval-data",
        help="evaluation file or directory (data.eval_dataset resolved); default: "
        "spec.data.eval_uri, else a held-out share of --data",
    )
    p.add_argument(
        "--cache-dir",
        help="local directory of the row cache; default: $TORCHYARD_CACHE_DIR, else "
        "~/.cache/torchyard/rows",
    )
    p.add_argument(
        "--init-from",
        help="a complete checkpoint (step_XXXXXXXX dir or URI) whose model weights start the "
        "run when it has no checkpoint of its own; needed when spec.model.init_from is set",
    )
    p.add_argument(
        "--code-dir",
        type=Path,
        help="the job's code directory, the unpacked method.grpo.code archive, where a python "
        "grader's `file` is read",
    )
    return p.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """Run one attempt of a job; raises SystemExit(2) for invalid input, re-raises failures."""
    args = parse_args(argv)
    # The worker's hang watchdog sends SIGUSR1 when py-spy cannot dump this rank: every
    # thread's Python stack goes to stderr, which the worker stores as this rank's log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    rank = env_rank()
    log_to_stdout(rank)
    spec, spec_error = _try_load_spec(args.spec)
    # The events writer: the last pipeline stage's rank (where the loss is), else rank 0.
    writer = reporting_rank(spec, env_world_size()) if spec else 0
    reporter: Reporter = EventWriter(args.run_dir) if rank == writer else NullReporter()
    dist_info: DistInfo | None = None
    try:
        if spec is None:
            assert spec_error is not None
            raise spec_error
        data = DataSources(
            train=_data_location(spec, args.data),
            eval=args.eval_data or spec.data.eval_uri,
            cache_dir=cache_root(args.cache_dir),
        )
        dist_info = init_distributed(spec.resources.device)
        if dist_info.device.type == "cuda":  # TF32 needs compute capability 8.0+; else a no-op
            torch.set_float32_matmul_precision("high" if spec.train.tf32 else "highest")
        init_from = _init_from_location(spec, args.init_from)
        run_job(
            spec,
            data,
            _checkpoint_root(args.checkpoint_dir),
            dist_info,
            reporter,
            init_from=init_from,
            code_dir=args.code_dir,
        )
        shutdown(dist_info, clean=True)
    except InvalidJobError as exc:
        report_failure(exc, 2, reporter, dist_info)
        raise SystemExit(2) from None
    except Exception as exc:
        report_failure(exc, 1, reporter, dist_info)
        raise
    finally:
        reporter.close()


def _try_load_spec(path: str) -> tuple[JobSpec | None, InvalidJobError | None]:
    try:
        return load_spec(path), None
    except InvalidJobError as exc:
        return None, exc


def load_spec(path: str) -> JobSpec:
    """The `JobSpec` at `path`. Raises `InvalidJobError` if unreadable or invalid, or if the
    launch contradicts it (`single` with more than one process)."""
    try:
        spec = JobSpec.load(path)
    except (OSError, ValueError, ValidationError) as exc:
        raise InvalidJobError(f"invalid spec {path}: {exc}") from exc
    world_size = env_world_size()
    if spec.parallelism.strategy == "single" and world_size > 1:
        raise InvalidJobError(f"strategy 'single' launched with world_size {world_size}")
    if world_size != spec.world_size:
        log.warning("spec asks for world_size %d, launched with %d", spec.world_size, world_size)
    return spec


def _data_location(spec: JobSpec, data_arg: str | None) -> str:
    location = data_arg or spec.data.uri
    if location is None:
        raise InvalidJobError(f"data.dataset {spec.data.dataset!r} needs --data PATH")
    return location


def _init_from_location(spec: JobSpec, init_arg: str | None) -> str | None:
    return _checkpoint_root(init_arg) if init_arg else None


def _checkpoint_root(checkpoint_dir: str) -> str:
    """Local directories become absolute, so the URIs in events mean the same to readers."""
    return checkpoint_dir if is_uri(checkpoint_dir) else os.path.abspath(checkpoint_dir)


@dataclass(frozen=True)
class DataSources:
    """Where a run's data is: the training location, the evaluation location (None: a
    held-out share of the training data) and the local row cache."""

    train: str
    eval: str | None
    cache_dir: Path


def run_job(
    spec: JobSpec,
    data: DataSources,
    checkpoint_dir: str,
    dist_info: DistInfo,
    reporter: Reporter,
    *,
    init_from: str | None = None,
    code_dir: Path | None = None,
) -> None:
    """Build the run, resume from the latest complete checkpoint if any (else take the model
    weights of the checkpoint `init_from`, if given, and report their eval loss at step 0),
    train. `code_dir`: the job's code directory (a GRPO job's python graders' files).

    Everything built here is local, so it is freed when this returns (before teardown).
    """
    tokenizer = load_tokenizer(spec.model)  # None: bytes
    train_rows: Rows | Prompts
    eval_rows: Rows | Prompts
    rejected_rows = None
    if spec.method.kind == "grpo":  # prompts, not rows: nothing to cache
        train_rows, eval_rows, report = load_prompts(
            spec, data.train, tokenizer, eval_location=data.eval
        )
        reporter.data(report)
    else:
        prepared = prepare_rows(
            spec,
            data.train,
            tokenizer,
            cache_dir=data.cache_dir,
            dist=dist_info,
            reporter=reporter,
            eval_location=data.eval,
        )
        train_rows, eval_rows, rejected_rows = _method_rows(spec, prepared)
    # The starting weights go into the base before adapters and sharding (`build_network`),
    # on every attempt: a LoRA run's checkpoints hold only its adapters, so its frozen base
    # is rebuilt from --init-from each time; a full run's own checkpoint then overwrites them.
    if lora_settings(spec) is not None and spec.model.init_from is not None and not init_from:
        raise InvalidJobError("a LoRA fine-tune of model.init_from needs --init-from URI")
    run = build_run(
        spec,
        train_rows,
        eval_rows,
        checkpoint_dir,
        dist_info,
        reporter,
        init_from=init_from,
        rejected_rows=rejected_rows,
        code_dir=code_dir,
    )
    run.stop.install()
    try:
        start_step = run.checkpointer.load_latest()
        if start_step is not None or init_from is None:
            init_from = None  # the run's own checkpoints take precedence
        if start_step is None and init_from is None and spec.model.init_from is not None:
            raise InvalidJobError(
                "model.init_from needs --init-from URI (the worker resolves it) while the run "
                "has no checkpoint of its own"
            )
        start_step = start_step or 0
        unigram = run.method.baseline_eval_loss(run)
        num_params = run.num_params
        assert run.network is not None  # build_run always records how it built the model
        reporter.status(
            "running",
            f"training from step {start_step} on {dist_info.world_size} process(es)",
            {
                "world_size": dist_info.world_size,
                "num_params": num_params,
                "trainable_params": run.network.trainable_params,
                "tokens_per_step": run.tokens_per_step,
                "max_steps": run.max_steps,
                "start_step": start_step,
                "unigram_eval_loss": unigram,
                "init_from": init_from,
                "restart": restart_count(),
            },
        )
        if init_from is not None or (start_step == 0 and spec.eval.at_start):
            report_eval(run)  # step 0: the starting weights
        log.info(
            "%d parameters (%d trainable), unigram eval loss %s",
            num_params, run.network.trainable_params, unigram,
        )  # fmt: skip
        train_loop(run)
    finally:
        if run.profiler is not None:
            run.profiler.close()
        run.checkpointer.close()
        if isinstance(run.method, GRPOMethod):
            run.method.close()


def _method_rows(
    spec: JobSpec, prepared: PreparedRows
) -> tuple[Rows, Rows, tuple[Rows, Rows] | None]:
    """(train rows, eval rows, rejected (train, eval) rows or None) for the job's method.

    DPO trains on preference pairs (the chosen rows, with the rejected rows aligned beside
    them); SFT on plain rows. Raises `InvalidJobError` when the data's format does not fit
    the method."""
    train, held = prepared.train, prepared.eval
    if spec.method.kind == "dpo":
        if not isinstance(train, PreferenceRows) or not isinstance(held, PreferenceRows):
            raise InvalidJobError(
                "method.kind dpo needs a preference dataset (data.format preference)"
            )
        return train.chosen, held.chosen, (train.rejected, held.rejected)
    if isinstance(train, PreferenceRows) or isinstance(held, PreferenceRows):
        raise InvalidJobError(
            "a preference dataset trains with method.kind dpo (method.kind is sft)"
        )
    return train, held, None


def build_run(
    spec: JobSpec,
    train_rows: Rows | Prompts,
    eval_rows: Rows | Prompts,
    checkpoint_dir: str,
    dist_info: DistInfo,
    reporter: Reporter,
    *,
    init_from: str | None = None,
    rejected_rows: tuple[Rows, Rows] | None = None,
    code_dir: Path | None = None,
) -> Run:
    """Model (+ LoRA/QLoRA, + DDP), optimizer, schedule, sampler and checkpointer for one
    attempt over `train_rows` / `eval_rows` (of the model's token ids; a GRPO job's prompts,
    the sampler then dealing prompts as it deals rows); `init_from`: a
    checkpoint whose weights the base takes before adapters and sharding (also the DPO
    reference's starting weights); `code_dir`: where a GRPO job's python graders' files are.

    Raises `InvalidJobError` when the eval rows hold less than one batch per data-parallel
    rank, or the model cannot be built as asked (`trainer.models.network.build_network`).
    """
    torch.manual_seed(spec.seed + dist_info.rank)  # dropout differs per rank, reproducibly
    dims = ParallelDims.from_spec(spec, dist_info.world_size)
    network = build_network(
        spec,
        device=dist_info.device,
        init_from=init_from,
        dist_info=dist_info,
    )
    model, num_params = network.model, network.num_params
    end_hooks: list[Callable[[Run], dict[str, Any]]] = []
    if spec.checkpoint.export_safetensors:
        end_hooks.append(export_at_end)
    if network.peft_model is not None:
        from trainer.exports.lora import export_at_end as export_lora_at_end

        end_hooks.append(export_lora_at_end)
    if spec.qat is not None:  # fake-quantized Linears, before sharding (torchao)
        from trainer.methods import qat  # torchao takes ~1.5 s to import: only for QAT runs

        qat.prepare(model, spec.qat)
        end_hooks.append(qat.report_converted)
    if spec.train.precision == "fp8":  # float8 Linears, before sharding (torchao)
        from trainer.methods.float8 import apply_float8

        apply_float8(model, spec.train.fp8_recipe, dist_info.device)
    parts = parallelize(
        model,
        dims,
        spec,
        rank=dist_info.rank,
        device=dist_info.device,
        loss=functools.partial(lm_loss, reduction="sum"),
    )
    # The method (`trainer.methods.base`): GRPO over prompts, DPO over preference pairs, else
    # next-token prediction
    method: Method
    if isinstance(train_rows, Prompts) and isinstance(eval_rows, Prompts):
        method = build_grpo(
            spec, network, parts.model, dist_info=dist_info, mesh=parts.mesh,
            prompts=(train_rows, eval_rows), init_from=init_from, code_dir=code_dir,
        )  # fmt: skip
    elif isinstance(train_rows, Rows) and isinstance(eval_rows, Rows):
        method = build_dpo(
            spec, network, parts.model, dist_info=dist_info, mesh=parts.mesh,
            init_from=init_from, rows=(train_rows, eval_rows), rejected=rejected_rows,
        ) or SFT(vocab_size=network.vocab_size)  # fmt: skip
    else:
        raise TypeError("train and eval data must both be rows or both prompts")
    dp_rank = dims.dp_rank(dist_info.rank)
    sampler = GlobalBatchSampler(
        num_chunks=len(train_rows),
        seed=spec.seed,
        micro_batch_size=spec.train.micro_batch_size,
        grad_accum_steps=spec.train.grad_accum_steps,
        rank=dp_rank,
        world_size=dims.dp_size,
    )
    grpo = spec.method.grpo
    max_steps = resolve_max_steps(
        spec.train,
        len(train_rows),
        sampler.global_batch_size,
        steps_per_batch=grpo.num_iterations if grpo is not None else 1,
    )
    # One fused kernel per parameter group on CUDA (torchtitan's default); tensor parallel
    # mixes meshes in a group, and offloaded parameters live on the host.
    on_cuda = dist_info.device.type == "cuda" and not spec.parallelism.fsdp.cpu_offload
    optimizer = build_optimizer(
        parts.model,
        spec.optim,
        foreach=None if dims.tp == 1 else False,
        fused=on_cuda and dims.tp == 1,
    )
    scheduler = build_scheduler(optimizer, spec.optim, max_steps)
    fp16 = spec.train.precision == "fp16"
    scaler = torch.amp.GradScaler(dist_info.device.type) if fp16 else None
    # Sharded and pipelined forwards are collective: every rank runs as many eval batches,
    # all of full size (a pipeline splits each into its micro-batches).
    my_eval_batches = eval_batches(
        num_chunks=len(eval_rows),
        num_batches=spec.eval.num_batches,
        micro_batch_size=spec.train.micro_batch_size,
        rank=dp_rank,
        world_size=dims.dp_size,
        full_batches_only=dims.collective_forward or dims.pp > 1,
    )
    if not my_eval_batches:
        raise InvalidJobError(
            f"the evaluation split has {len(eval_rows)} rows, fewer than one batch of "
            f"{spec.train.micro_batch_size} per data-parallel rank ({dims.dp_size})"
        )
    state = TrainState()
    states: dict[str, Stateful] = {
        "model_optim": model_state(parts.train_model, optimizer, network),
        "scheduler": scheduler,
        "sampler": sampler,
        "train": state,
    }
    if scaler:
        states["scaler"] = scaler
    rank_states: dict[str, Stateful] = {"rng": RNGState(dist_info.device)}
    if isinstance(method, GRPOMethod):  # each rank's generation batch (num_iterations > 1)
        rank_states["rollout"] = method
    checkpointer = Checkpointer(
        root=checkpoint_dir,
        spec=spec.checkpoint,
        states=states,
        rank_states=rank_states,
        job_spec_json=spec.model_dump_json(indent=2),
        dist_info=dist_info,
        reporter=reporter,
        reporting_rank=dims.reporting_rank,
    )
    profiler = None
    if spec.train.profile is not None:
        profiler = StepProfiler(
            spec.train.profile,
            device=dist_info.device,
            out_uri=f"{checkpoint_dir.rstrip('/')}/profile",
            rank=dist_info.rank,
        )
    return Run(
        spec=spec,
        dist=dist_info,
        profiler=profiler,
        model=parts.model,
        parallel_model=parts.train_model,
        compute_timer=parts.compute_timer,
        dims=dims,
        method=method,
        pipeline=parts.pipeline,
        num_params=num_params,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        sampler=sampler,
        train_rows=train_rows,
        eval_rows=eval_rows,
        eval_batches=my_eval_batches,
        max_steps=max_steps,
        checkpointer=checkpointer,
        reporter=reporter,
        state=state,
        network=network,
        end_hooks=end_hooks,
    )


def report_failure(
    exc: BaseException, exit_code: int, reporter: Reporter, info: DistInfo | None
) -> None:
    """Report `exc` (error event with its failure class + log), free the frames it holds, leave
    the process group. `exit_code` 2 (invalid spec or data) is a `user_error`; otherwise the
    class comes from the exception (`dataformat.failures.classify_exception`: an allocator error
    is `oom`; a distributed, connection or checkpoint-write error, a full or read-only disk is
    `infra`; anything else `user_error`)."""
    message = f"{type(exc).__name__}: {exc}"
    failure_class = FailureClass.USER_ERROR if exit_code == 2 else classify_exception(exc)
    log.error("%s (%s)", message, failure_class)
    reporter.error(
        message=message,
        traceback="".join(traceback.format_exception(exc)),
        exit_code=exit_code,
        failure_class=str(failure_class),
        rank=env_rank(),
    )
    if exit_code == 2:  # no traceback reaches stderr for SystemExit(2): say why there
        print(f"trainer: invalid job, not retrying: {message}", file=sys.stderr, flush=True)
    traceback.clear_frames(exc.__traceback__)  # drop model/optimizer refs held by the frames
    shutdown(info, clean=False)
