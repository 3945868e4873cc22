"""An 8B-class Llama fine-tuned on one GPU (issue 50): LoRA and QLoRA SFT at a long context.

    python -m bench.llama8b [--device cuda] [--seq-len 4096] [--steps 12] [--warmup 4]
                            [--methods lora,qlora] [--shape llama3_8b]

A Llama of Llama-3-8B's shape (32 layers, hidden 4096, MLP 14336, 32 query heads over 8
key/value heads, vocabulary 128,256: 8.03B parameters) is built from its config with random
weights (no download), in bf16 on `--device`, and saved with `save_pretrained` (safetensors,
~16 GB, under $TMPDIR) so that the trainer loads it as a team's model directory is loaded
(`model.hf.path_or_id`; QLoRA quantizes it to NF4 while loading, through `BitsAndBytesConfig`).
Each method then trains rank-32 adapters on every linear layer but the head (peft's
`all-linear`, as the QLoRA paper), `--batch` sequences of `--seq-len` byte tokens a step of
the standard library's source, bf16 autocast, activation checkpointing, through the real
trainer (`bench/trainer_methods.py`'s runner). Per method: tokens/s (median step after
`--warmup`), peak memory (`torch.cuda.max_memory_allocated`), trainable parameters, the loss.

For comparison: Unsloth publishes, for Llama-3.1-8B QLoRA of rank 32 on all linear layers at
batch 1, the longest context that fits a GPU's memory, theirs and Hugging Face + FlashAttention
2's (24 GB: 78,475 vs 5,789 tokens; 40 GB: 153,977 vs 12,264; docs.unsloth.ai, "Unsloth
Benchmarks"), and a speed relative to HF + FA2 (2x) rather than tokens/s: the peak memory at
4,096 tokens is the figure to set beside theirs.

Prints one JSON document. Smoke: a 2-layer Llama of hidden 64 on the CPU, the whole path.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench import smoke  # noqa: E402
from bench.trainer_methods import build_corpus, run_spec  # noqa: E402
from jobspec.job import JobSpec  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "llama3_8b": {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                  "rope_theta": 500000.0},
    "tiny": {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256},
}  # fmt: skip
LORA = {"r": 32, "alpha": 64.0}  # Unsloth's published runs use rank 32


def build_model_dir(args: argparse.Namespace, out: Path) -> int:
    """Save a randomly initialised Llama of `args.shape` to `out` in bf16; its parameter count.
    Built on `args.device` directly (an 8B model's random init on a CPU takes minutes)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**SHAPES[args.shape], max_position_embeddings=args.seq_len,
                         bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    count = sum(p.numel() for p in model.parameters())
    del model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return count


def method_spec(args: argparse.Namespace, corpus: Path, model_dir: Path, method: str) -> JobSpec:
    """The fine-tuning job of `method` (`lora` or `qlora`) on the saved model."""
    finetune: dict[str, Any] = {"lora": LORA}
    if method == "qlora":
        finetune["qlora"] = {"compute_dtype": "bf16"}
    steps = args.steps
    return JobSpec.model_validate(
        {
            "name": f"bench-llama-{method}",
            "seed": 0,
            "data": {"uri": str(corpus)},
            "model": {"kind": "hf", "seq_len": args.seq_len,
                      "hf": {"path_or_id": str(model_dir), "tokenizer": "bytes"}},
            "parallelism": {"strategy": "single"},
            "resources": {"procs_per_node": 1, "device": args.device},
            "optim": {"lr": 1e-4, "warmup_steps": 1, "schedule": "constant"},
            "train": {"micro_batch_size": args.batch, "max_steps": steps,
                      "log_interval_steps": 1, "precision": "bf16",
                      "activation_checkpointing": True},
            "eval": {"interval_steps": steps, "num_batches": 1},
            "checkpoint": {"interval_steps": steps, "keep_last": 1},
            "sample": {"max_new_tokens": 0},
            **finetune,
        }
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3_8b")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1, help="sequences a step")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4, help="steps left out of the timing")
    parser.add_argument("--methods", default="lora,qlora", help="comma-separated")
    parser.add_argument("--threads", type=int, default=4, help="OMP threads")
    args = smoke.parse(
        parser, device="cpu", shape="tiny", seq_len=64, batch=2, steps=3, warmup=1, threads=1,
    )  # fmt: skip
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = build_corpus(Path(tmp), 4_000_000)
        model_dir = Path(tmp) / "model"
        print(f"[bench] building {args.shape} ...", file=sys.stderr, flush=True)
        params = build_model_dir(args, model_dir)
        print(f"[bench] built {params} parameters", file=sys.stderr, flush=True)
        for method in args.methods.split(","):
            print(f"[bench] {method} ...", file=sys.stderr, flush=True)
            spec = method_spec(args, corpus, model_dir, method)
            run = run_spec(args, spec, 1, Path(tmp) / method)
            run.pop("profile", None)
            runs[method] = run
            # each method's figures as soon as it ends: a run cut short keeps the ones before
            print(f"[bench] {method}: {json.dumps(run)}", file=sys.stderr, flush=True)
    config = {k: v for k, v in vars(args).items() if k != "smoke"}
    print(json.dumps({"bench": "llama8b", "config": config, "params": params, "runs": runs},
                     indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
