"""A fine-tune from a LoRA run's checkpoint (`model.init_from`, `trainer.models.init_from`): the
checkpoint holds only adapters, so the source's base is rebuilt and its adapters merged; the
new run's own adapters go on top, and disabled they give the source's trained model.

Source: a Hugging Face Llama built from a config, LoRA (+ `lm_head` in full through
`modules_to_save`), trained a few steps by `python -m trainer`.

Tolerances: logits of the merged weights against the unmerged adapters differ by fp32
rounding of W + (alpha / r) B A against W x + (alpha / r) B A x: 1e-5 relative (as
test_trainer_finetune.py's exports); a model that holds the very same merged tensors gives
the same bits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dataformat.errors import InvalidJobError
from jobspec.job import JobSpec
from tests.support.training import (
    cpu_world_of_one,
    explain,
    read_events,
    run_trainer,
    statuses,
    tiny_llama_dir,
    tiny_spec,
)
from trainer.checkpoint.checkpointer import checkpoint_spec, load_model_only
from trainer.models.init_from import load_starting_weights
from trainer.models.network import build_network, merged_source, trainable_names

REL_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The saved Llama the LoRA source adapts (LoRA needs weights from files or a checkpoint)."""
    return tiny_llama_dir(tmp_path_factory.mktemp("llama"))


def _spec(corpus_dir: Path, llama: Path, **sections: dict[str, Any] | None) -> JobSpec:
    """The LoRA Llama of `llama`'s files, 4 steps; `sections` update its parts (None removes
    one)."""
    raw: dict[str, dict[str, Any] | None] = {
        "model": {"kind": "hf", "hf": {"path_or_id": str(llama)}},
        "lora": {"r": 4, "alpha": 8.0},
        "optim": {"lr": 1e-2},
        "train": {"max_steps": 4, "micro_batch_size": 8},
        "eval": {"interval_steps": 4, "num_batches": 2},
        "checkpoint": {"interval_steps": 4, "keep_last": 1},
        "sample": {"max_new_tokens": 4},
    }
    for name, values in sections.items():
        raw[name] = None if values is None else {**(raw.get(name) or {}), **values}
    return tiny_spec(corpus_dir, **{k: v for k, v in raw.items() if v is not None})


@pytest.fixture(scope="module")
def lora_source(
    corpus_dir: Path, llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, float]:
    """A finished LoRA run of the Llama: (its final checkpoint's URI, its final eval loss)."""
    workdir = tmp_path_factory.mktemp("lora_source")
    spec = _spec(corpus_dir, llama, lora={"modules_to_save": ["lm_head"]})
    proc = run_trainer(spec, workdir, nproc=None)
    assert proc.returncode == 0, explain(proc)
    done = statuses(read_events(workdir / "run"))[-1]["data"]
    return done["checkpoint_uri"], done["final_eval_loss"]


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))


def _logits(model: torch.nn.Module) -> torch.Tensor:
    """Logits (2, 32, 256) of a `transformers` causal LM on `_ids()`, as `HFCausalLM` asks."""
    return model(input_ids=_ids(), use_cache=False).logits


def test_a_lora_fine_tune_of_a_lora_checkpoint_starts_at_the_sources_trained_model(
    corpus_dir: Path, llama: Path, lora_source: tuple[str, float], tmp_path: Path
) -> None:
    uri, source_eval_loss = lora_source
    spec = _spec(corpus_dir, llama, model={"init_from": {"job": 1}})
    proc = run_trainer(spec, tmp_path, nproc=None, args=("--init-from", uri))
    assert proc.returncode == 0, explain(proc)
    events = read_events(tmp_path / "run")
    (start,) = [e for e in events if e["type"] == "metric" and e["step"] == 0]
    # B = 0 at the start: the new run computes the merged source, whose eval loss it was.
    assert start["values"]["eval_loss"] == pytest.approx(source_eval_loss, rel=REL_TOLERANCE)
    assert statuses(events)[-1]["data"]["final_eval_loss"] < source_eval_loss


def test_with_its_adapters_disabled_the_new_model_is_the_sources_merged_model(
    corpus_dir: Path, llama: Path, lora_source: tuple[str, float]
) -> None:
    uri, _ = lora_source
    world = cpu_world_of_one()
    source = checkpoint_spec(uri)
    trained = build_network(source, device=world.device, dist_info=world)  # unmerged adapters
    load_model_only(trained.model, uri, dist_info=world, names=trainable_names(trained.model))
    merged = merged_source(source, uri, world)
    spec = _spec(corpus_dir, llama, model={"init_from": {"job": 1}})
    network = build_network(spec, device=world.device, init_from=uri, dist_info=world)
    assert network.peft_model is not None
    with torch.no_grad():
        for name, param in network.peft_model.named_parameters():
            if "lora_B" in name:  # adapters that would change the output if they were on
                param.normal_()
        want = _logits(merged)
        with network.peft_model.disable_adapter():
            got = network.model(_ids())
        unmerged = trained.model(_ids())
    assert torch.equal(got, want)
    torch.testing.assert_close(want, unmerged, rtol=REL_TOLERANCE, atol=REL_TOLERANCE)


def test_a_full_fine_tune_of_a_lora_checkpoint_starts_from_the_merged_weights(
    corpus_dir: Path, llama: Path, lora_source: tuple[str, float]
) -> None:
    uri, _ = lora_source
    world = cpu_world_of_one()
    merged = merged_source(checkpoint_spec(uri), uri, world)
    full = _spec(corpus_dir, llama, model={"init_from": {"job": 1}}, lora=None)
    network = build_network(full, device=world.device, init_from=uri, dist_info=world)
    assert network.peft_model is None
    with torch.no_grad():
        assert torch.equal(network.model(_ids()), _logits(merged))


def test_adapters_of_a_chained_lora_run_are_refused(
    corpus_dir: Path, llama: Path, tmp_path: Path
) -> None:
    chained = _spec(corpus_dir, llama, model={"init_from": {"job": 7, "checkpoint": 9}})
    (tmp_path / "spec.json").write_text(json.dumps(chained.model_dump(mode="json")))
    with pytest.raises(InvalidJobError, match="chains of LoRA fine-tunes"):
        load_starting_weights(
            torch.nn.Identity(),
            chained,
            str(tmp_path),
            dist_info=cpu_world_of_one(),
            merge_source=merged_source,
        )
