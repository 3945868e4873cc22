"""`transformers.Trainer` on Torchyard: fine-tune a Hugging Face causal LM on a text corpus, both
read from the job's declared inputs. Run it:

    torchyard submit --code examples/hf_trainer examples/hf_trainer/spec.yaml --follow
    torchrun --nproc-per-node 2 train.py --model DIR --corpus PATH --max-steps 100   # anywhere

On Torchyard the spec's `entrypoint.inputs` place the model (a registered base model) at
`/inputs/model` and the corpus (a dataset of the project) at `/inputs/corpus`, read-only;
`ty.inputs()` finds them there; off the platform `--model` / `--corpus` name them. Without
either, a tiny byte-level Llama is built from a config and the standard library's sources are
the corpus, so the script runs anywhere with nothing downloaded.

`TorchyardCallback` reports the Trainer's logs, declares its `checkpoint-N` directories complete
and turns a pause or cancel (SIGTERM) into "save, then stop"; `ty.latest_checkpoint()` is where
a resumed job continues from.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
)

import torchyard.train as ty
from torchyard.integrations.transformers import TorchyardCallback


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a Hugging Face model directory (default: input `model`)")
    parser.add_argument(
        "--corpus", help="a text file or a directory of them (default: input `corpus`)"
    )
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--save-steps", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-bytes", type=int, default=1_000_000, help="of the corpus read")
    return parser.parse_args()


def read_corpus(path: Path | None, max_bytes: int) -> str:
    """The text of `path` (a file, or every UTF-8 file under a directory in path order), or the
    standard library's sources when None; at most `max_bytes` of it."""
    if path is None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(stdlib.glob("*.py"))[:100]
    else:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    parts, size = [], 0
    for file in files:
        try:
            text = file.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue  # a binary file in a directory of text
        parts.append(text)
        size += len(text)
        if size >= max_bytes:
            break
    return "".join(parts)[:max_bytes]


class TokenChunks(torch.utils.data.Dataset):
    """Consecutive `seq_len`-token pieces of one token sequence."""

    def __init__(self, tokens: list[int], seq_len: int) -> None:
        self.tokens = torch.tensor(tokens, dtype=torch.long)
        self.seq_len = seq_len

    def __len__(self) -> int:
        return len(self.tokens) // self.seq_len

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.tokens[i * self.seq_len : (i + 1) * self.seq_len]
        return {"input_ids": ids, "labels": ids}  # the model shifts the labels itself


def model_and_tokens(model_dir: Path | None, text: str, seq_len: int) -> tuple[Any, list[int]]:
    """The model to fine-tune and `text` as its tokens: a Hugging Face directory's model and
    tokenizer, or a tiny byte-level Llama from a config (no download) reading bytes."""
    if model_dir is None:
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=seq_len,
        )
        return LlamaForCausalLM(config), list(text.encode())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return model, tokenizer(text, return_attention_mask=False)["input_ids"]


def main() -> None:
    args = parse_args()
    found = ty.inputs()
    model_dir = found.get("model") or (Path(args.model) if args.model else None)
    corpus = found.get("corpus") or (Path(args.corpus) if args.corpus else None)
    torch.manual_seed(0)
    model, tokens = model_and_tokens(model_dir, read_corpus(corpus, args.max_bytes), args.seq_len)
    training_args = TrainingArguments(
        output_dir=str(ty.checkpoint_root()),  # where Torchyard looks for checkpoints
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_steps,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=TokenChunks(tokens, args.seq_len),
        callbacks=[TorchyardCallback()],
    )
    latest = ty.latest_checkpoint()  # the newest complete checkpoint-N, or None
    trainer.train(resume_from_checkpoint=str(latest) if latest else None)
    if dist.is_initialized():  # gloo may abort at exit while it still holds tensors
        del trainer
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
