"""The job spec: what a user submits, validated before any GPU is allocated.

This module imports nothing heavier than pydantic, so the API and the client SDK can validate
specs without importing torch. The trainer reads the same model (``JobSpec.load(path)``).

Every field is documented where it is declared; ``JobSpec.model_json_schema()`` is the public
JSON Schema served at ``GET /v1/spec/schema`` and rendered into README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

SPEC_VERSION = 1

Name = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Letters, digits, '.', '_' and '-'; starts with a letter or digit.",
    ),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)


class InitFromSpec(_Strict):
    """Start from the model weights of an earlier job's checkpoint (fine-tuning).

    Only the weights are taken (not the optimizer, schedule or step), under any parallelism
    and world size (DCP reshards by parameter name). Give `job` (its latest complete
    checkpoint, pinned when the job is submitted) or `checkpoint` (an id from
    `GET /v1/jobs/{id}/checkpoints`), or both (the checkpoint must be of that job). Both must
    be of the job's project, and the model's shape must equal the earlier job's.
    """

    job: int | None = Field(
        default=None, ge=1, description="Id of an earlier job of the same project."
    )
    checkpoint: int | None = Field(
        default=None,
        ge=1,
        description="Id of a complete checkpoint; filled in at submission when only `job` is "
        "given (the job's latest complete checkpoint then).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> InitFromSpec:
        if self.job is None and self.checkpoint is None:
            raise PydanticCustomError("init_from_empty", "give `job` or `checkpoint` (or both)")
        return self


class QATSpec(_Strict):
    """Quantization-aware training with torchao (`QATConfig`, prepare/convert).

    During training each `nn.Linear` fake-quantizes its input to int8 per token (dynamic,
    asymmetric) and its weight to `weight_dtype` per group of `group_size` input channels
    (symmetric), with straight-through gradients (Jacob et al. 2018). At the end the model is
    converted to real quantized weights (`Int8DynamicActivationIntxWeightConfig`), its eval
    loss reported next to the fake-quantized one, and it is saved as safetensors.
    """

    weight_dtype: Literal["int4", "int8"] = Field(
        default="int4", description="Integer type of the quantized Linear weights."
    )
    group_size: int = Field(
        default=32,
        ge=8,
        le=4096,
        description="Input channels per weight scale; must divide model.d_model and d_ff.",
    )


class HFModelSpec(_Strict):
    """A Hugging Face `transformers` causal LM; read when `model.kind` is `hf`. Exactly one of
    `path_or_id` or `from_config`."""

    path_or_id: str | None = Field(
        default=None,
        description="A local directory written by `save_pretrained`, or a hub model id "
        "(`AutoModelForCausalLM.from_pretrained`; the workers need the files or hub access).",
    )
    from_config: dict[str, Any] | None = Field(
        default=None,
        description='A config dict with `model_type` (e.g. `{"model_type": "llama", '
        '"num_hidden_layers": 2, ...}`): the model is built from it '
        "(`AutoConfig.for_model` + `AutoModelForCausalLM.from_config`) with random weights "
        "drawn from the job seed. Its `vocab_size` must be at least 256 (byte-level data).",
    )
    revision: str | None = Field(
        default=None, description="Hub revision (branch, tag or commit) for `path_or_id`."
    )
    tokenizer: Literal["auto", "bytes"] = Field(
        default="auto",
        description="`auto`: the model's own tokenizer (`AutoTokenizer`) when `path_or_id` has "
        "one, else bytes. `bytes`: token id = byte value (the model's vocabulary >= 256).",
    )


class ModelSpec(_Strict):
    """The network to train: the built-in GPT-style decoder over bytes, or a Hugging Face
    causal LM (`kind: hf`)."""

    kind: Literal["gpt", "hf"] = Field(
        default="gpt",
        description="Model family. `gpt`: built-in causal decoder (pre-norm, GELU MLP, "
        "`F.scaled_dot_product_attention`), byte-level vocabulary of 256. `hf`: a "
        "`transformers` causal LM described by `model.hf` (n_layers, n_heads, d_model, d_ff "
        "and dropout are then ignored; `seq_len` is the training context).",
    )
    hf: HFModelSpec | None = Field(
        default=None, description="The Hugging Face model; required when `kind` is `hf`."
    )
    n_layers: int = Field(default=4, ge=1, le=256, description="Number of transformer blocks.")
    n_heads: int = Field(default=4, ge=1, le=256, description="Attention heads per block.")
    d_model: int = Field(default=128, ge=8, le=16384, description="Hidden size (channels).")
    d_ff: int | None = Field(
        default=None, ge=8, description="MLP inner size; default 4 x `d_model`."
    )
    seq_len: int = Field(
        default=128, ge=8, le=65536, description="Context length in tokens (bytes)."
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout probability.")
    init_from: InitFromSpec | None = Field(
        default=None,
        description="Fine-tune: start from an earlier job's checkpoint instead of a random "
        "init (the job's own checkpoints still take precedence when it resumes).",
    )


class DataSpec(_Strict):
    """Training text. Exactly one of `dataset` or `uri`."""

    dataset: str | None = Field(
        default=None,
        description="Id of a dataset registered through `/v1/datasets` in the job's project.",
    )
    uri: str | None = Field(
        default=None,
        description="A file or directory (local path or fsspec URI) readable by the workers. "
        "Only for trusted deployments; prefer `dataset`.",
    )
    include: list[str] = Field(
        default=["**/*"],
        min_length=1,
        description="Glob patterns selecting files when the data is a directory.",
    )
    exclude: list[str] = Field(
        default=["site-packages/*", "dist-packages/*", "*__pycache__/*", ".git/*"],
        description="`fnmatch` patterns of files to skip, matched against the path relative "
        "to the data directory (`*` also matches `/`).",
    )
    max_bytes: int | None = Field(
        default=None, ge=1024, description="Read at most this many bytes of the corpus."
    )
    eval_fraction: float = Field(
        default=0.05, gt=0.0, lt=0.5, description="Share of the corpus held out for evaluation."
    )


class FSDPSpec(_Strict):
    """FSDP2 (`torch.distributed.fsdp.fully_shard`) knobs; read when `strategy` is `fsdp`."""

    reshard_after_forward: bool = Field(
        default=True,
        description="Free each block's gathered parameters after its forward and gather them "
        "again for backward (ZeRO-3); false keeps them until backward (ZeRO-2, more memory).",
    )
    param_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description="`MixedPrecisionPolicy.param_dtype`: dtype of the gathered parameters used "
        "in forward/backward; the sharded parameters and optimizer state stay fp32.",
    )
    reduce_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description="`MixedPrecisionPolicy.reduce_dtype`: dtype of the gradient reduce-scatter.",
    )
    cpu_offload: bool = Field(
        default=False,
        description="`CPUOffloadPolicy`: keep sharded parameters, gradients and optimizer "
        "state in host memory (CUDA only matters; a no-op placement on CPU).",
    )


class PipelineSpec(_Strict):
    """`torch.distributed.pipelining` knobs; read when `strategy` is `pipeline`."""

    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        default="1f1b",
        description="`gpipe`: all forwards then all backwards (`ScheduleGPipe`). `1f1b`: "
        "one-forward-one-backward (`Schedule1F1B`). `interleaved_1f1b`: several virtual "
        "stages per rank (`ScheduleInterleaved1F1B`, Narayanan et al. 2021).",
    )
    num_microbatches: int = Field(
        default=4,
        ge=1,
        le=4096,
        description="Pipeline micro-batches each `train.micro_batch_size` batch is split into; "
        "at least the number of stages, and dividing `micro_batch_size`.",
    )
    stages_per_rank: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Model chunks (virtual stages) per rank: 1 for `gpipe`/`1f1b`, >= 2 for "
        "`interleaved_1f1b`. Stage s runs on rank s mod world_size.",
    )
    split_points: list[int] | None = Field(
        default=None,
        description="Block indices where stages 1, 2, ... begin (strictly increasing, in "
        "1..n_layers-1, one fewer than the number of stages); null splits the blocks "
        "evenly by count. Embeddings go to the first stage, final norm and head to the last.",
    )


class ParallelismSpec(_Strict):
    """How the model is spread over the job's processes."""

    strategy: Literal["single", "ddp", "fsdp", "tensor", "pipeline"] = Field(
        default="ddp",
        description="`single`: one process. `ddp`: DistributedDataParallel, every rank holds "
        "the whole model and a disjoint shard of each global batch. `fsdp`: FSDP2 "
        "`fully_shard` per block and on the root (HSDP across nodes when nodes > 1; with "
        "`tensor_parallel_size` > 1 a 2-D (dp, tp) mesh). `tensor`: Megatron-style tensor "
        "parallel (`parallelize_module`, column/row-wise attention and MLP) over all ranks, "
        "which all see the same batch. `pipeline`: the blocks split into stages "
        "(`torch.distributed.pipelining`), one batch stream through all ranks.",
    )
    tensor_parallel_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Ranks per tensor-parallel group (the mesh's `tp` axis). `tensor`: null "
        "or the world size. `fsdp`: null/1 for plain FSDP, > 1 for 2-D FSDP x TP with "
        "dp = world_size / tensor_parallel_size. Must divide n_heads, d_model and d_ff.",
    )
    fsdp: FSDPSpec = Field(default_factory=FSDPSpec, description="FSDP2 options.")
    pipeline: PipelineSpec = Field(default_factory=PipelineSpec, description="Pipeline options.")

    def tp_size(self, world_size: int) -> int:
        """Ranks per tensor-parallel group for a job of `world_size` ranks."""
        if self.strategy == "tensor":
            return self.tensor_parallel_size or world_size
        if self.strategy == "fsdp":
            return self.tensor_parallel_size or 1
        return 1

    def dp_size(self, world_size: int) -> int:
        """Data-parallel ranks (distinct batch shards) for a job of `world_size` ranks."""
        if self.strategy == "pipeline":
            return 1
        return max(1, world_size // self.tp_size(world_size))


# Linear layers of each block of the built-in GPT (`trainer.model.Block`), by module path.
GPT_LINEAR_MODULES = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.fc", "mlp.proj")
# Modules of the built-in GPT that `lora.modules_to_save` may name (trained in full).
GPT_SAVABLE_MODULES = ("wpe", "ln_f", "ln_1", "ln_2")


class LoRASpec(_Strict):
    """Low-rank adapters (Hu et al. 2021) through `peft` (`LoraConfig`, `get_peft_model`),
    applied before sharding; only the adapters (and `modules_to_save`) train."""

    r: int = Field(default=8, ge=1, le=4096, description="Rank of each adapter (B A).")
    alpha: float = Field(
        default=16.0, gt=0.0, description="Scaling: the update is (alpha / r) B A x."
    )
    dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input."
    )
    target_modules: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Module names (or dotted suffixes of their paths) that get adapters. "
        "`gpt`: among `wq wk wv wo fc proj` (or `attn.wq`, ..., `blocks.0.attn.wq`); "
        "null: all six. `hf`: the model's own names (e.g. `q_proj`, `c_attn`); null: every "
        "linear layer but the output head (peft's `all-linear`, as in QLoRA).",
    )
    modules_to_save: list[str] = Field(
        default=[],
        description="Modules trained in full next to the adapters and saved with them "
        "(`gpt`: among `wpe ln_f ln_1 ln_2`).",
    )


class QLoRASpec(_Strict):
    """QLoRA (Dettmers et al. 2023): the frozen base weights of the linear layers quantized to
    4 bits with `bitsandbytes`, LoRA adapters (`lora`, or its defaults) trained on top."""

    quant_type: Literal["nf4", "fp4"] = Field(
        default="nf4", description="4-bit data type: `nf4` (NormalFloat, the paper's) or `fp4`."
    )
    double_quant: bool = Field(
        default=True, description="Quantize the quantization constants too (double quant)."
    )
    compute_dtype: Literal["fp32", "bf16", "fp16"] = Field(
        default="bf16",
        description="dtype the 4-bit weights are dequantized to for each matmul "
        "(`bnb_4bit_compute_dtype`).",
    )


class OptimSpec(_Strict):
    """AdamW with linear warmup and a decay schedule (Loshchilov & Hutter 2019)."""

    name: Literal["adamw"] = Field(default="adamw", description="Optimizer.")
    lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    weight_decay: float = Field(default=0.1, ge=0.0, description="Decoupled weight decay.")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="Adam beta1.")
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0, description="Adam beta2.")
    warmup_steps: int = Field(default=50, ge=0, description="Linear warmup length in steps.")
    schedule: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="Decay after warmup, down to `min_lr_ratio` x `lr`."
    )
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0, description="Final lr / peak lr.")
    grad_clip: float | None = Field(
        default=1.0, gt=0.0, description="Max global gradient L2 norm; null disables clipping."
    )


class TrainSpec(_Strict):
    """Batching, precision and stopping."""

    micro_batch_size: int = Field(
        default=16, ge=1, le=65536, description="Sequences per rank per forward/backward."
    )
    grad_accum_steps: int = Field(
        default=1, ge=1, le=4096, description="Micro-batches accumulated per optimizer step."
    )
    max_steps: int = Field(default=1000, ge=1, le=10_000_000, description="Optimizer steps.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32",
        description="`bf16`/`fp16`: autocast (fp16 adds dynamic loss scaling with "
        "`torch.amp.GradScaler`); parameters and optimizer state stay fp32.",
    )
    log_interval_steps: int = Field(
        default=10, ge=1, description="Report train metrics every N optimizer steps."
    )
    activation_checkpointing: bool = Field(
        default=False,
        description="Recompute each block's activations in backward instead of storing them "
        "(`checkpoint_wrapper`, non-reentrant): less memory, about one more forward.",
    )
    compile: bool = Field(
        default=False,
        description="`torch.compile` each transformer block (needs a C++ compiler on CPU).",
    )


class EvalSpec(_Strict):
    """Held-out evaluation."""

    interval_steps: int = Field(default=100, ge=1, description="Evaluate every N steps.")
    num_batches: int = Field(default=8, ge=1, description="Micro-batches per evaluation.")


class CheckpointSpec(_Strict):
    """Sharded checkpoints with `torch.distributed.checkpoint` (DCP)."""

    interval_steps: int = Field(
        default=200, ge=1, description="Save every N steps (and always at the end)."
    )
    keep_last: int = Field(default=2, ge=1, description="Complete checkpoints to keep.")
    async_save: bool = Field(
        default=False, description="Save with `dcp.async_save`: the step pays only staging."
    )
    export_safetensors: bool = Field(
        default=False,
        description="When the run completes, also write its final weights as one "
        "consolidated `CKPT/export/model.safetensors` + `config.json` (as "
        "`python -m trainer.export`).",
    )


class SampleSpec(_Strict):
    """Text generated from the trained model at the end of the run."""

    prompt: str = Field(default="def ", max_length=1000, description="Prompt text.")
    max_new_tokens: int = Field(default=200, ge=0, le=4096, description="Tokens to generate.")
    temperature: float = Field(default=0.8, gt=0.0, le=10.0, description="Softmax temperature.")


class ResourcesSpec(_Strict):
    """Where and how wide the job runs."""

    nodes: int = Field(default=1, ge=1, le=1024, description="Hosts (one torchrun each).")
    procs_per_node: int = Field(
        default=1, ge=1, le=64, description="Processes (ranks) per host; one per GPU on CUDA."
    )
    device: Literal["cpu", "cuda"] = Field(
        default="cpu", description="`cpu` uses gloo, `cuda` uses NCCL."
    )
    pool: Name = Field(default="default", description="Worker pool (Celery queue) to run on.")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


class RetrySpec(_Strict):
    """What happens when an attempt fails.

    Two levels: `max_inplace_restarts` is torchrun's own `--max-restarts`: when a rank fails,
    torchrun stops and restarts all local ranks of the worker group on the same worker, and
    they resume from the latest complete checkpoint, without going back through the queue
    (the job stays in its attempt; a `ranks restarted in place` event says so). When those
    are used up, or the worker itself is lost, `max_restarts` job-level restarts (a new
    attempt through the queue, on any worker, from the latest complete checkpoint) are the
    fallback. In-place restarts are for single-node jobs. torchrun restarts on any rank failure,
    whatever its cause: a spec or data error (exit 2) is run again and fails the same way, then
    the job fails without a job-level restart.
    """

    max_restarts: int = Field(
        default=0, ge=0, le=100, description="Restarts from the latest checkpoint after failure."
    )
    max_inplace_restarts: int = Field(
        default=0,
        ge=0,
        le=100,
        description="torchrun restarts of all local ranks after a rank fails, in the same "
        "attempt (`torchrun --max-restarts`), each resuming from the latest complete checkpoint; "
        "tried before `max_restarts`. Single-node jobs only.",
    )
    retry_oom: bool = Field(
        default=False,
        description="Also restart after running out of memory (usually it fails again the same "
        "way). Spec and data errors are never retried.",
    )


class LimitsSpec(_Strict):
    """Hard limits on a job."""

    max_runtime_s: float | None = Field(
        default=None,
        gt=0,
        description="Wall-clock seconds of training (all attempts together) after which the "
        "run checkpoints and stops with reason `max_runtime`; null for no limit.",
    )


class JobSpec(_Strict):
    """A training job, version 1."""

    spec_version: Literal[1] = Field(default=SPEC_VERSION, description="Spec format version.")
    name: Name = Field(description="Human-readable job name (not unique).")
    labels: dict[str, str] = Field(
        default={}, max_length=64, description="Free-form key/value labels."
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed for init, data and RNG.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="The network.")
    lora: LoRASpec | None = Field(
        default=None, description="Train LoRA adapters instead of the whole model."
    )
    qlora: QLoRASpec | None = Field(
        default=None,
        description="Quantize the frozen base to 4 bits and train LoRA adapters on it "
        "(`lora`'s settings, or its defaults when `lora` is null).",
    )
    data: DataSpec = Field(description="The training text.")
    parallelism: ParallelismSpec = Field(
        default_factory=ParallelismSpec, description="Distribution strategy."
    )
    optim: OptimSpec = Field(default_factory=OptimSpec, description="Optimizer and schedule.")
    train: TrainSpec = Field(default_factory=TrainSpec, description="Batch, precision, stop.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Evaluation.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    sample: SampleSpec = Field(default_factory=SampleSpec, description="Final text sample.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Placement.")
    retries: RetrySpec = Field(default_factory=RetrySpec, description="Retry policy.")
    limits: LimitsSpec = Field(default_factory=LimitsSpec, description="Hard limits.")
    qat: QATSpec | None = Field(
        default=None, description="Quantization-aware training (torchao); null for none."
    )
    priority: int = Field(
        default=0,
        ge=-100,
        le=100,
        description="Scheduling priority within the pool: higher runs first, ties by age.",
    )

    @model_validator(mode="after")
    def _cross_field_checks(self) -> JobSpec:
        """Checks that span fields; each error names the JSON path of the field to change."""
        errors = list(_cross_field_errors(self))
        if errors:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError("spec_conflict", message),
                        loc=loc,
                        input=_get_path(self, loc),
                    )
                    for loc, message in errors
                ],
            )
        return self

    @property
    def world_size(self) -> int:
        return self.resources.world_size

    @property
    def data_parallel_size(self) -> int:
        """Ranks that take distinct shares of each global batch (tensor-parallel groups and
        pipelines see one share together)."""
        return self.parallelism.dp_size(self.world_size)

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step over all ranks."""
        return self.train.micro_batch_size * self.train.grad_accum_steps * self.data_parallel_size

    @classmethod
    def load(cls, path: str | Path) -> JobSpec:
        """Read a spec from a JSON file. Raises `pydantic.ValidationError` when invalid."""
        return cls.model_validate(json.loads(Path(path).read_text()))

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2))


def _get_path(spec: BaseModel, loc: tuple[str, ...]) -> Any:
    value: Any = spec
    for part in loc:
        value = getattr(value, part)
    return value.model_dump() if isinstance(value, BaseModel) else value


def _cross_field_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
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
    errors += _model_source_errors(spec)
    errors += _finetune_errors(spec)
    if spec.eval.interval_steps > spec.train.max_steps:
        errors.append(
            (
                ("eval", "interval_steps"),
                f"interval_steps ({spec.eval.interval_steps}) exceeds train.max_steps "
                f"({spec.train.max_steps}): the run would never evaluate",
            )
        )
    return errors


def _parallelism_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
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


def _pipeline_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
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


QAT_STRATEGIES = ("single", "ddp", "fsdp")


def _qat_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
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


def _model_source_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
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
        (("model", "init_from"), model.init_from is not None, "model.init_from"),
        (("qat",), spec.qat is not None, "qat"),
        (("checkpoint", "export_safetensors"), spec.checkpoint.export_safetensors,
         "checkpoint.export_safetensors"),
    ]  # fmt: skip
    for loc, used, what in gpt_only:
        if used:
            errors.append((loc, f"{what} is for model.kind 'gpt', not a Hugging Face model"))
    return errors


def _finetune_errors(spec: JobSpec) -> list[tuple[tuple[str, ...], str]]:
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


def json_schema() -> dict[str, Any]:
    """The public JSON Schema of `JobSpec`."""
    return JobSpec.model_json_schema()
