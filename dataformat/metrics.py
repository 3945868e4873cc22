"""The metric names the built-in trainer reports (docs/CONTRACTS.md section 2), shared by the
trainer that writes them and the server that checks a sweep's `metric` against them.

Torch-free: the trainer's methods import these tuples; `jobspec.sweep` and the API import
`trainer_metrics`.
"""

from __future__ import annotations

# Every training step (trainer.loop): the mean token loss of the global batch, the lr used,
# the gradient norm before clipping, throughput.
STEP_METRICS = ("loss", "lr", "grad_norm", "tokens_per_second")
# Order of DPO's per-pair statistics (trainer.methods.dpo.pair_statistics), reported each step
# and, prefixed `eval_`, at each evaluation.
DPO_METRICS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margin",
    "rewards/accuracy",
    "logps/chosen",
    "logps/rejected",
)
# GRPO's per-step statistics (trainer.methods.grpo_train.GRPOMethod.step_metrics), beside one
# `reward/<grader>` per grader (`kl` only with beta > 0), and its evaluation's.
GRPO_METRICS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "completion_length",
    "entropy",
    "clip_ratio/low",
    "clip_ratio/high",
    "clip_ratio/region",
    "kl",
)
GRPO_EVAL_METRICS = ("eval_reward",)
# Per grader `<kind>/<grader name>`: its mean score, and its errors and timeouts so far.
GRADER_METRICS = ("reward", "grader_errors", "grader_timeouts")
# An eval job's `reward` evaluation (trainer.eval_reward), beside GRADER_METRICS per grader:
# three of GRPO_METRICS over its completions, and how many it scored.
REWARD_EVAL_METRICS = ("reward", "reward_std", "completion_length", "answers")
# What QAT's final evaluation adds (trainer.methods.qat).
QAT_METRICS = ("eval_loss_qat_fake", "eval_loss_qat_converted")


def headline_metrics(method_kind: str) -> tuple[str, str]:
    """(training, evaluation) metric a built-in trainer job of `method_kind` is read by:
    GRPO's `reward` and `eval_reward` (higher is better; its `eval_loss` is -eval_reward),
    else `loss` and `eval_loss` (nats per token, lower is better)."""
    return ("reward", "eval_reward") if method_kind == "grpo" else ("loss", "eval_loss")


def trainer_metrics(
    method_kind: str, *, qat: bool = False, graders: tuple[str, ...] = ()
) -> frozenset[str]:
    """The names a built-in trainer job of `method_kind` (`sft`, `dpo`, `grpo`) reports;
    `graders`: a GRPO job's grader names (each reports `reward/<name>`)."""
    names = set(STEP_METRICS) | {"eval_loss"}
    if method_kind == "dpo":
        names |= set(DPO_METRICS) | {f"eval_{name}" for name in DPO_METRICS}
    if method_kind == "grpo":
        names |= set(GRPO_METRICS) | set(GRPO_EVAL_METRICS)
        names |= {f"{kind}/{g}" for kind in GRADER_METRICS for g in graders}
    if qat:
        names |= set(QAT_METRICS)
    return frozenset(names)
