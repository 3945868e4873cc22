"""The method's cross-field rules (`jobspec.checks.cross_field_errors` runs them): which data
each method trains on (`method_data_error`, also the API's rule for a registered dataset and the
trainer's for the data it finds), and the strategies, packing and QAT each method allows."""

from __future__ import annotations

from jobspec.graders import file_graders
from jobspec.sections import TrainerSections

# Record formats a GRPO job reads prompts from (`trainer.data.prompts`).
GRPO_FORMATS = ("prompt", "prompt_completion", "messages")


def method_data_error(kind: str, format: str) -> str | None:
    """Why a job of `method.kind` `kind` cannot train on data of `format`, or None when it
    can: DPO and only DPO on preference pairs, a `prompt` dataset with GRPO only, GRPO on
    `GRPO_FORMATS`. The one rule of the spec checks, the API (a registered dataset's format)
    and the trainer (the format it found)."""
    if kind == "grpo":
        if format in GRPO_FORMATS:
            return None
        return (
            f"method.kind grpo reads prompts from {', '.join(GRPO_FORMATS)} records, not {format!r}"
        )
    if format == "preference" and kind != "dpo":
        return f"a preference dataset trains with method.kind dpo (method.kind is {kind!r})"
    if kind == "dpo" and format != "preference":
        return f"method.kind dpo needs a preference dataset (this one is {format!r})"
    if format == "prompt":
        return (
            "a prompt dataset has no answers to learn from: it trains with method.kind grpo "
            f"(method.kind is {kind!r})"
        )
    return None


def method_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """A declared `data.format` the method cannot train on (`method_data_error`); DPO needs
    unpacked pairs and a model whose logits each rank holds whole; so does GRPO.

    Without `data.format`, the format is known when the dataset is (the API, for a registered
    dataset) or read (the trainer, for a `uri`), and the same rule applies there."""
    unfit = spec.data.format and method_data_error(spec.method.kind, spec.data.format)
    errors: list[tuple[tuple[str, ...], str]] = [(("data", "format"), unfit)] if unfit else []
    if spec.method.kind == "grpo":
        return errors + _grpo_errors(spec)
    if spec.method.kind != "dpo":
        return errors
    par = spec.parallelism
    if par.strategy in ("tensor", "pipeline") or par.tp_size(spec.world_size) > 1:
        errors.append(
            (
                ("method", "kind"),
                f"method 'dpo' runs with strategy single, ddp or fsdp (without "
                f"tensor_parallel_size), not {par.strategy!r}: its reference forward and "
                "per-sequence log-probabilities need each rank's whole logits",
            )
        )
    # `data.packing` arrives with the data pipeline (issue 11); until then nothing packs.
    if spec.data.packing:
        errors.append(
            (
                ("data", "packing"),
                "method 'dpo' scores whole answers, one pair per row: set data.packing false",
            )
        )
    if spec.qat is not None:
        errors.append(
            (
                ("qat",),
                "qat cannot be combined with method 'dpo' (the reference would not be "
                "fake-quantized like the policy)",
            )
        )
    return errors


def _grpo_errors(spec: TrainerSections) -> list[tuple[tuple[str, ...], str]]:
    """GRPO samples with a model whose logits each rank holds whole (single, ddp, or fsdp
    without tensor parallelism: an FSDP rank's forward gathers the whole parameters), from
    prompts that leave room for a completion within `model.seq_len`."""
    grpo = spec.method.grpo
    assert grpo is not None  # MethodSpec requires it with kind grpo
    errors: list[tuple[tuple[str, ...], str]] = []
    par = spec.parallelism
    if par.strategy not in ("single", "ddp", "fsdp") or par.tp_size(spec.world_size) > 1:
        errors.append(
            (
                ("parallelism", "strategy"),
                f"method 'grpo' runs with strategy single, ddp or fsdp (without "
                f"tensor_parallel_size), not {par.strategy!r}: each rank samples its prompts' "
                "completions from the whole logits",
            )
        )
    if grpo.max_new_tokens >= spec.model.seq_len:
        errors.append(
            (
                ("method", "grpo", "max_new_tokens"),
                f"max_new_tokens {grpo.max_new_tokens} leaves no room for a prompt in "
                f"model.seq_len {spec.model.seq_len}",
            )
        )
    if spec.qat is not None:
        errors.append((("qat",), "qat cannot be combined with method 'grpo'"))
    return errors


def grpo_code_errors(spec: TrainerSections) -> list[tuple[tuple[str | int, ...], str]]:
    """A python grader's `file` (top-level or inside a `multi`) without `method.grpo.code`: a
    built-in trainer job has no code directory but the archive it names. A submission rule
    (`jobspec.checks.submission_errors`): such jobs were accepted before, and failed at launch."""
    grpo = spec.method.grpo
    if grpo is None or grpo.code is not None:
        return []
    return [
        (
            ("method", "grpo", "graders", index, *inside, "file"),
            "a python grader's `file` is read from the job's code directory: give "
            "method.grpo.code, the id of a code archive of the project that holds it "
            "(`torchyard code upload DIR`)",
        )
        for index, inside, _ in file_graders(grpo.graders)
    ]
