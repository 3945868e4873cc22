"""The sections of a job spec (`jobspec.job`): the model, LoRA/QLoRA, parallelism, optimizer,
training, evaluation, checkpointing, placement, retries and limits, each a small pydantic model
whose field descriptions are the public JSON Schema (docs/reference/spec.md), and the spec's
shared vocabulary (`STORED`, `Name`).

Apart from `jobspec.job` so that the cross-field checks (`jobspec.checks`), which `JobSpec`'s
validator runs, read the sections they check without importing the spec that runs them: no
import circle, not even a type-only one (issue 46). `jobspec.job` re-exports every name here.

Over 500 lines on purpose: one section is one model, and their descriptions are the schema's.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, Protocol

from pydantic import (
    ConfigDict,
    Field,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from dataformat.failures import FailureClass
from jobspec.base import StrictSpec, given
from jobspec.data import DataSpec
from jobspec.method import MethodSpec

SPEC_VERSION: Final = 1

STORED: Final = {"stored": True}
"""Validation context of a spec read back (a database row, the spec file a worker wrote for the
trainer, the spec saved with a checkpoint): `jobspec.checks.submission_errors` is not applied, so
a spec accepted before one of those rules existed is still read as it was written."""


def is_stored(info: ValidationInfo) -> bool:
    """Whether the spec being validated is read back (`STORED`), not submitted."""
    return isinstance(info.context, dict) and bool(info.context.get("stored"))


NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
NAME_FIELD_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # with the length checked apart
Name = Annotated[
    str,
    Field(
        min_length=1,
        max_length=100,
        pattern=NAME_FIELD_PATTERN,
        description="Letters, digits, '.', '_' and '-'; starts with a letter or digit.",
    ),
]


class InitFromSpec(StrictSpec):
    """Start from the model weights of an earlier job's checkpoint (fine-tuning).

    Only the weights are taken (not the optimizer, schedule or step), under any parallelism
    and world size (DCP reshards by parameter name). Give `job` (its latest complete
    checkpoint, pinned when the job is submitted) or `checkpoint` (an id from
    `GET /v1/jobs/{id}/checkpoints`), or both (the checkpoint must be of that job). Both must
    be of the job's project, and the model's shape must equal the earlier job's.
    """

    model_config = ConfigDict(
        **StrictSpec.model_config, json_schema_extra={"anyOf": [given("job"), given("checkpoint")]}
    )

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


class QATSpec(StrictSpec):
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


class HFModelSpec(StrictSpec):
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


class ModelSpec(StrictSpec):
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


class FSDPSpec(StrictSpec):
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


class PipelineSpec(StrictSpec):
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


class ParallelismSpec(StrictSpec):
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


class LoRASpec(StrictSpec):
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


class QLoRASpec(StrictSpec):
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


class OptimSpec(StrictSpec):
    """AdamW with linear warmup and a decay schedule (Loshchilov & Hutter 2019)."""

    name: Literal["adamw"] = Field(default="adamw", description="Optimizer.")
    lr: float = Field(default=1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    weight_decay: float = Field(default=0.1, ge=0.0, description="Decoupled weight decay.")
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0, description="Adam beta1.")
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0, description="Adam beta2.")
    warmup_steps: int = Field(
        default=50,
        ge=0,
        description="Linear warmup length in steps, at most `train.max_steps`; left out, 50 "
        "or `train.max_steps` when the run is shorter.",
    )
    schedule: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="Decay after warmup, down to `min_lr_ratio` x `lr`."
    )
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0, description="Final lr / peak lr.")
    grad_clip: float | None = Field(
        default=1.0, gt=0.0, description="Max global gradient L2 norm; null disables clipping."
    )


class ProfileSpec(StrictSpec):
    """`torch.profiler` over a window of optimizer steps (each rank its own trace)."""

    start_step: int = Field(
        default=10,
        ge=1,
        description="First profiled optimizer step (1-based, counted from the attempt's "
        "start); the steps before it warm up (compilation, the allocator's cache).",
    )
    num_steps: int = Field(default=10, ge=1, le=100, description="Steps profiled.")


class TrainSpec(StrictSpec):
    """Batching, precision and stopping."""

    # Exactly one of `max_steps` (default 1000) and `epochs` ends the run: not both given, and
    # not `max_steps: null` without `epochs`.
    model_config = ConfigDict(
        **StrictSpec.model_config,
        json_schema_extra={
            "not": {
                "anyOf": [
                    given("max_steps", "epochs"),
                    {
                        "required": ["max_steps"],
                        "properties": {"max_steps": {"type": "null"}, "epochs": {"type": "null"}},
                    },
                ]
            }
        },
    )

    micro_batch_size: int = Field(
        default=16, ge=1, le=65536, description="Sequences per rank per forward/backward."
    )
    grad_accum_steps: int = Field(
        default=1, ge=1, le=4096, description="Micro-batches accumulated per optimizer step."
    )
    max_steps: int | None = Field(
        default=1000,
        ge=1,
        le=10_000_000,
        description="Optimizer steps; null when `epochs` governs (the default when `epochs` "
        "is given). Exactly one of `max_steps` and `epochs` is set.",
    )
    epochs: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Passes over the training rows instead of `max_steps`: the run takes "
        "ceil(epochs x rows / global batch) steps, each epoch in its own shuffle drawn from "
        "the seed (a resumed run continues mid-epoch in the same order).",
    )
    precision: Literal["fp32", "bf16", "fp16", "fp8"] = Field(
        default="fp32",
        description="`bf16`/`fp16`: autocast (fp16 adds dynamic loss scaling with "
        "`torch.amp.GradScaler`); parameters and optimizer state stay fp32. `fp8`: bf16 "
        "autocast with every block's Linear layers computing in float8 (torchao's "
        "`Float8Linear`: e4m3 inputs and weights, e5m2 gradients, dynamic scales per "
        "`fp8_recipe`), full fine-tuning or pretraining only; on CUDA it needs compute "
        "capability 8.9 or later (Ada, Hopper, Blackwell) and is refused at launch on older "
        "GPUs with the reason.",
    )
    fp8_recipe: Literal["tensorwise", "rowwise"] = Field(
        default="tensorwise",
        description="With `precision: fp8`, torchao's float8 scaling: `tensorwise` (one scale "
        "per tensor, the fastest) or `rowwise` (one per row of each operand, closer to bf16 "
        "at some speed). Ignored otherwise.",
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
    tf32: bool = Field(
        default=True,
        description="fp32 matrix products on TF32 tensor cores (`torch.set_float32_matmul_"
        "precision('high')`) on CUDA GPUs of compute capability 8.0 and later (Ampere, "
        "Hopper): inputs rounded to a 10-bit mantissa, fp32 accumulation, several times the "
        "fp32 rate. Under bf16/fp16 autocast it touches only the products left in fp32. No "
        "effect on CPU.",
    )
    profile: ProfileSpec | None = Field(
        default=None,
        description="Profile `num_steps` optimizer steps from `start_step` with "
        "`torch.profiler` (CPU and CUDA activity): each rank writes a Chrome trace "
        "(`profile/rank<r>.json.gz`, open in Perfetto) and a summary (`profile/rank<r>."
        "summary.json`: top kernels, communication vs compute, the device's idle time) next "
        "to the checkpoints, and logs the summary. Profiled steps run slower.",
    )

    @model_validator(mode="before")
    @classmethod
    def _epochs_replace_default_steps(cls, data: Any) -> Any:
        """`epochs` without `max_steps`: the default step count does not apply."""
        if isinstance(data, dict) and data.get("epochs") is not None and "max_steps" not in data:
            return {**data, "max_steps": None}
        return data


class EvalSpec(StrictSpec):
    """Held-out evaluation."""

    interval_steps: int = Field(default=100, ge=1, description="Evaluate every N steps.")
    num_batches: int = Field(default=8, ge=1, description="Micro-batches per evaluation.")
    at_start: bool = Field(
        default=False,
        description="Also evaluate the starting weights, reported at step 0, when a run starts "
        "fresh (not when it resumes from its own checkpoint): the baseline of the eval curve. "
        "A run from `model.init_from` always does.",
    )


class CheckpointSpec(StrictSpec):
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
        "`python -m trainer.exports.safetensors`).",
    )


class SampleSpec(StrictSpec):
    """Text generated from the trained model at the end of the run."""

    prompt: str = Field(default="def ", max_length=1000, description="Prompt text.")
    max_new_tokens: int = Field(default=200, ge=0, le=4096, description="Tokens to generate.")
    temperature: float = Field(default=0.8, gt=0.0, le=10.0, description="Softmax temperature.")


class ResourcesSpec(StrictSpec):
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


class RetrySpec(StrictSpec):
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
        "way) within `max_restarts`; `on.oom` overrides it.",
    )
    on: dict[FailureClass, Annotated[int, Field(ge=0, le=100)]] = Field(
        default={},
        description="Restarts allowed per failure class (`oom`, `hang`, `node_lost`, `infra`, "
        "`user_error`, `preempted`), overriding `max_restarts` for that class. A class not named "
        "gets `max_restarts`, except `user_error` (0) and `oom` (0 unless `retry_oom`). "
        "`preempted` attempts are requeued without using any budget.",
    )
    max_total_restarts: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="Cap on restarts of all classes together; null: the largest per-class "
        "budget (`max_restarts` or a value in `on`).",
    )


class LimitsSpec(StrictSpec):
    """Hard limits on a job."""

    max_runtime_s: float | None = Field(
        default=None,
        gt=0,
        description="Wall-clock seconds of training (all attempts together) after which the "
        "run checkpoints and stops with reason `max_runtime`; null for no limit.",
    )
    max_cost: float | None = Field(
        default=None,
        gt=0,
        description="Cost (slot-hours x the pool's price, in the server's currency; all "
        "attempts together) at which the run checkpoints and stops with reason `budget`; "
        "checked while the trainer runs (about every second). The pool must have a price "
        "(`TORCHYARD_SLOT_PRICES`). Null for no limit.",
    )
    hang_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds without step progress (after the first step) after which the "
        "worker dumps every rank's Python stacks into the job's logs and stops the attempt as "
        "hung (failure class `hang`); null: 10x the median time between the job's step "
        "reports, at least the worker's `TORCHYARD_HANG_TIMEOUT_FLOOR_S` (300 s).",
    )


class TrainerSections(Protocol):
    """The sections of a built-in trainer's spec that its cross-field rules read: what
    `jobspec.job.JobSpec` is to `jobspec.checks` and `jobspec.method_checks`, named here so that
    they need not import the spec whose validator runs them."""

    model: ModelSpec
    lora: LoRASpec | None
    qlora: QLoRASpec | None
    data: DataSpec
    method: MethodSpec
    parallelism: ParallelismSpec
    optim: OptimSpec
    train: TrainSpec
    eval: EvalSpec
    checkpoint: CheckpointSpec
    qat: QATSpec | None
    resources: ResourcesSpec
    retries: RetrySpec
    limits: LimitsSpec

    @property
    def world_size(self) -> int: ...
