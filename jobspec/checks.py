"""Cross-field checks of `jobspec.job.JobSpec`: the conflicts between fields that pydantic's
per-field constraints cannot see (mesh vs. world size, tensor-parallel size vs. heads, pipeline
stages vs. layers, LoRA targets, QAT and QLoRA placement...). Each is a (JSON path, message)
pair that `JobSpec`'s validator turns into a 422 naming that path.

Like `jobspec.job`, this imports nothing heavier than pydantic (types only at type-check time).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from dataformat.records import LOSS_ON_BY_FORMAT
from jobspec.method_checks import grpo_code_errors, method_errors
from jobspec.sections import LoRASpec, TrainerSections

# Linear layers of each block of the built-in GPT (`trainer.models.gpt.Block`), by module path.
GPT_LINEAR_MODULES = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.fc", "mlp.proj")
# Modules of the built-in GPT that `lora.modules_to_save` may name (trained in full).
GPT_SAVABLE_MODULES = ("wpe", "ln_f", "ln_1", "ln_2")


def get_path(spec: BaseModel, loc: tuple[str | int, ...]) -> Any:
    value: Any = spec
    for part in loc:
        if isinstance(part, int) or isinstance(value, dict):  # a list's item, a dict's value
            value = value[part]
        else:
            value = getattr(value, part)
    return value.model_dump() if isinstance(value, BaseModel) else value


def cross_field_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """(path, message) for every cross-field conflict in `spec`."""
    errors: list[tuple[tuple[str, ...], str]] = []
    model, res = spec.model, spec.resources
    if model.d_model % model.n_heads:
        errors.append(
            (
                ("model", "n_heads"),
                f"n_heads ({model.n_heads}) must divide d_model ({model.d_model})",
            )
        )
    if (spec.data.dataset is None) == (spec.data.uri is None):
        errors.append((("data",), "give exactly one of `dataset` or `uri`"))
    if spec.parallelism.strategy == "single" and res.world_size != 1:
        errors.append(
            (
                ("resources", "procs_per_node"),
                f"strategy 'single' runs one process, but nodes x procs_per_node = "
                f"{res.world_size}; use strategy 'ddp' or procs_per_node: 1",
            )
        )
    if spec.retries.max_inplace_restarts and res.nodes > 1:
        errors.append(
            (
                ("retries", "max_inplace_restarts"),
                f"in-place restarts are for single-node jobs (resources.nodes is {res.nodes}); "
                "a gang restarts as a whole through retries.max_restarts",
            )
        )
    errors += _parallelism_errors(spec)
    errors += _qat_errors(spec)
    errors += _fp8_errors(spec)
    errors += _model_source_errors(spec)
    errors += _finetune_errors(spec)
    errors += _stopping_errors(spec)
    errors += _data_errors(spec)
    errors += method_errors(spec)
    if spec.train.max_steps is not None and spec.eval.interval_steps > spec.train.max_steps:
        errors.append(
            (
                ("eval", "interval_steps"),
                f"interval_steps ({spec.eval.interval_steps}) exceeds train.max_steps "
                f"({spec.train.max_steps}): the run would never evaluate",
            )
        )
    return errors


def submission_errors(spec: TrainerSections) -> list[tuple[tuple[str | int, ...], str]]:
    """(path, message) for the rules a spec is held to when submitted but not when read back
    (`jobspec.job.STORED`): they came after specs that break them were accepted and stored, and
    a stored job, its checkpoints and exports must still read (issue 45)."""
    errors: list[tuple[tuple[str | int, ...], str]] = [*grpo_code_errors(spec)]
    if (spec.lora is not None or spec.qlora is not None) and not has_pretrained_weights(spec):
        field = "lora" if spec.lora is not None else "qlora"
        errors.append(
            (
                (field,),
                "LoRA adapts pretrained weights; this model starts from random initialisation: "
                f"give model.init_from or a pretrained Hugging Face model (model.hf.path_or_id), "
                f"or drop {field}",
            )
        )
    steps, warmup = spec.train.max_steps, spec.optim.warmup_steps
    if steps is not None and warmup > steps:  # with `epochs` the length is known at launch
        errors.append(
            (
                ("optim", "warmup_steps"),
                f"warmup_steps ({warmup}) exceeds train.max_steps ({steps}): the run would end "
                f"before its learning rate reaches optim.lr; use at most {steps}",
            )
        )
    return errors


def has_pretrained_weights(spec: TrainerSections) -> bool:
    """Whether the model starts from trained weights: an earlier job's checkpoint
    (`model.init_from`) or a saved Hugging Face model (`model.hf.path_or_id`), not from a
    random initialisation (`gpt`, `model.hf.from_config`)."""
    model = spec.model
    if model.init_from is not None:
        return True
    return model.kind == "hf" and model.hf is not None and model.hf.path_or_id is not None


def _stopping_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """Exactly one of `train.max_steps` and `train.epochs` says when training ends."""
    train = spec.train
    if train.max_steps is not None and train.epochs is not None:
        return [
            (
                ("train", "epochs"),
                f"give either train.max_steps ({train.max_steps}) or train.epochs "
                f"({train.epochs}), not both; set max_steps to null to train by epochs",
            )
        ]
    if train.max_steps is None and train.epochs is None:
        return [(("train", "max_steps"), "give train.max_steps or train.epochs")]
    return []


def _parallelism_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """Mesh, tensor-parallel and pipeline conflicts (checked before any GPU is allocated)."""
    par, model, world = spec.parallelism, spec.model, spec.world_size
    errors: list[tuple[tuple[str, ...], str]] = []
    tp_path = ("parallelism", "tensor_parallel_size")
    if par.tensor_parallel_size not in (None, 1) and par.strategy not in ("fsdp", "tensor"):
        errors.append(
            (
                tp_path,
                f"tensor_parallel_size needs strategy 'fsdp' or 'tensor', not {par.strategy!r}",
            )
        )
        return errors
    if par.strategy in ("tensor", "pipeline") and world < 2:
        errors.append(
            (
                ("resources", "procs_per_node"),
                f"strategy {par.strategy!r} needs at least 2 processes",
            )
        )
        return errors
    tp = par.tp_size(world)
    if par.strategy == "tensor" and tp != world:
        errors.append(
            (
                tp_path,
                f"strategy 'tensor' uses every rank: tensor_parallel_size "
                f"({tp}) must equal nodes x procs_per_node ({world}); for TP with "
                f"data parallelism use strategy 'fsdp'",
            )
        )
    elif world % tp:
        errors.append(
            (
                tp_path,
                f"tensor_parallel_size ({tp}) must divide the world size "
                f"nodes x procs_per_node ({world})",
            )
        )
    if tp > 1:
        d_ff = model.d_ff or 4 * model.d_model
        for field, value in (
            ("n_heads", model.n_heads),
            ("d_model", model.d_model),
            ("d_ff", d_ff),
        ):
            if value % tp:
                errors.append(
                    (tp_path, f"tensor_parallel_size ({tp}) must divide model.{field} ({value})")
                )
        if spec.train.precision == "fp16":  # GradScaler's unscale cannot mix these grads
            errors.append(
                (
                    ("train", "precision"),
                    "fp16 loss scaling is not supported with tensor parallelism "
                    "(replicated and sharded gradients mix); use bf16 or fp32",
                )
            )
        if par.strategy == "fsdp" and spec.resources.nodes > 1:
            errors.append((tp_path, "2-D FSDP x TP runs on one node (HSDP is for tp 1)"))
    if par.strategy == "pipeline":
        errors += _pipeline_errors(spec)
    return errors


def _pipeline_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    pp, model = spec.parallelism.pipeline, spec.model
    path = ("parallelism", "pipeline")
    errors: list[tuple[tuple[str, ...], str]] = []
    stages = spec.world_size * pp.stages_per_rank
    interleaved = pp.schedule == "interleaved_1f1b"
    if interleaved and pp.stages_per_rank < 2:
        errors.append(
            (
                (*path, "stages_per_rank"),
                "schedule 'interleaved_1f1b' needs stages_per_rank >= 2 (virtual stages)",
            )
        )
    if not interleaved and pp.stages_per_rank != 1:
        errors.append(
            (
                (*path, "stages_per_rank"),
                f"schedule {pp.schedule!r} runs one stage "
                f"per rank; use 'interleaved_1f1b' for {pp.stages_per_rank}",
            )
        )
    if stages > model.n_layers:
        errors.append(
            (
                (*path, "stages_per_rank"),
                f"{stages} pipeline stages (world size "
                f"{spec.world_size} x stages_per_rank {pp.stages_per_rank}) exceed "
                f"model.n_layers ({model.n_layers})",
            )
        )
    if pp.num_microbatches < stages:
        errors.append(
            (
                (*path, "num_microbatches"),
                f"num_microbatches ({pp.num_microbatches}) "
                f"must be at least the number of stages ({stages})",
            )
        )
    if spec.train.micro_batch_size % pp.num_microbatches:
        errors.append(
            (
                ("train", "micro_batch_size"),
                f"micro_batch_size "
                f"({spec.train.micro_batch_size}) must be divisible by "
                f"parallelism.pipeline.num_microbatches ({pp.num_microbatches})",
            )
        )
    if spec.train.precision == "fp16":
        errors.append(
            (
                ("train", "precision"),
                "fp16 loss scaling is not supported with strategy 'pipeline'; use bf16 or fp32",
            )
        )
    points = pp.split_points
    if points is not None:
        ok = len(points) == stages - 1 and all(
            a < b for a, b in zip([0, *points], [*points, model.n_layers], strict=True)
        )
        if not ok:
            errors.append(
                (
                    (*path, "split_points"),
                    f"split_points {points} must be "
                    f"{stages - 1} strictly increasing block indices in "
                    f"1..{model.n_layers - 1}",
                )
            )
    return errors


def _data_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """`data.loss_on` and `data.packing` against a declared `data.format`; eval sources."""
    data = spec.data
    errors: list[tuple[tuple[str, ...], str]] = []
    if data.eval_dataset is not None and data.eval_uri is not None:
        errors.append((("data", "eval_uri"), "give at most one of `eval_dataset` or `eval_uri`"))
    if data.format is None:
        return errors  # known at launch: the trainer checks the same and exits 2
    allowed = LOSS_ON_BY_FORMAT[data.format]
    if data.loss_on is not None and data.loss_on not in allowed:
        errors.append(
            (
                ("data", "loss_on"),
                f"loss_on {data.loss_on!r} does not apply to format {data.format!r}; "
                f"choose among {list(allowed)}",
            )
        )
    if data.packing and data.format == "preference":
        errors.append(
            (("data", "packing"), "preference pairs are never packed (one pair per sequence)")
        )
    return errors


QAT_STRATEGIES = ("single", "ddp", "fsdp")


def _qat_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """QAT needs whole (or FSDP-gathered) Linear weights and groups that tile their inputs."""
    qat, model = spec.qat, spec.model
    if qat is None:
        return []
    errors: list[tuple[tuple[str, ...], str]] = []
    strategy = spec.parallelism.strategy
    if strategy not in QAT_STRATEGIES or spec.parallelism.tp_size(spec.world_size) > 1:
        errors.append(
            (
                ("qat",),
                f"qat runs with strategy {', '.join(map(repr, QAT_STRATEGIES))} without tensor "
                f"parallelism, not {strategy!r}"
                + (" with tensor_parallel_size > 1" if strategy == "fsdp" else ""),
            )
        )
    if model.kind == "gpt":
        d_ff = model.d_ff or 4 * model.d_model
        for field, value in (("d_model", model.d_model), ("d_ff", d_ff)):
            if value % qat.group_size:
                errors.append(
                    (
                        ("qat", "group_size"),
                        f"group_size ({qat.group_size}) must divide model.{field} ({value})",
                    )
                )
    return errors


FP8_STRATEGIES = ("single", "ddp", "fsdp")


def _fp8_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """`precision: fp8` converts whole trained Linears (torchao's `Float8Linear`): not frozen
    or quantized bases (LoRA, QLoRA), not fake-quantized ones (QAT), not sharded ones (tensor
    parallelism, whose float8 plans are not built) nor pipeline stages."""
    if spec.train.precision != "fp8":
        return []
    path = ("train", "precision")
    errors: list[tuple[tuple[str, ...], str]] = []
    for name in ("lora", "qlora", "qat"):
        if getattr(spec, name) is not None:
            errors.append(
                (path, f"fp8 trains full weights in float8; it does not combine with {name} "
                       f"(use bf16 with {name})")
            )  # fmt: skip
    strategy = spec.parallelism.strategy
    if strategy not in FP8_STRATEGIES or spec.parallelism.tp_size(spec.world_size) > 1:
        errors.append(
            (path, f"fp8 runs with strategy {', '.join(map(repr, FP8_STRATEGIES))} without "
                   f"tensor parallelism, not {strategy!r}"
                   + (" with tensor_parallel_size > 1" if strategy == "fsdp" else ""))
        )  # fmt: skip
    return errors


def _model_source_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """`model.kind` vs `model.hf`, and what a Hugging Face model can run with."""
    model, par = spec.model, spec.parallelism
    errors: list[tuple[tuple[str, ...], str]] = []
    if model.kind == "gpt":
        if model.hf is not None:
            errors.append((("model", "hf"), "model.hf is read only with model.kind 'hf'"))
        return errors
    hf = model.hf
    if hf is None:
        return [(("model", "hf"), "model.kind 'hf' needs model.hf (path_or_id or from_config)")]
    if (hf.path_or_id is None) == (hf.from_config is None):
        errors.append((("model", "hf"), "give exactly one of `path_or_id` or `from_config`"))
    if hf.from_config is not None and not isinstance(hf.from_config.get("model_type"), str):
        errors.append((("model", "hf", "from_config"), "from_config needs a `model_type` string"))
    if par.strategy in ("tensor", "pipeline") or par.tp_size(spec.world_size) > 1:
        errors.append(
            (
                ("parallelism", "strategy"),
                "Hugging Face models run with single, ddp or fsdp (without "
                "tensor_parallel_size); tensor and pipeline plans exist for model.kind 'gpt'",
            )
        )
    gpt_only = [
        (("qat",), spec.qat is not None, "qat"),
        (("checkpoint", "export_safetensors"), spec.checkpoint.export_safetensors,
         "checkpoint.export_safetensors"),
    ]  # fmt: skip
    for loc, used, what in gpt_only:
        if used:
            errors.append((loc, f"{what} is for model.kind 'gpt', not a Hugging Face model"))
    return errors


def _finetune_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """LoRA / QLoRA against the strategy and (for the built-in GPT) the module names."""
    lora, qlora, par = spec.lora, spec.qlora, spec.parallelism
    errors: list[tuple[tuple[str, ...], str]] = []
    if lora is None and qlora is None:
        return errors
    field = "qlora" if qlora is not None else "lora"
    if par.strategy in ("tensor", "pipeline") or par.tp_size(spec.world_size) > 1:
        errors.append(
            (
                (field,),
                f"{field} runs with strategy single, ddp or fsdp (without "
                f"tensor_parallel_size), not {par.strategy!r}",
            )
        )
    if qlora is not None and par.strategy == "fsdp":
        errors.append(
            (
                ("qlora",),
                "qlora runs with strategy single or ddp: FSDP2 does not shard bitsandbytes "
                "4-bit weights; use lora with fsdp, or qlora with ddp",
            )
        )
    if lora is not None and spec.model.kind == "gpt":
        errors += _gpt_lora_errors(lora, spec.model.n_layers)
    if spec.qat is not None:
        errors.append((("qat",), f"qat cannot be combined with {field}"))
    if spec.checkpoint.export_safetensors:
        errors.append(
            (
                ("checkpoint", "export_safetensors"),
                f"a {field} run exports its merged weights as safetensors itself "
                "(CKPT/lora/step_N/merged); its checkpoints hold only the adapters",
            )
        )
    return errors


def _gpt_lora_errors(lora: LoRASpec, n_layers: int) -> list[tuple[tuple[str, ...], str]]:
    """peft matches a target by its full module path or a dotted suffix of it."""

    def matches(name: str, paths: list[str]) -> bool:
        return any(p == name or p.endswith(f".{name}") for p in paths)

    blocks = [f"blocks.{i}" for i in range(n_layers)]
    linears = [f"{b}.{m}" for b in blocks for m in GPT_LINEAR_MODULES]
    errors: list[tuple[tuple[str, ...], str]] = []
    unknown = [t for t in lora.target_modules or [] if not matches(t, linears)]
    if unknown:
        errors.append(
            (
                ("lora", "target_modules"),
                f"{unknown} name no linear layer of the built-in gpt; choose among "
                f"{[m.split('.')[-1] for m in GPT_LINEAR_MODULES]} (or dotted paths such as "
                f"'attn.wq', 'blocks.0.mlp.fc')",
            )
        )
    savable = ["wpe", "ln_f", *(f"{b}.{m}" for b in blocks for m in ("ln_1", "ln_2"))]
    bad_save = [m for m in lora.modules_to_save if not matches(m, savable)]
    if bad_save:
        errors.append(
            (
                ("lora", "modules_to_save"),
                f"{bad_save} cannot be trained in full with gpt LoRA; choose among "
                f"{list(GPT_SAVABLE_MODULES)}",
            )
        )
    return errors
