"""LoRA / QLoRA and Hugging Face models, in process (world of one, tiny models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from dataformat.errors import InvalidJobError
from jobspec.job import JobSpec, QLoRASpec
from tests.support.training import FINE_TUNE, TINY_LLAMA, build_local_run, tiny_spec
from trainer.loop import train_step
from trainer.models.gpt import GPTConfig, build_model
from trainer.models.network import (
    AdapterOptimizerState,
    _is_4bit_linear,
    build_network,
    quantize_linears,
)
from trainer.parallel.parallelize import block_slots

CPU = torch.device("cpu")


def _hf_spec(data: Path, config: dict[str, Any], **sections: dict[str, Any]) -> JobSpec:
    model = {"kind": "hf", "hf": {"from_config": config}}
    if "lora" in sections or "qlora" in sections:
        model |= FINE_TUNE
    return tiny_spec(data, model=model, **sections)


def test_lora_trains_only_adapter_parameters_and_counts_them(
    corpus_dir: Path, tmp_path: Path
) -> None:
    run = build_local_run(tiny_spec(corpus_dir, model=FINE_TUNE, lora={"r": 4}), tmp_path)
    params = dict(run.model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * 6 * 2  # A and B on 6 linear layers in each of 2 blocks
    assert run.network is not None
    assert run.network.trainable_params == sum(params[n].numel() for n in trainable)
    assert run.network.num_params == sum(p.numel() for p in params.values())
    optimized = {id(p) for group in run.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(params[n]) for n in trainable}
    before = {n: p.detach().clone() for n, p in params.items()}
    train_step(run)
    changed = {n for n, p in params.items() if not torch.equal(p, before[n])}
    assert changed == trainable  # every adapter moved (B starts at 0), no base weight did


def test_lora_checkpoint_state_holds_only_the_adapters(corpus_dir: Path, tmp_path: Path) -> None:
    run = build_local_run(
        tiny_spec(corpus_dir, model=FINE_TUNE, lora={"r": 4, "target_modules": ["wq"]}), tmp_path
    )
    state = AdapterOptimizerState(run.model, run.optimizer).state_dict()
    assert sorted(state["model"]) == [
        f"blocks.{i}.attn.wq.lora_{ab}.default.weight" for i in (0, 1) for ab in "AB"
    ]


def test_adapters_are_drawn_from_the_job_seed_whatever_the_global_rng(
    corpus_dir: Path,
) -> None:
    spec = tiny_spec(corpus_dir, model=FINE_TUNE, lora={"r": 4})
    torch.manual_seed(1)
    a = build_network(spec, device=CPU).model.state_dict()
    torch.manual_seed(2)  # another rank seeds its dropout differently
    b = build_network(spec, device=CPU).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_qlora_quantizes_the_block_linears_to_nf4() -> None:
    import bitsandbytes as bnb

    cfg = GPTConfig(n_layers=2, n_heads=4, d_model=64, d_ff=256, seq_len=32)
    model = build_model(cfg, device=CPU, seed=0)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(x)
    qlora = QLoRASpec(compute_dtype="fp32")
    assert quantize_linears(model.blocks, qlora, device=CPU) == 12
    layer = model.blocks["0"].attn.wq
    assert isinstance(layer, bnb.nn.Linear4bit)
    assert layer.weight.dtype == torch.uint8 and layer.weight.numel() == 64 * 64 // 2
    assert layer.weight.quant_state.quant_type == "nf4"
    with torch.no_grad():
        error = (model(x) - reference).abs().max().item()
    assert 0 < error < 0.5  # 4-bit weights: close to, not equal to, the fp32 model


def test_qlora_layers_take_and_give_the_autocast_dtype(corpus_dir: Path) -> None:
    """Under bf16 autocast each 4-bit layer (and peft's LoRA layer around it) sees a bf16
    input and returns bf16, as autocast's `nn.Linear` does; bitsandbytes alone would hand
    back the fp32 a LayerNorm gives it (checked first: the test can fail)."""
    spec = tiny_spec(
        corpus_dir, model=FINE_TUNE, qlora={"compute_dtype": "bf16"}, train={"precision": "bf16"}
    )
    model = build_network(spec, device=CPU).model
    layers = {n: m for n, m in model.named_modules() if _is_4bit_linear(m)}
    assert len(layers) == 2 * 12  # 6 linears per block: peft's layer and bnb's inside it
    seen: dict[str, tuple[torch.dtype, torch.dtype]] = {}
    for name, layer in layers.items():
        layer.register_forward_hook(
            lambda m, args, out, name=name: seen.__setitem__(name, (args[0].dtype, out.dtype))
        )
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
        bare = model.blocks["0"].attn.wq.base_layer
        assert bare.forward(torch.randn(2, 16, 64)).dtype == torch.float32
    assert seen.keys() == layers.keys()
    assert set(seen.values()) == {(torch.bfloat16, torch.bfloat16)}


def test_a_qlora_model_still_trains_after_an_evaluation(corpus_dir: Path) -> None:
    """An evaluation before training (step 0 of a fine-tune, `eval.at_start`) left the 4-bit
    layers in bitsandbytes' CPU inference layout, and the next training forward failed."""
    spec = tiny_spec(corpus_dir, model=FINE_TUNE, qlora={"compute_dtype": "fp32"})
    model = build_network(spec, device=CPU).model
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        before = model(x)
    model.train()
    model(x).float().mean().backward()  # raised RuntimeError (an in-place add on a view)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None for p in trained)
    with torch.no_grad():
        model.eval()
        assert torch.equal(model(x), before)  # the same weights, read the same way


def test_hf_model_from_config_is_built_from_the_seed(corpus_dir: Path) -> None:
    spec = _hf_spec(corpus_dir, TINY_LLAMA)
    a, b = (build_network(spec, device=CPU) for _ in range(2))
    assert a.trainable_params == a.num_params > 0 and a.tokenizer is None
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        logits = a.model(x)
        assert logits.shape == (2, 16, 256)
        assert torch.equal(logits, b.model(x))
    assert [type(getattr(c, k)).__name__ for c, k in block_slots(a.model)] == [
        "LlamaDecoderLayer"
    ] * 2


def test_hf_lora_target_the_model_lacks_is_an_invalid_job(corpus_dir: Path) -> None:
    spec = _hf_spec(corpus_dir, TINY_LLAMA, lora={"target_modules": ["c_attn"]})
    with pytest.raises(InvalidJobError, match="q_proj"):
        build_network(spec, device=CPU)


def test_hf_vocabulary_smaller_than_bytes_is_an_invalid_job(corpus_dir: Path) -> None:
    with pytest.raises(InvalidJobError, match="vocab_size"):
        build_network(_hf_spec(corpus_dir, {**TINY_LLAMA, "vocab_size": 100}), device=CPU)


def test_seq_len_beyond_the_hf_models_positions_is_an_invalid_job(corpus_dir: Path) -> None:
    config = {**TINY_LLAMA, "max_position_embeddings": 32}
    with pytest.raises(InvalidJobError, match="positions"):
        build_network(_hf_spec(corpus_dir, config), device=CPU)


def test_qlora_on_gpt2_without_linear_layers_is_an_invalid_job(corpus_dir: Path) -> None:
    gpt2 = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 256}
    with pytest.raises(InvalidJobError, match="Conv1D"):
        build_network(_hf_spec(corpus_dir, gpt2, qlora={}), device=CPU)


def test_block_slots_of_the_builtin_gpt_are_its_blocks() -> None:
    cfg = GPTConfig(n_layers=3, n_heads=4, d_model=64, d_ff=256, seq_len=32)
    model = build_model(cfg, device=CPU, seed=0)
    slots = block_slots(model)
    assert [getattr(c, k) for c, k in slots] == list(model.blocks.values())
    assert all(isinstance(c, nn.ModuleDict) for c, _ in slots)
