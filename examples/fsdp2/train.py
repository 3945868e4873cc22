"""FSDP2 (`fully_shard`) with `torch.distributed.checkpoint` on Torchyard: every rank holds a
shard of the parameters and optimizer state and writes its own part of each checkpoint.

A tiny next-byte model learns from the standard library's Python sources (no download). Run it:

    torchrun --nproc-per-node 2 train.py --max-steps 200      # anywhere, CPU (gloo) or CUDA
    torchyard submit --code examples/fsdp2 examples/fsdp2/spec.yaml --follow
"""

from __future__ import annotations

import argparse
import gc
import os
import sysconfig
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import torchyard.train as ty


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per rank")
    parser.add_argument("--context", type=int, default=32, help="bytes the model sees")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps")
    return parser.parse_args()


def load_text(max_bytes: int = 2_000_000) -> torch.Tensor:
    """Bytes of the standard library's Python sources (sorted files, first `max_bytes`)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = b"".join(p.read_bytes() for p in sorted(stdlib.glob("*.py"))[:200])[:max_bytes]
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


class Block(nn.Module):
    """A residual MLP block: x + W2 gelu(W1 norm(x))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class ByteModel(nn.Module):
    """Predicts the next byte from the `context` bytes before it:
    (batch, context) -> (batch, 256) logits."""

    def __init__(self, context: int, dim: int = 16, hidden: int = 128, num_blocks: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.proj = nn.Linear(context * dim, hidden)
        self.blocks = nn.ModuleList(Block(hidden) for _ in range(num_blocks))
        self.head = nn.Linear(hidden, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.embed(x).flatten(1))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def batch(text: torch.Tensor, step: int, args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    """This rank's batch of step `step`: the same on a resumed run as on an uninterrupted one."""
    generator = torch.Generator().manual_seed(step * 1009 + dist.get_rank())
    starts = torch.randint(0, len(text) - args.context - 1, (args.batch_size,), generator=generator)
    windows = torch.stack([text[s : s + args.context + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, -1]


def save(step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank writes its shards (DCP); then every rank declares the checkpoint complete."""
    model_state, optim_state = get_state_dict(model, optimizer)
    path = ty.checkpoint_dir(step)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=path)
    ty.completed_checkpoint(path)


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read a checkpoint `save` wrote into the sharded model and optimizer, in place."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # `python train.py` alone: one process
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda" if cuda else "cpu")
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))

    text = load_text()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = ByteModel(args.context).to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # after sharding

    step = 0
    latest = ty.latest_checkpoint()
    if latest is not None:  # resume: a retry, a resumed pause, a restart after a lost worker
        load(latest, model, optimizer)
        step = ty.checkpoint_step(latest) or 0
        ty.log_event(f"resumed from step {step}", checkpoint=str(latest))
    ty.set_max_steps(args.max_steps)

    while step < args.max_steps:
        step += 1
        inputs, targets = (t.to(device) for t in batch(text, step, args))
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # the global batch's loss, for the chart
        ty.report(step, loss=mean_loss.item() / dist.get_world_size(), lr=args.lr)
        stop = ty.should_stop()  # every rank, every step: they agree
        if stop or step % args.checkpoint_every == 0 or step == args.max_steps:
            save(step, model, optimizer)
        if stop:
            break

    # gloo may abort at exit while it still holds tensors: let go of them, then shut down.
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
