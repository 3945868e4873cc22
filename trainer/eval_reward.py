"""The `reward` evaluation of an eval job (`jobspec.evaluate.RewardEval`, run by
`trainer.evaluate` on rank 0): held-out prompts answered by the checkpoint's model, the answers
scored by graders, as a GRPO job's trainer measures its `eval_reward`.

- Prompts: the source GRPO job's held-out prompts (`trainer.data.prompts.load_prompts` on its
  data: its evaluation split, in order, so the first are the ones its `eval_reward` scores), or
  the first records of a `prompt`, `prompt_completion` or `messages` dataset
  (`dataset_prompts`); both rendered with the source's chat template. Prompts too long to leave
  `max_new_tokens` within `model.seq_len` are left out.
- Completions and scores: `trainer.methods.rollouts.sample_groups`, as GRPO samples and
  grades (greedy at temperature 0, else seeded by the eval job's `seed`), `samples_per_prompt`
  per prompt, ended at the tokenizer's end-of-sequence token, decoded as GRPO decodes them
  (`completion_codec`), under the source's `train.precision`.
- Graders: `trainer.graders` (a python grader in a child process of its own, inside the eval
  job's sandbox), combined as GRPO's reward (`trainer.methods.grpo.combine_rewards`:
  their weighted sum).

With the source's graders, `max_new_tokens` and greedy decoding, the reward of its first
`eval.num_batches x micro_batch_size x data-parallel size` held-out prompts is the `eval_reward`
its trainer reported for the same weights.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dataformat.errors import InvalidJobError
from dataformat.metrics import GRADER_METRICS, REWARD_EVAL_METRICS
from jobspec.evaluate import RewardEval
from jobspec.job import JobSpec
from trainer.data.prompts import Prompts, dataset_prompts, load_prompts
from trainer.distributed import DistInfo
from trainer.graders import BuiltGrader, build_graders
from trainer.methods.grpo import combine_rewards
from trainer.methods.rollouts import Sampling, completion_codec, sample_groups
from trainer.models.network import Network

REWARD, REWARD_STD, COMPLETION_LENGTH, ANSWERS = REWARD_EVAL_METRICS
MAX_SAMPLES = 1000  # completions returned to be stored (all are scored), as the server keeps
SCORE, ERRORS, TIMEOUTS = GRADER_METRICS


def reward(
    evaluation: RewardEval,
    source: JobSpec,
    inputs: dict[str, Any],
    dataset: dict[str, Any] | None,
    network: Network,
    dist_info: DistInfo,
    seed: int,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """({reward, reward_std, completion_length (tokens), answers, reward/<grader>,
    grader_errors/<grader>, grader_timeouts/<grader>}, one sample per completion, the first
    `MAX_SAMPLES`: its prompt, completion, reward and each grader's score). `dataset`: {id,
    uri, format}, or None for the source's own held-out prompts (`inputs`' `source_data` and
    `source_eval_data`).

    A mean no completion could give (every grader unable to score) is left out. Raises
    `InvalidJobError` when the source cannot give what the evaluation leaves to it
    (`RewardEval.source_errors`), no prompt fits, or a grader cannot be built."""
    try:
        specs, max_new_tokens = evaluation.resolved(source.method.grpo, source.model.seq_len)
    except ValueError as exc:
        raise InvalidJobError(f"{evaluation.name}: {exc}") from exc
    prompts = _prompts(evaluation, source, inputs, dataset, network, max_new_tokens)
    stop, decode = completion_codec(network.tokenizer)
    sampling = Sampling(
        group_size=evaluation.samples_per_prompt,
        max_new_tokens=max_new_tokens,
        temperature=evaluation.temperature,
        top_p=evaluation.top_p,
        top_k=evaluation.top_k,
        stop_ids=stop,
        vocab_size=network.vocab_size,
    )
    generator = torch.Generator(device=dist_info.device).manual_seed(seed)
    # a python grader's `file`: the source's (`method.grpo.code`, `--code-dir`); own: `source`
    code_dir = inputs.get("code_dir")
    graders = build_graders(specs, Path(code_dir) if code_dir else None)
    try:
        groups = sample_groups(
            network.model,
            prompts,
            np.arange(len(prompts)),
            sampling=sampling,
            graders=graders,
            decode=decode,
            device=dist_info.device,
            generator=generator,
            precision=source.train.precision,
        )
        samples = [
            {
                "prompt": decode(group.prompt_ids.tolist()),
                "completion": text,
                "scores": dict(zip([g.name for g in graders], row.tolist(), strict=True)),
            }
            for group in groups
            for text, row in zip(group.texts, group.rewards, strict=True)
        ]
        lengths = [int(length) for group in groups for length in group.mask.sum(1).tolist()]
        metrics = _metrics(samples, graders, lengths)
    finally:
        for grader in graders:
            grader.close()
    return metrics, samples[:MAX_SAMPLES]


def _prompts(
    evaluation: RewardEval,
    source: JobSpec,
    inputs: dict[str, Any],
    dataset: dict[str, Any] | None,
    network: Network,
    max_new_tokens: int,
) -> Prompts:
    """The first `max_prompts` prompts that leave room for `max_new_tokens`. Raises
    `InvalidJobError` without one."""
    if dataset is None:
        grpo = source.method.grpo
        assert grpo is not None  # `resolved` refused a source without prompts
        reading = source.model_copy(
            update={
                "method": source.method.model_copy(
                    update={"grpo": grpo.model_copy(update={"max_new_tokens": max_new_tokens})}
                )
            }
        )
        _, held, _ = load_prompts(
            reading,
            inputs["source_data"],
            network.tokenizer,
            eval_location=inputs["source_eval_data"],
        )
        count = min(len(held), evaluation.max_prompts)
        return Prompts(ids=held.ids[:count], records=held.records[:count])
    prompts, too_long = dataset_prompts(
        source,
        dataset["uri"],
        dataset["format"],
        network.tokenizer,
        max_prompts=evaluation.max_prompts,
        max_new_tokens=max_new_tokens,
    )
    if not len(prompts):
        raise InvalidJobError(
            f"{evaluation.name}: no prompt of {dataset['id']} fits model.seq_len "
            f"{source.model.seq_len} with max_new_tokens {max_new_tokens} ({too_long} too long)"
        )
    return prompts


def _metrics(
    samples: list[dict[str, Any]], graders: list[BuiltGrader], lengths: list[int]
) -> dict[str, float]:
    """The metrics of `samples` (each gets its `reward`, in place; None where no grader
    scored). Non-finite means are left out."""
    per_grader = torch.tensor(
        [[s["scores"][g.name] for g in graders] for s in samples], dtype=torch.float32
    ).view(len(samples), len(graders))
    rewards = combine_rewards(per_grader, torch.tensor([g.weight for g in graders]))
    for sample, value in zip(samples, rewards.tolist(), strict=True):
        sample["reward"] = value if math.isfinite(value) else None
    valid = rewards[~torch.isnan(rewards)].double()
    metrics = {
        REWARD: float(valid.mean()) if valid.numel() else math.nan,
        REWARD_STD: float(valid.std()) if valid.numel() > 1 else 0.0,
        COMPLETION_LENGTH: float(np.mean(lengths)),
        ANSWERS: float(len(samples)),
    }
    for k, grader in enumerate(graders):
        column = per_grader[:, k]
        scored = column[~torch.isnan(column)].double()
        metrics[f"{SCORE}/{grader.name}"] = float(scored.mean()) if scored.numel() else math.nan
        metrics[f"{ERRORS}/{grader.name}"] = float(grader.errors)
        metrics[f"{TIMEOUTS}/{grader.name}"] = float(grader.timeouts)
    return {name: value for name, value in metrics.items() if math.isfinite(value)}
