"""The `reward` evaluation of an eval job (`trainer.eval_reward`) on what the trainer wrote.

On a GRPO job's checkpoint and starting weights with every default, it answers the job's own
held-out prompts greedily and scores them with the job's graders: its reward equals the
`eval_reward` the trainer reported at that step (and at step 0), and each stored completion is
what greedy decoding by another function (`trainer.models.gpt.generate`) gives, with the reward
the graders' formulas give by hand. On a supervised job's starting weights, a prompt dataset and
graders of its own score sampled completions the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from jobspec.job import JobSpec
from tests.support.grpo import GRADERS, write_prompts
from tests.support.training import (
    cpu_world_of_one,
    evaluate_in_process,
    explain,
    read_events,
    run_trainer,
    statuses,
    tiny_spec,
)
from trainer.evaluate import load_checkpoint_model
from trainer.models.gpt import generate

STEPS = 2
# Beside tests.support.grpo's graders, one that scores the prompt's record, not the completion:
# greedy completions of a tiny model are all alike (their `lower` is 0 at first, 1 two steps
# later), so without it every prompt would score the same and any prompts would do.
ANSWER_LENGTH = {
    "type": "python",
    "name": "answer_length",
    "source": "def grade(sample, item):\n    return len(item['answer']) / 10\n",
}
EVAL_PROMPTS = 2 * 4  # the trainer's eval.num_batches x micro_batch_size (one rank)


def _lower(text: str) -> float:
    """tests.support.grpo's `lower` grader, by hand."""
    return sum(c.islower() for c in text) / max(len(text), 1)


def _grpo_spec(data: Path) -> JobSpec:
    spec = tiny_spec(
        data,
        model={"seq_len": 48},
        method={
            "kind": "grpo",
            "grpo": {
                "group_size": 8,
                "max_new_tokens": 8,
                "graders": [*GRADERS, ANSWER_LENGTH],
            },
        },
        train={"micro_batch_size": 4, "max_steps": STEPS, "log_interval_steps": STEPS},
        eval={"interval_steps": STEPS, "num_batches": 2, "at_start": True},
        optim={"lr": 1e-2, "warmup_steps": 0},
        checkpoint={"interval_steps": STEPS},
    )
    spec.data.eval_fraction = 0.3  # held-out prompts for the trainer's whole eval batches
    return spec


def test_the_reward_of_a_grpo_checkpoint_is_its_trainers_eval_reward_and_grades_by_hand(
    tmp_path: Path,
) -> None:
    data = tmp_path / "prompts"
    data.mkdir()
    write_prompts(data / "prompts.jsonl", repeat=4)
    spec = _grpo_spec(data)
    proc = run_trainer(spec, tmp_path / "train", nproc=None)
    assert proc.returncode == 0, explain(proc)
    events = read_events(tmp_path / "train" / "run")
    done = statuses(events)[-1]["data"]
    uri, step = done["checkpoint_uri"], done["steps"]
    eval_reward = {
        e["step"]: e["values"]["eval_reward"]
        for e in events
        if e["type"] == "metric" and "eval_reward" in e["values"]
    }
    assert sorted(eval_reward) == [0, step]
    held = next(e for e in events if e["type"] == "data")["eval_prompts"]
    assert held >= EVAL_PROMPTS, "the split leaves the trainer's eval batches whole"

    evaluation = {"kind": "reward", "max_prompts": EVAL_PROMPTS}
    initial, _ = evaluate_in_process(spec, None, [evaluation], tmp_path / "initial")
    assert initial["reward"]["reward"] == pytest.approx(eval_reward[0], rel=1e-6, abs=1e-9)
    checkpoint = {"id": 1, "step": step, "uri": uri}
    results, written = evaluate_in_process(spec, checkpoint, [evaluation], tmp_path)
    scored = results["reward"]
    assert scored["reward"] == pytest.approx(eval_reward[step], rel=1e-6, abs=1e-9)
    assert scored["reward_std"] > 0, "prompts that differ in reward: which ones counts"
    assert scored["answers"] == EVAL_PROMPTS
    assert scored["grader_errors/lower"] == 0 and scored["grader_timeouts/lower"] == 0
    (reported,) = [e for e in written if e["type"] == "evaluation"]
    assert reported["kind"] == "reward" and reported["metrics"] == scored
    samples = reported["samples"]

    network = load_checkpoint_model(spec, uri, {}, cpu_world_of_one())
    answers = {json.loads(line)["prompt"]: json.loads(line)["answer"] for line in
               (data / "prompts.jsonl").read_text().splitlines()}  # fmt: skip
    by_hand = []
    for sample in samples:
        prompt = torch.tensor(list(sample["prompt"].encode()), dtype=torch.long)
        ids = generate(
            network.model, prompt, 8, 0.0, torch.Generator(), vocab_size=network.vocab_size
        )
        text = bytes(ids.tolist()).decode("utf-8", errors="replace")
        assert sample["completion"] == text
        answer = answers[sample["prompt"]]
        exact, length = float(text.strip() == answer), len(answer) / 10
        assert sample["scores"] == {
            "lower": pytest.approx(_lower(text)),
            "exact": exact,
            "answer_length": pytest.approx(length),
        }
        by_hand.append(_lower(text) + 0.0 * exact + length)
        assert sample["reward"] == pytest.approx(by_hand[-1])
    assert scored["reward"] == pytest.approx(sum(by_hand) / len(by_hand))
    assert scored["reward_std"] == pytest.approx(float(torch.tensor(by_hand).std()), abs=1e-6)


def test_a_prompt_dataset_and_graders_of_its_own_score_a_supervised_jobs_samples(
    corpus_dir: Path, tmp_path: Path
) -> None:
    records = [{"prompt": f"def f{i}(", "answer": "x"} for i in range(3)]
    path = tmp_path / "asks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    graders: list[dict[str, Any]] = [
        {"type": "string_check", "name": "has_x", "operation": "like",
         "input": "{{ sample.output_text }}", "reference": "{{ item.answer }}"},
        {"type": "python", "name": "distinct", "weight": 0.5,
         "source": "def grade(sample, item):\n    return len(set(sample['output_text'])) / 10\n"},
    ]  # fmt: skip
    evaluation = {
        "kind": "reward",
        "name": "asks",
        "dataset": "ds_asks",
        "graders": graders,
        "max_new_tokens": 6,
        "temperature": 1.0,
        "samples_per_prompt": 2,
    }
    dataset = {"id": "ds_asks", "uri": str(path), "format": "prompt"}
    results, written = evaluate_in_process(
        tiny_spec(corpus_dir), None, [evaluation], tmp_path, datasets={"asks": dataset}
    )
    scored = results["asks"]
    assert scored["answers"] == 6  # 3 prompts x 2 samples
    (reported,) = [e for e in written if e["type"] == "evaluation"]
    assert reported["step"] == 0
    samples = reported["samples"]
    assert [s["prompt"] for s in samples] == [r["prompt"] for r in records for _ in range(2)]
    rewards = []
    for sample in samples:
        text = sample["completion"]
        assert len(text) <= 6
        has_x, distinct = float("x" in text), len(set(text)) / 10
        assert sample["scores"] == {"has_x": has_x, "distinct": pytest.approx(distinct)}
        rewards.append(has_x + 0.5 * distinct)
        assert sample["reward"] == pytest.approx(rewards[-1])
    assert scored["reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert scored["reward/distinct"] == pytest.approx(
        sum(len(set(s["completion"])) / 10 for s in samples) / 6
    )
