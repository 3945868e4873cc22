"""The job spec's method section (`JobSpec.method`): what the model learns from the data,
next-token prediction (`sft`), preferences (`dpo`) or graded samples of its own (`grpo`).
Pure pydantic (the API imports it through `jobspec.job`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from jobspec.base import StrictSpec, given
from jobspec.entrypoint import CODE_ID_PATTERN
from jobspec.graders import Graders


class DPOSpec(StrictSpec):
    """Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290); read when
    `method.kind` is `dpo`. Each pair's loss compares the policy's log-ratio to the reference
    model, log pi(y|x) - log pi_ref(y|x), of the chosen answer with that of the rejected one."""

    # `label_smoothing` only with the sigmoid loss (as `_smoothing_is_for_sigmoid`).
    model_config = ConfigDict(
        **StrictSpec.model_config,
        json_schema_extra={
            "not": {
                "required": ["label_smoothing", "loss_type"],
                "properties": {
                    "label_smoothing": {"not": {"const": 0}},
                    "loss_type": {"not": {"const": "sigmoid"}},
                },
            }
        },
    )

    beta: float = Field(
        default=0.1,
        gt=0.0,
        le=100.0,
        description="KL strength: the implicit reward is beta x the log-ratio (sigmoid); IPO's "
        "target margin is 1 / (2 beta) (its tau).",
    )
    loss_type: Literal["sigmoid", "ipo"] = Field(
        default="sigmoid",
        description="`sigmoid`: -log sigmoid(beta h) of the paper (with `label_smoothing`, the "
        "conservative cDPO loss). `ipo`: (h / length - 1 / (2 beta))^2 of IPO (Azar et al. "
        "2023, eq. 17), log-ratios averaged per answer token as TRL does.",
    )
    label_smoothing: float = Field(
        default=0.0,
        ge=0.0,
        lt=0.5,
        description="cDPO: assumed probability that a pair's labels are flipped; the sigmoid "
        "loss becomes -(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h). Sigmoid only.",
    )
    reference: Literal["initial", "none"] = Field(
        default="initial",
        description="`initial`: the starting weights, frozen (under lora/qlora the same model "
        "with its adapters disabled, no second copy; otherwise a copy built like the policy "
        "and sharded the same way). `none`: reference-free (log pi_ref = 0).",
    )

    @model_validator(mode="after")
    def _smoothing_is_for_sigmoid(self) -> DPOSpec:
        if self.label_smoothing and self.loss_type != "sigmoid":
            raise PydanticCustomError(
                "dpo_smoothing", "label_smoothing applies to loss_type 'sigmoid' only"
            )
        return self


class GRPOSpec(StrictSpec):
    """Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300);
    read when `method.kind` is `grpo`. Each step, every prompt of the step's batch gets
    `group_size` completions sampled from the current policy; the graders score them, and a
    completion's advantage is its reward's distance from its group's mean. The loss is PPO's
    clipped surrogate per completion token, plus `beta` x KL to the starting weights. The
    formulas are TRL's `GRPOTrainer`'s (`trainer.methods.grpo`)."""

    graders: Graders = Field(
        description="How a completion is scored: OpenAI's reinforcement fine-tuning graders "
        "(`string_check`, `text_similarity`, `python`, `multi`); the reward is their weighted "
        "sum. Templates read the completion as `sample.output_text` and the dataset record as "
        "`item` (e.g. `{{ item.answer }}`).",
    )
    code: str | None = Field(
        default=None,
        pattern=CODE_ID_PATTERN,
        description="Id of a code archive of the job's project (`POST /v1/code`, `torchyard "
        "code upload DIR`): the job's code directory, where a python grader's `file` is read "
        "(its folder importable by the grader) and which the job sees read-only. Required "
        "with a `file` grader; null: no code directory.",
    )
    group_size: int = Field(
        default=8,
        ge=2,
        le=64,
        description="Completions sampled per prompt (TRL's `num_generations`); a group of "
        "equal rewards teaches nothing, so more completions give more signal per prompt.",
    )
    max_new_tokens: int = Field(
        default=64,
        ge=1,
        le=8192,
        description="Tokens a completion may have (TRL's `max_completion_length`); it ends "
        "earlier at the tokenizer's end-of-sequence token. Prompt + completion must fit "
        "`model.seq_len`: longer prompts are left out (counted in the data event).",
    )
    temperature: float = Field(
        default=1.0, gt=0.0, le=4.0, description="Sampling temperature of the completions."
    )
    top_p: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Nucleus sampling: only the most likely tokens whose probability adds up "
        "to `top_p` (Holtzman et al. 2020); 1 keeps all.",
    )
    top_k: int | None = Field(
        default=None, ge=1, description="Only the `top_k` most likely tokens; null: all."
    )
    beta: float = Field(
        default=0.0,
        ge=0.0,
        le=10.0,
        description="KL strength to the reference, the starting weights (under lora/qlora the "
        "same model with its adapters disabled, no second copy). 0 (TRL's default) builds no "
        "reference.",
    )
    epsilon: float = Field(
        default=0.2, gt=0.0, lt=1.0, description="Clipping: the ratio is kept >= 1 - epsilon."
    )
    epsilon_high: float | None = Field(
        default=None,
        gt=0.0,
        le=10.0,
        description="Upper clipping, ratio <= 1 + epsilon_high (DAPO's clip-higher recommends "
        "0.28); null: `epsilon`.",
    )
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field(
        default="dapo",
        description="How token losses are summed: `grpo` each completion's token mean, then "
        "the mean over completions; `dapo` (TRL's default) the mean over the step's tokens; "
        "`dr_grpo` the sum / (completions x max_new_tokens) (Dr. GRPO: no length bias).",
    )
    num_iterations: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Optimizer steps per batch of sampled completions (TRL's `num_iterations`, "
        "the GRPO paper's mu): the completions are sampled and graded once, then trained on "
        "this many steps, each step counted; the ratio's denominator is the policy that "
        "sampled them, so clipping bounds how far the later steps move. 1: every step samples "
        "anew. A run resumed inside such a cycle continues on the same completions.",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group",
        description="Advantages are divided by the std of the group's rewards (`group`), of "
        "the step's (`batch`), or not at all (`none`, Dr. GRPO: std scaling favours prompts "
        "that are too easy or too hard).",
    )


METHOD_SECTIONS = ("dpo", "grpo")


class MethodSpec(StrictSpec):
    """What the model learns from the data: next-token prediction, preferences, or rewards of
    its own samples."""

    # Each method's section only with its `kind` (as `_sections_match_kind`), in the JSON Schema.
    model_config = ConfigDict(
        **StrictSpec.model_config,
        json_schema_extra={
            "allOf": [
                {
                    "anyOf": [
                        {"not": given(section)},
                        {"required": ["kind"], "properties": {"kind": {"const": section}}},
                    ]
                }
                for section in METHOD_SECTIONS
            ]
        },
    )

    kind: Literal["sft", "dpo", "grpo"] = Field(
        default="sft",
        description="`sft`: cross-entropy on the supervised tokens (raw text, chat and "
        "instruction data). `dpo`: Direct Preference Optimization on a `preference` dataset "
        "(pairs of answers to one prompt), with `dpo`'s settings. `grpo`: reinforcement "
        "fine-tuning on a `prompt` dataset (or the prompts of `prompt_completion` / `messages` "
        "records): completions sampled from the model, scored by `grpo.graders`.",
    )
    dpo: DPOSpec | None = Field(
        default=None,
        description="DPO settings; filled with the defaults when `kind` is `dpo`, refused "
        "with another kind.",
    )
    grpo: GRPOSpec | None = Field(
        default=None,
        description="GRPO settings, required with `kind: grpo` (its `graders` have no "
        "default); refused with another kind.",
    )

    @model_validator(mode="before")
    @classmethod
    def _dpo_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "dpo" and data.get("dpo") is None:
            return {**data, "dpo": {}}
        return data

    @model_validator(mode="after")
    def _sections_match_kind(self) -> MethodSpec:
        for section in METHOD_SECTIONS:
            if self.kind != section and getattr(self, section) is not None:
                raise PydanticCustomError(
                    f"method_{section}_unused",
                    f"method.{section} is read only with method.kind '{section}'",
                )
        if self.kind == "grpo" and self.grpo is None:
            raise PydanticCustomError(
                "method_grpo_missing",
                "method.kind 'grpo' needs method.grpo with its graders (how a completion is "
                "scored)",
            )
        return self
