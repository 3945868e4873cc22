"""The `lm_eval` evaluation of `trainer.evaluate`: EleutherAI's lm-evaluation-harness on a
checkpoint the trainer wrote.

A LoRA fine-tune of a small Llama (built from a config, with a BPE tokenizer trained here) is
scored on an inline multiple-choice task whose documents are a local JSONL file; the results
equal a direct `lm_eval.simple_evaluate` call on lm-eval's own Hugging Face backend loading
the run's merged export from its directory. The built-in GPT goes through Torchyard's adapter
(`trainer.lm_eval_model.TorchyardLM`), whose log-likelihoods are checked against the model's
own token probabilities.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lm_eval
import pytest
import torch
import torch.nn.functional as F
from lm_eval.tasks import TaskManager

from tests.support.training import (
    evaluate_in_process,
    explain,
    hf_model_with_tokenizer,
    read_events,
    run_trainer,
    statuses,
    tiny_spec,
)

QUESTIONS = [
    ("def add(a, b):\n    return", [" a + b", " a - b", " None"], 0),
    ("import os\nos.path.", ["join", "zzzz", "qqqq"], 0),
    ("for i in", [" range(10):", " ))((", " ,,,"], 0),
    ("class Foo", [":", "(object):", " = 3"], 1),
]


def _task_file(tmp_path: Path) -> Path:
    path = tmp_path / "pick.jsonl"
    rows = [{"question": q, "choices": c, "answer": a} for q, c, a in QUESTIONS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _task(**data: Any) -> dict[str, Any]:
    return {
        "task": "pick",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{answer}}",
        "target_delimiter": "",
        "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        **data,
    }


def _rolling_task(**data: Any) -> dict[str, Any]:
    return {
        "task": "roll",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{question}}",
        "metric_list": [{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}],
        **data,
    }


def test_lm_eval_on_a_lora_llama_equals_a_direct_simple_evaluate_of_its_merged_export(
    corpus_dir: Path, tmp_path: Path
) -> None:
    model_dir = tmp_path / "llama"
    hf_model_with_tokenizer(corpus_dir, model_dir, model_type="llama")
    spec = tiny_spec(
        corpus_dir,
        model={"kind": "hf", "hf": {"path_or_id": str(model_dir)}, "seq_len": 64},
        lora={"r": 4, "alpha": 8.0},
        optim={"lr": 1e-2},
        train={"max_steps": 4, "micro_batch_size": 8},
        eval={"interval_steps": 4, "num_batches": 1},
        checkpoint={"interval_steps": 4, "keep_last": 1},
        sample={"max_new_tokens": 4},
    )
    proc = run_trainer(spec, tmp_path / "train", nproc=None)
    assert proc.returncode == 0, explain(proc)
    done = statuses(read_events(tmp_path / "train" / "run"))[-1]["data"]
    checkpoint = {"id": 1, "step": done["steps"], "uri": done["checkpoint_uri"]}
    data = _task_file(tmp_path)
    evaluation = {
        "kind": "lm_eval",
        "name": "harness",
        "tasks": [_task(dataset="ds_pick"), _rolling_task(dataset="ds_pick")],
        "batch_size": 2,
    }
    task_datasets = {"ds_pick": {"id": "ds_pick", "uri": str(data)}}
    results, events = evaluate_in_process(
        spec, checkpoint, [evaluation], tmp_path, task_datasets=task_datasets
    )
    ours = results["harness"]
    assert ours["pick/samples"] == len(QUESTIONS)

    local = {
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
    }
    direct = lm_eval.simple_evaluate(
        model="hf",
        model_args={
            "pretrained": done["lora_merged_uri"],
            "tokenizer": str(model_dir),
            "device": "cpu",
            "dtype": "float32",
            "max_length": 64,
        },
        tasks=[_task(**local), _rolling_task(**local)],
        batch_size=2,
        bootstrap_iters=0,
        log_samples=False,
        task_manager=TaskManager(include_defaults=False),
    )
    assert direct is not None
    expected = direct["results"]
    assert ours["pick/acc"] == expected["pick"]["acc,none"]
    assert ours["pick/acc_norm"] == expected["pick"]["acc_norm,none"]
    # merged weights against adapters on their base: the same function, rounded differently
    assert ours["roll/word_perplexity"] == pytest.approx(
        expected["roll"]["word_perplexity,none"], rel=1e-4
    )
    assert ours["roll/bits_per_byte"] == pytest.approx(
        expected["roll"]["bits_per_byte,none"], rel=1e-4
    )
    reported = [e for e in events if e["type"] == "evaluation"]
    assert [(e["name"], e["kind"], e["step"]) for e in reported] == [
        ("harness", "lm_eval", done["steps"])
    ]
    metrics = [e for e in events if e["type"] == "metric"][-1]["values"]
    assert metrics["harness.pick/acc"] == ours["pick/acc"]


def test_torchyard_lm_scores_the_built_in_gpts_own_token_probabilities(
    corpus_dir: Path,
) -> None:
    from lm_eval.api.instance import Instance

    from trainer.lm_eval_model import TorchyardLM
    from trainer.models.network import build_network

    spec = tiny_spec(corpus_dir, model={"n_layers": 1, "d_model": 32, "n_heads": 2, "seq_len": 64})
    network = build_network(spec, device=torch.device("cpu"))
    network.model.eval()
    harness = TorchyardLM(
        network.model, None, device=torch.device("cpu"), batch_size=2, vocab_size=256
    )
    context, continuation = "def f(x):", " return x"
    (score, greedy), _ = harness.loglikelihood(
        [
            Instance("loglikelihood", {}, (context, continuation), 0),
            Instance("loglikelihood", {}, ("a", "b"), 1),
        ]
    )
    ids = list((context + continuation).encode())
    with torch.no_grad():
        logits = network.model(torch.tensor([ids[:-1]]))[0]
    log_probs = F.log_softmax(logits.float(), dim=-1)
    span = range(len(context) - 1, len(ids) - 1)
    expected = sum(float(log_probs[t, ids[t + 1]]) for t in span)
    assert score == pytest.approx(expected, rel=1e-5)
    assert greedy == all(int(log_probs[t].argmax()) == ids[t + 1] for t in span)

    # a whole document (shorter than seq_len: one window), every byte predicted from all
    # that precedes it, the first from "\n" (the adapter's empty context for bytes)
    text = "import sys\nprint(sys.argv)\n"
    (rolling,) = harness.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    tokens = [10, *text.encode()]
    with torch.no_grad():
        out = F.log_softmax(network.model(torch.tensor([tokens[:-1]]))[0].float(), dim=-1)
    total = sum(float(out[t, tokens[t + 1]]) for t in range(len(tokens) - 1))
    assert rolling == pytest.approx(total, rel=1e-5)
