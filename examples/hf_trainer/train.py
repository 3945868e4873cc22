"""`transformers.Trainer` on Torchyard: a tiny Llama built from a config (no download) learns
next bytes of the standard library's Python sources. Run it:

    torchrun --nproc-per-node 2 train.py --max-steps 100           # anywhere
    torchyard submit --code examples/hf_trainer examples/hf_trainer/spec.yaml --follow

`TorchyardCallback` reports the Trainer's logs, declares its `checkpoint-N` directories complete
and turns a pause or cancel (SIGTERM) into "save, then stop"; `ty.latest_checkpoint()` is where
a resumed job continues from.
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import torchyard.train as ty
from torchyard.integrations.transformers import TorchyardCallback


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--save-steps", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--lr", type=float, default=1e-3)
    return parser.parse_args()


class ByteChunks(torch.utils.data.Dataset):
    """Consecutive `seq_len`-byte pieces of the standard library's sources (first 1 MB)."""

    def __init__(self, seq_len: int, max_bytes: int = 1_000_000) -> None:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        text = b"".join(p.read_bytes() for p in sorted(stdlib.glob("*.py"))[:100])[:max_bytes]
        self.tokens = torch.tensor(list(text), dtype=torch.long)
        self.seq_len = seq_len

    def __len__(self) -> int:
        return len(self.tokens) // self.seq_len

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.tokens[i * self.seq_len : (i + 1) * self.seq_len]
        return {"input_ids": ids, "labels": ids}  # the model shifts the labels itself


def main() -> None:
    args = parse_args()
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=args.seq_len,
    )
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
        model=LlamaForCausalLM(config),
        args=training_args,
        train_dataset=ByteChunks(args.seq_len),
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
