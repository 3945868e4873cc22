"""The eval job's program (`trainer.evaluate`) on checkpoints the trainer wrote.

`perplexity` on the source's own evaluation split equals the trainer's reported `eval_loss` at
that step (to 1e-5 relative: the same rows, encoded by the same pipeline and scored by the same
function, summed in another order), for a GPT trained with DDP on 2 processes and a LoRA
Llama (its adapters on the frozen base, unmerged). `generate` answers a prompt/completion
dataset's prompts and scores the answers against the completions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobspec.job import JobSpec
from tests.support.training import (
    evaluate_in_process,
    explain,
    read_events,
    run_trainer,
    statuses,
    tiny_llama_dir,
    tiny_spec,
)
from trainer.evaluate import closing_marker, last_supervised_span

REL_TOLERANCE = 1e-5


def _trained(spec: JobSpec, workdir: Path, nproc: int | None) -> tuple[str, int, float]:
    """(final checkpoint URI, its step, the trainer's eval loss there)."""
    proc = run_trainer(spec, workdir, nproc=nproc)
    assert proc.returncode == 0, explain(proc)
    done = statuses(read_events(workdir / "run"))[-1]["data"]
    return done["checkpoint_uri"], done["steps"], done["final_eval_loss"]


def _evaluate(
    spec: JobSpec,
    uri: str,
    step: int,
    evaluations: list[dict[str, Any]],
    tmp_path: Path,
    datasets: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """Run the evaluations of the checkpoint at `uri` in this process, as one rank."""
    checkpoint = {"id": 1, "step": step, "uri": uri}
    return evaluate_in_process(spec, checkpoint, evaluations, tmp_path, datasets=datasets or {})


def test_perplexity_of_a_ddp_gpts_checkpoint_on_its_own_split_is_the_trainers_eval_loss(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        corpus_dir,
        parallelism={"strategy": "ddp"},
        resources={"procs_per_node": 2},
        train={"max_steps": 6, "micro_batch_size": 4},
        eval={"interval_steps": 6, "num_batches": 3},
        checkpoint={"interval_steps": 6},
    )
    uri, step, eval_loss = _trained(spec, tmp_path / "train", nproc=2)
    results, events = _evaluate(spec, uri, step, [{"kind": "perplexity"}], tmp_path)
    scored = results["perplexity"]
    assert scored["loss"] == pytest.approx(eval_loss, rel=REL_TOLERANCE)
    assert scored["perplexity"] == pytest.approx(np.exp(eval_loss), rel=REL_TOLERANCE)
    assert scored["rows"] == 3 * 4 * 2  # num_batches x micro_batch_size x dp ranks
    reported = [e for e in events if e["type"] == "evaluation"]
    assert [(e["name"], e["step"], e["metrics"]["loss"]) for e in reported] == [
        ("perplexity", step, scored["loss"])
    ]
    metrics = [e for e in events if e["type"] == "metric"]
    assert metrics[-1]["values"]["perplexity.loss"] == pytest.approx(scored["loss"])


def test_perplexity_of_a_lora_llamas_checkpoint_uses_its_adapters_unmerged(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        corpus_dir,
        model={"kind": "hf", "hf": {"path_or_id": str(tiny_llama_dir(tmp_path / "llama"))}},
        lora={"r": 4, "alpha": 8.0},
        optim={"lr": 1e-2},
        train={"max_steps": 4, "micro_batch_size": 8},
        eval={"interval_steps": 4, "num_batches": 2},
        checkpoint={"interval_steps": 4, "keep_last": 1},
        sample={"max_new_tokens": 4},
    )
    uri, step, eval_loss = _trained(spec, tmp_path / "train", nproc=None)
    results, _ = _evaluate(spec, uri, step, [{"kind": "perplexity", "name": "own"}], tmp_path)
    assert results["own"]["loss"] == pytest.approx(eval_loss, rel=REL_TOLERANCE)


def test_generate_answers_each_prompt_and_scores_it_against_its_completion(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        corpus_dir,
        train={"max_steps": 2},
        eval={"interval_steps": 2, "num_batches": 1},
        checkpoint={"interval_steps": 2},
    )
    uri, step, _ = _trained(spec, tmp_path / "train", nproc=None)
    records = [{"prompt": f"def f{i}(", "completion": f"x{i}): return x{i}"} for i in range(5)]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    dataset = {"id": "ds_qa", "uri": str(data), "format": "prompt_completion"}
    results, events = _evaluate(
        spec,
        uri,
        step,
        [{"kind": "generate", "dataset": "ds_qa", "max_prompts": 3, "max_new_tokens": 8}],
        tmp_path,
        datasets={"generate": dataset},
    )
    (reported,) = [e for e in events if e["type"] == "evaluation"]
    samples = reported["samples"]
    assert [s["reference"] for s in samples] == [r["completion"] for r in records[:3]]
    assert all(s["prompt"].endswith(r["prompt"]) for s, r in zip(samples, records, strict=False))
    assert all(len(s["answer"].encode()) <= 8 for s in samples)  # bytes: 8 tokens at most
    assert [s["exact_match"] for s in samples] == [
        float(s["answer"] == s["reference"]) for s in samples
    ]
    scores = results["generate"]
    assert scores["answers"] == 3
    assert 0.0 <= scores["chrf"] <= 100.0 and 0.0 <= scores["rouge_l"] <= 1.0
    assert scores["exact_match"] == np.mean([s["exact_match"] for s in samples])


def test_the_last_supervised_span_and_the_templates_closing_marker() -> None:
    mask = np.array([0, 0, 1, 1, 0, 1, 1, 1, 0], dtype=bool)
    assert last_supervised_span(mask) == (5, 8)
    assert last_supervised_span(np.zeros(4, dtype=bool)) is None
    assert closing_marker("Paris.<|im_end|>\n", "Paris.") == "<|im_end|>"
    assert closing_marker("Paris.", "Paris.") == ""
