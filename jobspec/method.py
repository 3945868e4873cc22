"""The job spec's method section (`JobSpec.method`): what the model learns from the data,
next-token prediction (`sft`) or preferences (`dpo`). Pure pydantic (the API imports it
through `jobspec.job`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from jobspec.base import StrictSpec, given


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


class MethodSpec(StrictSpec):
    """What the model learns from the data: next-token prediction or preferences."""

    # `dpo` only with `kind: dpo` (as `_dpo_only_with_dpo`), in the JSON Schema.
    model_config = ConfigDict(
        **StrictSpec.model_config,
        json_schema_extra={
            "anyOf": [
                {"not": given("dpo")},
                {"required": ["kind"], "properties": {"kind": {"const": "dpo"}}},
            ]
        },
    )

    kind: Literal["sft", "dpo"] = Field(
        default="sft",
        description="`sft`: cross-entropy on the supervised tokens (raw text, chat and "
        "instruction data). `dpo`: Direct Preference Optimization on a `preference` dataset "
        "(pairs of answers to one prompt), with `dpo`'s settings.",
    )
    dpo: DPOSpec | None = Field(
        default=None,
        description="DPO settings; filled with the defaults when `kind` is `dpo`, refused with "
        "`sft`.",
    )

    @model_validator(mode="before")
    @classmethod
    def _dpo_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "dpo" and data.get("dpo") is None:
            return {**data, "dpo": {}}
        return data

    @model_validator(mode="after")
    def _dpo_only_with_dpo(self) -> MethodSpec:
        if self.kind != "dpo" and self.dpo is not None:
            raise PydanticCustomError(
                "method_dpo_unused", "method.dpo is read only with method.kind 'dpo'"
            )
        return self
