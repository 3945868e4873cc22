"""The reinforcement fine-tuning example's data (`demos.sums`): a careless
labeler's SFT records, prompts with their true answers, and held-out pairs never trained on;
each file is what the server's format detection and record checks accept."""

from __future__ import annotations

import json
from pathlib import Path

from dataformat.records import detect_format
from demos.sums import write_sums_data


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _pair(question: str) -> tuple[int, int]:
    a, b = question.removeprefix("What is ").removesuffix("?").split("+")
    return int(a), int(b)


def test_sft_answers_are_one_too_many_in_the_noise_share_and_true_otherwise(
    tmp_path: Path,
) -> None:
    data = write_sums_data(tmp_path, max_operand=4, copies=10, noise=0.7)
    records = _lines(data.messages)
    assert len(records) == data.num_train_pairs * 10
    off = [
        int(r["messages"][1]["content"]) - sum(_pair(r["messages"][0]["content"])) for r in records
    ]
    assert sorted(set(off)) == [0, 1] and off.count(1) == 7 * data.num_train_pairs


def test_prompts_carry_the_true_sum_and_held_out_pairs_are_never_trained_on(
    tmp_path: Path,
) -> None:
    data = write_sums_data(tmp_path, max_operand=9, heldout_fraction=0.2)
    prompts, heldout = _lines(data.prompts), _lines(data.heldout)
    assert (len(prompts), len(heldout)) == (80, 20)
    for record in prompts + heldout:
        (turn,) = record["messages"]
        assert turn["role"] == "user" and record["answer"] == str(sum(_pair(turn["content"])))
    trained = {_pair(r["messages"][0]["content"]) for r in _lines(data.messages)}
    assert trained == {_pair(r["messages"][0]["content"]) for r in prompts}
    assert not trained & {_pair(r["messages"][0]["content"]) for r in heldout}


def test_each_file_is_detected_as_the_format_its_job_reads(tmp_path: Path) -> None:
    data = write_sums_data(tmp_path)
    formats = {
        path.name: {detect_format(r) for r in _lines(path)}
        for path in (data.messages, data.prompts, data.heldout)
    }
    assert formats == {
        "sums.messages.jsonl": {"messages"},
        "sums.prompts.jsonl": {"prompt"},
        "sums.heldout.jsonl": {"prompt"},
    }
